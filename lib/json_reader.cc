#include "json_reader.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "option_paths.hpp"
#include "tessera/lib/json.hpp"

namespace tessera {
namespace jsonio {
namespace {

using nlohmann::json;

char lower(char c) noexcept { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

// Levenshtein distance, ignoring case.
std::size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      const std::size_t substitute = diagonal + (lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitute});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string didYouMean(std::string_view word, std::span<const std::string_view> candidates) {
  const auto match = closestMatch(word, candidates);
  return match ? fmt::format(" (did you mean \"{}\"?)", *match) : std::string();
}

std::string formatBound(double bound) { return fmt::format("{}", bound); }

std::string boundsText(const FieldSpec& spec) {
  const bool hasLower = spec.min || spec.exclusiveMin;
  const bool hasUpper = spec.max || spec.exclusiveMax;
  const double lowerBound = spec.min ? *spec.min : spec.exclusiveMin.value_or(0);
  const double upperBound = spec.max ? *spec.max : spec.exclusiveMax.value_or(0);
  if (hasLower && hasUpper) {
    return fmt::format("in {}{}, {}{}", spec.min ? '[' : '(', formatBound(lowerBound),
                       formatBound(upperBound), spec.max ? ']' : ')');
  }
  if (hasLower) return fmt::format("{} {}", spec.min ? ">=" : ">", formatBound(lowerBound));
  return fmt::format("{} {}", spec.max ? "<=" : "<", formatBound(upperBound));
}

bool inRange(double value, const FieldSpec& spec) noexcept {
  return (!spec.min || value >= *spec.min) && (!spec.exclusiveMin || value > *spec.exclusiveMin) &&
         (!spec.max || value <= *spec.max) && (!spec.exclusiveMax || value < *spec.exclusiveMax);
}

std::string valueName(std::string_view name) {
  return name.empty() ? std::string("the value") : std::string(name);
}

// A string that holds what was expected, e.g. "4" where an integer is
// expected, earns a hint.
std::string quotedValueHint(std::string_view expected, const json& value) {
  constexpr std::size_t kMaxHinted = 32;
  if (!value.is_string() || value.get_ref<const std::string&>().size() > kMaxHinted) return {};
  const json inner = json::parse(value.get_ref<const std::string&>(), nullptr, false);
  const bool fits = (expected == "an integer" && inner.is_number_integer()) ||
                    (expected == "a number" && inner.is_number()) ||
                    (expected == "a boolean" && inner.is_boolean());
  return fits ? fmt::format("; write {} without quotes", inner.dump()) : std::string();
}

// Builds the document from nlohmann's SAX events, so that duplicate keys and
// the depth limit are caught while parsing, with the JSON pointer of the
// place.
class StrictDomBuilder {
 public:
  StrictDomBuilder(std::string_view text, std::string_view source) : text_(text), source_(source) {}

  bool null() { return place(json(nullptr)); }
  bool boolean(bool value) { return place(json(value)); }
  bool number_integer(json::number_integer_t value) { return place(json(value)); }
  bool number_unsigned(json::number_unsigned_t value) { return place(json(value)); }
  bool number_float(json::number_float_t value, const json::string_t&) { return place(json(value)); }
  bool string(json::string_t& value) { return place(json(std::move(value))); }
  bool binary(json::binary_t& value) { return place(json::binary(std::move(value))); }

  bool start_object(std::size_t) { return open(json::object()); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(json::string_t& key) {
    json& object = *frames_.back().container;
    if (object.contains(key)) {
      throw ConfigError(ErrorCode::DuplicateKey, childPath(frames_.back().path, key),
                        fmt::format("duplicate key \"{}\"{}", printable(key), origin()));
    }
    key_ = std::move(key);
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const json::exception& error) {
    // nlohmann's own position text precedes the reason: "... column 5: reason".
    std::string reason = error.what();
    const std::size_t column = reason.find("column ");
    const std::size_t colon = column == std::string::npos ? column : reason.find(": ", column);
    if (colon != std::string::npos) reason.erase(0, colon + 2);
    syntaxError(position, printable(reason));
  }

  // `position` counts the characters read, the offending one included.
  [[noreturn]] void syntaxError(std::size_t position, std::string_view message) const {
    std::size_t line = 1;
    std::size_t col = 0;
    for (std::size_t i = 0; i < position; ++i) {
      if (i < text_.size() && text_[i] == '\n') {
        ++line;
        col = 0;
      } else {
        ++col;
      }
    }
    const std::string where =
        source_.empty() ? fmt::format("{}:{}", line, col) : fmt::format("{}:{}:{}", source_, line, col);
    throw ConfigError(ErrorCode::JsonSyntax, where, message);
  }

  json take() { return std::move(root_); }

 private:
  struct Frame {
    json* container;
    std::string path;
  };

  std::string origin() const { return source_.empty() ? std::string() : fmt::format(" (in {})", source_); }

  // Stores `value` where the parser is and returns it with its path.
  std::pair<json*, std::string> store(json&& value) {
    if (++values_ > kMaxDocumentValues) {
      throw ConfigError(
          ErrorCode::DocumentLimit, std::string(source_),
          fmt::format("the document has more than {} values (objects, arrays, numbers, strings); "
                      "no run config needs that many",
                      kMaxDocumentValues));
    }
    if (frames_.empty()) {
      root_ = std::move(value);
      return {&root_, std::string()};
    }
    Frame& frame = frames_.back();
    if (frame.container->is_array()) {
      frame.container->push_back(std::move(value));
      return {&frame.container->back(), childPath(frame.path, frame.container->size() - 1)};
    }
    json& slot = (*frame.container)[key_];
    slot = std::move(value);
    return {&slot, childPath(frame.path, key_)};
  }

  bool place(json&& value) {
    store(std::move(value));
    return true;
  }

  bool open(json&& container) {
    auto [where, path] = store(std::move(container));
    if (frames_.size() + 1 > kMaxDepth) {
      throw ConfigError(ErrorCode::DocumentLimit, std::string(source_),
                        fmt::format("the document nests deeper than {} levels, at {}", kMaxDepth, path));
    }
    frames_.push_back({where, std::move(path)});
    return true;
  }

  bool close() {
    frames_.pop_back();
    return true;
  }

  std::string_view text_;
  std::string_view source_;
  json root_;
  std::vector<Frame> frames_;
  std::string key_;
  std::size_t values_ = 0;
};

}  // namespace

std::string childPath(std::string_view parent, std::string_view key) {
  std::string path;
  path.reserve(parent.size() + key.size() + 1);
  path += parent;
  path += '/';
  detail::appendPointerToken(path, key);
  return path;
}

std::string childPath(std::string_view parent, std::size_t index) {
  return fmt::format("{}/{}", parent, index);
}

std::optional<std::vector<std::string>> splitPointer(std::string_view pointer) {
  if (pointer.empty() || pointer.front() != '/') return std::nullopt;
  std::vector<std::string> tokens;
  for (std::size_t start = 1;;) {
    const std::size_t end = std::min(pointer.find('/', start), pointer.size());
    std::string token;
    for (std::size_t i = start; i < end; ++i) {
      if (pointer[i] != '~') {
        token += pointer[i];
        continue;
      }
      if (i + 1 >= end || (pointer[i + 1] != '0' && pointer[i + 1] != '1')) return std::nullopt;
      token += pointer[++i] == '0' ? '~' : '/';
    }
    tokens.push_back(std::move(token));
    if (end == pointer.size()) break;
    start = end + 1;
  }
  return tokens;
}

bool isPathWithin(std::string_view path, std::string_view ancestor) noexcept {
  return path.starts_with(ancestor) && (path.size() == ancestor.size() || path[ancestor.size()] == '/');
}

void SourceMap::addOverride(std::string path, std::string_view text) {
  overrides_.emplace_back(std::move(path), fmt::format("--set {}", text));
}

std::string_view SourceMap::sourceOf(std::string_view path) const noexcept {
  for (auto it = overrides_.rbegin(); it != overrides_.rend(); ++it) {
    if (isPathWithin(path, it->first)) return it->second;
  }
  return source_;
}

std::string SourceMap::origin(std::string_view path) const {
  const std::string_view source = sourceOf(path);
  return source.empty() ? std::string() : fmt::format(" (in {})", source);
}

std::string printable(std::string_view text) {
  if (text.size() > kMaxQuotedBytes) {
    return fmt::format("{}... ({} bytes)", printable(text.substr(0, kMaxQuotedBytes)), text.size());
  }
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", byte);
    }
  }
  return out;
}

std::optional<std::size_t> invalidUtf8Offset(std::string_view text) noexcept {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  for (std::size_t i = 0; i < text.size();) {
    const unsigned char lead = byte(i);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    // The length of the sequence and the range of its second byte, which
    // excludes overlong forms, surrogates and code points above U+10FFFF.
    std::size_t length = 0;
    unsigned char low = 0x80;
    unsigned char high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else {
      return i;
    }
    if (i + 1 >= text.size() || byte(i + 1) < low || byte(i + 1) > high) return i;
    for (std::size_t k = 2; k < length; ++k) {
      if (i + k >= text.size() || (byte(i + k) & 0xC0) != 0x80) return i;
    }
    i += length;
  }
  return std::nullopt;
}

std::string describeValue(const json& value) {
  constexpr std::size_t kMaxShown = 60;
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > kMaxShown) text = text.substr(0, kMaxShown - 3) + "...";
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean " + text;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer " + text;
    case json::value_t::number_float: return "number " + text;
    case json::value_t::string: return "string " + printable(text);
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a binary value";
  }
}

std::string quotedList(std::span<const std::string_view> names) {
  std::string out;
  for (const std::string_view name : names) {
    if (!out.empty()) out += ", ";
    out += fmt::format("\"{}\"", name);
  }
  return out;
}

std::optional<std::string_view> closestMatch(std::string_view word,
                                             std::span<const std::string_view> candidates) {
  // The same word but for case, '-' and '_' ("fashion-mnist" for
  // "FashionMnist", "sgd" for "SGD"): an older spelling of an enum value.
  const auto folded = [](std::string_view text) {
    std::string out;
    for (const char c : text)
      if (c != '-' && c != '_') out += lower(c);
    return out;
  };
  constexpr std::size_t kMaxFolded = 64;
  if (word.size() <= kMaxFolded) {
    const std::string key = folded(word);
    for (const std::string_view candidate : candidates)
      if (!key.empty() && candidate.size() <= kMaxFolded && folded(candidate) == key) return candidate;
  }
  // A typo changes a few characters; anything further is a different word.
  const std::size_t allowed = std::max<std::size_t>(2, word.size() / 3);
  std::optional<std::string_view> best;
  std::size_t bestDistance = std::numeric_limits<std::size_t>::max();
  for (const std::string_view candidate : candidates) {
    // The distance is at least the difference in length: a candidate that
    // cannot be close enough costs no quadratic comparison (a key may be
    // megabytes long).
    const std::size_t gap = word.size() > candidate.size() ? word.size() - candidate.size()
                                                           : candidate.size() - word.size();
    if (gap > allowed) continue;
    const std::size_t distance = editDistance(word, candidate);
    if (distance < bestDistance) {
      bestDistance = distance;
      best = candidate;
    }
  }
  if (!best || bestDistance > allowed || bestDistance >= word.size()) return std::nullopt;
  return best;
}

void throwWrongType(std::string_view expected, const json& value, const std::string& path,
                    const SourceMap& sources) {
  throw ConfigError(ErrorCode::WrongType, path,
                    fmt::format("expected {}, got {}{}{}", expected, describeValue(value),
                                quotedValueHint(expected, value), sources.origin(path)));
}

bool readBool(const json& value, const std::string& path, const SourceMap& sources) {
  if (!value.is_boolean()) throwWrongType("a boolean", value, path, sources);
  return value.get<bool>();
}

int64_t readInt(const json& value, const std::string& path, const SourceMap& sources) {
  constexpr auto kMax = std::numeric_limits<int64_t>::max();
  constexpr auto kMin = std::numeric_limits<int64_t>::min();
  const auto tooLarge = [&] {
    throw ConfigError(ErrorCode::OutOfRange, path,
                      fmt::format("{} does not fit in a 64-bit integer; allowed: {} to {}{}",
                                  describeValue(value), kMin, kMax, sources.origin(path)));
  };
  if (value.is_number_unsigned()) {
    const auto unsignedValue = value.get<uint64_t>();
    if (unsignedValue > static_cast<uint64_t>(kMax)) tooLarge();
    return static_cast<int64_t>(unsignedValue);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double d = value.get<double>();
    // Integer literals beyond 64 bits reach us as floats, and one just below
    // -2^63 rounds to -2^63 itself; 2^63 is exact.
    constexpr double kTwoTo63 = 9223372036854775808.0;
    const bool integral = std::isfinite(d) && std::trunc(d) == d;
    if (integral && (d >= kTwoTo63 || d <= -kTwoTo63)) tooLarge();
    // A number with a zero fraction (2.0, 1e3) is an integer, as JSON
    // Schema's "integer" (tessera schema) has it.
    if (integral) return static_cast<int64_t>(d);
  }
  throwWrongType("an integer", value, path, sources);
}

double readDouble(const json& value, const std::string& path, const SourceMap& sources) {
  if (!value.is_number()) throwWrongType("a number", value, path, sources);
  return value.get<double>();
}

std::string readString(const json& value, const std::string& path, const SourceMap& sources) {
  if (!value.is_string()) throwWrongType("a string", value, path, sources);
  return value.get<std::string>();
}

std::size_t readEnumIndex(const json& value, std::span<const std::string_view> names, const std::string& path,
                          const SourceMap& sources) {
  if (!value.is_string()) throwWrongType(fmt::format("one of {}", quotedList(names)), value, path, sources);
  const auto& text = value.get_ref<const std::string&>();
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == text) return i;
  throw ConfigError(ErrorCode::InvalidEnumValue, path,
                    fmt::format("invalid value \"{}\"; expected one of {}{}{}", printable(text),
                                quotedList(names), didYouMean(text, names), sources.origin(path)));
}

void requireObject(const json& value, const std::string& path, const SourceMap& sources) {
  if (!value.is_object()) throwWrongType("an object", value, path, sources);
}

void requireArray(const json& value, const std::string& path, const SourceMap& sources) {
  if (!value.is_array()) throwWrongType("an array", value, path, sources);
}

void checkRange(int64_t value, const FieldSpec& spec, const std::string& path, std::string_view name,
                std::string_view origin) {
  if (inRange(static_cast<double>(value), spec)) return;
  throw ConfigError(
      spec.rangeCode, path,
      fmt::format("{} is {}; it must be {}{}", valueName(name), value, boundsText(spec), origin));
}

void checkRange(double value, const FieldSpec& spec, const std::string& path, std::string_view name,
                std::string_view origin) {
  if (inRange(value, spec)) return;
  throw ConfigError(
      spec.rangeCode, path,
      fmt::format("{} is {}; it must be {}{}", valueName(name), value, boundsText(spec), origin));
}

void checkItems(std::size_t count, const FieldSpec& spec, const std::string& path, std::string_view name,
                std::string_view origin) {
  if (!spec.minItems || count >= *spec.minItems) return;
  throw ConfigError(spec.rangeCode, path,
                    fmt::format("{} has {} {}; it needs at least {}{}", valueName(name), count,
                                count == 1 ? "entry" : "entries", *spec.minItems, origin));
}

void throwUnnamedEnum(int value, std::string_view typeName, const std::string& path) {
  throw ConfigError(ErrorCode::InvalidEnumValue, path,
                    fmt::format("{} value {} names no enumerator (an invalid cast?)", typeName, value));
}

JsonReader::JsonReader(const json& object, std::string path, const SourceMap& sources)
    : object_(&object), path_(std::move(path)), sources_(&sources) {
  requireObject(object, path_, sources);
}

void JsonReader::explainKey(std::string key, std::string reason) {
  explained_.emplace_back(std::move(key), std::move(reason));
}

void JsonReader::finish() const {
  for (const auto& [key, value] : object_->items()) {
    if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
    std::vector<std::string_view> allowed = known_;
    std::sort(allowed.begin(), allowed.end());
    std::string list;
    for (const std::string_view name : allowed)
      list += list.empty() ? std::string(name) : ", " + std::string(name);
    std::string why = didYouMean(key, known_);
    for (const auto& [explainedKey, reason] : explained_) {
      if (explainedKey == key) why = ": " + reason;
    }
    const std::string path = childPath(path_, key);
    throw ConfigError(
        ErrorCode::UnknownKey, path,
        fmt::format("unknown key \"{}\"{}{}; allowed keys: {}{}", printable(key),
                    keyContext_.empty() ? "" : " " + keyContext_, why, list, sources_->origin(path)));
  }
}

SchemaBuilder::SchemaBuilder(json& schema) : schema_(&schema) {
  schema["type"] = "object";
  schema["properties"] = json::object();
  schema["additionalProperties"] = false;
}

void SchemaBuilder::addBounds(json& schema, const FieldSpec& spec, bool integer) {
  const auto put = [&](const char* keyword, const std::optional<double>& bound) {
    if (!bound) return;
    if (integer) {
      schema[keyword] = static_cast<int64_t>(*bound);
    } else {
      schema[keyword] = *bound;
    }
  };
  put("minimum", spec.min);
  put("exclusiveMinimum", spec.exclusiveMin);
  put("maximum", spec.max);
  put("exclusiveMaximum", spec.exclusiveMax);
}

}  // namespace jsonio

nlohmann::json parseJsonDocument(std::string_view text, std::string_view source) {
  if (text.size() > jsonio::kMaxDocumentBytes) {
    throw ConfigError(ErrorCode::DocumentLimit, std::string(source),
                      fmt::format("the document is {} bytes; the limit is {} bytes (64 MiB)", text.size(),
                                  jsonio::kMaxDocumentBytes));
  }
  jsonio::StrictDomBuilder builder(text, source);
  nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &builder);
  // nlohmann's lexer takes a NUL byte for the end of the input, so the parse
  // stops there without error and whatever follows would go unread. A NUL
  // inside a string is an error of its own, so one found now ended the parse.
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
    builder.syntaxError(nul + 1, "a NUL byte (0x00) is not JSON text; the document must end here or the "
                                 "file is damaged");
  }
  return builder.take();
}

}  // namespace tessera
