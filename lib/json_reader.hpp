// JSON field tables and the visitors that use them.
//
// Every struct of a run config has ONE function listing its fields:
//
//   template <class V>
//   void visitFields(V& v, CommGroup& group) {
//     v.field("type", group.type, {.doc = "..."});
//     v.field("replicaGroupSize", group.replicaGroupSize, {.min = 0, .doc = "..."});
//   }
//
// and every JSON concern is a visitor over that list, so a field added to
// the table is read, written, described and checked everywhere:
//   JsonReader    strict reading; errors name the JSON pointer of the value;
//   JsonWriter    the canonical dump (every field, keys sorted);
//   SchemaBuilder the JSON Schema (types, ranges, enums, defaults, docs);
//   LeafLister    the JSON pointers of the dump's leaves (for provenance);
//   RuleChecker   the ranges and rules of a C++ value (for validate()).
//
// Keys are the C++ field names. A field is a bool, int64_t, double,
// std::string, NamedEnum, std::vector<int64_t>, std::map<std::string, S> or a
// struct S that has a visitFields. A table may end with v.rule(fn) for a
// check that involves several fields; the reader and the checker both run
// it, so reading a document and validating a C++ value report the same
// error.
//
// The tables of lib's types are defined in json.cc, the others next to their
// types; each is explicitly instantiated for every visitor with
// TESSERA_INSTANTIATE_VISIT_FIELDS.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/lib/enum_names.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/session_options.hpp"
#include "tessera/lib/tensor_location.hpp"

namespace tessera {

// Field tables of lib's types (json.cc).
template <class V>
void visitFields(V& v, CommGroup& value);
template <class V>
void visitFields(V& v, TensorLocation& value);
template <class V>
void visitFields(V& v, TensorLocationSettings& value);
template <class V>
void visitFields(V& v, AutomaticLossScalingSettings& value);
template <class V>
void visitFields(V& v, ExecutionPhaseSettings& value);
template <class V>
void visitFields(V& v, SessionOptions& value);

}  // namespace tessera

namespace tessera::jsonio {

// Limits of parseJsonDocument().
inline constexpr std::size_t kMaxDepth = 64;
inline constexpr std::size_t kMaxDocumentBytes = std::size_t{64} << 20;
// Values (objects, arrays, scalars) in one document: a run config has a few
// hundred; the bound keeps a document's parsed form far below a gigabyte,
// whatever the text holds (a value takes ~100 bytes parsed, one byte of text).
inline constexpr std::size_t kMaxDocumentValues = 200'000;

// What a field table says about one field besides its name. Bounds are
// inclusive (min, max) or exclusive; for an array they apply to every
// element. `rangeCode` is the error a bound violation raises, so that a field
// whose range validate(SessionOptions) also checks reports the same code.
struct FieldSpec {
  std::optional<double> min{};
  std::optional<double> exclusiveMin{};
  std::optional<double> max{};
  std::optional<double> exclusiveMax{};
  std::optional<std::size_t> minItems{};
  ErrorCode rangeCode = ErrorCode::OutOfRange;
  std::string_view doc{};
};

// --- JSON pointers -----------------------------------------------------------

// parent + "/" + the escaped key ("~" -> "~0", "/" -> "~1").
std::string childPath(std::string_view parent, std::string_view key);
std::string childPath(std::string_view parent, std::size_t index);
// The unescaped tokens of a JSON pointer; nullopt for a malformed one (no
// leading "/", or "~" not followed by 0 or 1).
std::optional<std::vector<std::string>> splitPointer(std::string_view pointer);
// True when `path` is `ancestor` or lies below it.
bool isPathWithin(std::string_view path, std::string_view ancestor) noexcept;

// Where the values of a document came from, for messages: the document's
// source (a file name) and the --set overrides that replaced parts of it.
class SourceMap {
 public:
  SourceMap() = default;
  explicit SourceMap(std::string source) : source_(std::move(source)) {}

  // `text` is the whole override, "/data/epochs=3"; later ones win.
  void addOverride(std::string path, std::string_view text);
  // "--set /data/epochs=3" when an override wrote the value at `path` (or
  // an object above it), else the document's source.
  std::string_view sourceOf(std::string_view path) const noexcept;
  // " (in NAME)" for the value at `path`; "" when there is no name.
  std::string origin(std::string_view path) const;

 private:
  std::string source_;
  std::vector<std::pair<std::string, std::string>> overrides_;
};

// Where a rule of a field table runs: the JSON path of the object and, when
// a document is read, where its values came from.
class RuleSite {
 public:
  RuleSite(std::string_view path, const SourceMap* sources) : path_(path), sources_(sources) {}
  std::string path(std::string_view key) const { return childPath(path_, key); }
  // " (in NAME)" for the value at `path`; "" for a C++ value.
  std::string origin(std::string_view path) const {
    return sources_ ? sources_->origin(path) : std::string();
  }

 private:
  std::string_view path_;
  const SourceMap* sources_;
};

// --- Scalars -------------------------------------------------------------------

// Bytes outside printable ASCII as \xNN, so that a message about invalid
// UTF-8 is itself valid text; a text over kMaxQuotedBytes as its first
// kMaxQuotedBytes bytes, "..." and its length (see boundedText).
std::string printable(std::string_view text);
// The offset of the first byte of `text` that is not part of well-formed
// UTF-8 (RFC 3629: no overlong forms, surrogates or code points above
// U+10FFFF, as the JSON parser requires); nullopt when there is none.
std::optional<std::size_t> invalidUtf8Offset(std::string_view text) noexcept;

// "string \"4\"", "number 1.5", "an object", ... for "got ..." messages.
std::string describeValue(const nlohmann::json& value);
// "\"a\", \"b\", \"c\""
std::string quotedList(std::span<const std::string_view> names);
// The candidate that equals `word` but for case, '-' and '_' (an older
// spelling of an enum value: "fashion-mnist" for "FashionMnist"), else the
// one closest by case-insensitive edit distance, when it is close enough to
// be a likely typo.
std::optional<std::string_view> closestMatch(std::string_view word,
                                             std::span<const std::string_view> candidates);

[[noreturn]] void throwWrongType(std::string_view expected, const nlohmann::json& value,
                                 const std::string& path, const SourceMap& sources);
bool readBool(const nlohmann::json& value, const std::string& path, const SourceMap& sources);
// Rejects floats (1.5, 1e3) as WrongType and integers beyond int64 as
// OutOfRange.
int64_t readInt(const nlohmann::json& value, const std::string& path, const SourceMap& sources);
double readDouble(const nlohmann::json& value, const std::string& path, const SourceMap& sources);
std::string readString(const nlohmann::json& value, const std::string& path, const SourceMap& sources);
// The index of the value among `names` (exact match); InvalidEnumValue with
// the allowed names and a suggestion otherwise.
std::size_t readEnumIndex(const nlohmann::json& value, std::span<const std::string_view> names,
                          const std::string& path, const SourceMap& sources);
void requireObject(const nlohmann::json& value, const std::string& path, const SourceMap& sources);
void requireArray(const nlohmann::json& value, const std::string& path, const SourceMap& sources);

// Bound checks shared by the reader and the checker; `name` is what the
// message calls the value ("learningRate", "layers[1]").
void checkRange(int64_t value, const FieldSpec& spec, const std::string& path, std::string_view name,
                std::string_view origin);
void checkRange(double value, const FieldSpec& spec, const std::string& path, std::string_view name,
                std::string_view origin);
void checkItems(std::size_t count, const FieldSpec& spec, const std::string& path, std::string_view name,
                std::string_view origin);
// InvalidEnumValue for a C++ enum value that has no name (a bad cast).
[[noreturn]] void throwUnnamedEnum(int value, std::string_view typeName, const std::string& path);

// --- Type traits ---------------------------------------------------------------

template <NamedEnum E>
inline constexpr auto kEnumNameList = [] {
  std::array<std::string_view, EnumNames<E>::kNames.size()> names{};
  for (std::size_t i = 0; i < names.size(); ++i) names[i] = EnumNames<E>::kNames[i].second;
  return names;
}();

template <NamedEnum E>
constexpr bool isNamed(E value) noexcept {
  for (const auto& [v, name] : EnumNames<E>::kNames)
    if (v == value) return true;
  return false;
}

template <class T>
inline constexpr bool kIsInt64Vector = std::is_same_v<T, std::vector<int64_t>>;

template <class T>
struct IsStringMap : std::false_type {};
template <class T>
struct IsStringMap<std::map<std::string, T>> : std::true_type {};

template <class T>
inline constexpr bool kIsScalar = std::is_same_v<T, bool> || std::is_same_v<T, int64_t> ||
                                  std::is_same_v<T, double> || std::is_same_v<T, std::string>;

// Every visitor: fields named with skip() are left out (e.g. a field that a
// surrounding object decides).
class FieldVisitor {
 public:
  void skip(std::string_view key) { skipped_.push_back(key); }

 protected:
  bool skipped(std::string_view key) const noexcept {
    for (const std::string_view s : skipped_)
      if (s == key) return true;
    return false;
  }

 private:
  std::vector<std::string_view> skipped_;
};

// visitFields takes a mutable reference because the reader fills the struct;
// the writer, the schema builder, the lister and the checker only read
// through it.
template <class T>
T& forVisit(const T& value) noexcept {
  return const_cast<T&>(value);
}

// --- Reader ----------------------------------------------------------------------

class JsonReader : public FieldVisitor {
 public:
  // Throws WrongType unless `object` is a JSON object.
  JsonReader(const nlohmann::json& object, std::string path, const SourceMap& sources);

  template <class T>
  void field(std::string_view key, T& value, const FieldSpec& spec = {}) {
    if (skipped(key)) return;
    known_.push_back(key);
    const auto it = object_->find(key);
    if (it == object_->end()) return;
    read(*it, childPath(path_, key), key, value, spec);
  }

  template <class Fn>
  void rule(Fn&& fn) const {
    fn(RuleSite(path_, sources_));
  }

  // A key that is not a field here but deserves a specific explanation
  // (e.g. an option of another optimizer type).
  void explainKey(std::string key, std::string reason);
  // Added to unknown-key messages, e.g. "for optimizer type \"Adam\"".
  void setKeyContext(std::string context) { keyContext_ = std::move(context); }
  // Throws UnknownKey for the first key that no field() call named.
  void finish() const;

  const std::string& path() const noexcept { return path_; }
  const SourceMap& sources() const noexcept { return *sources_; }

  // Reads `json` (at `path`) into `value`, which must hold its default.
  template <class T>
  static void read(const nlohmann::json& json, const std::string& path, std::string_view name, T& value,
                   const FieldSpec& spec, const SourceMap& sources);

 private:
  template <class T>
  void read(const nlohmann::json& json, const std::string& path, std::string_view name, T& value,
            const FieldSpec& spec) const {
    read(json, path, name, value, spec, *sources_);
  }

  const nlohmann::json* object_;
  std::string path_;
  const SourceMap* sources_;
  std::vector<std::string_view> known_;
  std::vector<std::pair<std::string, std::string>> explained_;
  std::string keyContext_;
};

template <class T>
void JsonReader::read(const nlohmann::json& json, const std::string& path, std::string_view name, T& value,
                      const FieldSpec& spec, const SourceMap& sources) {
  if constexpr (std::is_same_v<T, bool>) {
    value = readBool(json, path, sources);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    value = readInt(json, path, sources);
    checkRange(value, spec, path, name, sources.origin(path));
  } else if constexpr (std::is_same_v<T, double>) {
    value = readDouble(json, path, sources);
    checkRange(value, spec, path, name, sources.origin(path));
  } else if constexpr (std::is_same_v<T, std::string>) {
    value = readString(json, path, sources);
  } else if constexpr (NamedEnum<T>) {
    value = EnumNames<T>::kNames[readEnumIndex(json, kEnumNameList<T>, path, sources)].first;
  } else if constexpr (kIsInt64Vector<T>) {
    requireArray(json, path, sources);
    checkItems(json.size(), spec, path, name, sources.origin(path));
    value.clear();
    value.reserve(json.size());
    for (std::size_t i = 0; i < json.size(); ++i) {
      const std::string elementPath = childPath(path, i);
      const int64_t element = readInt(json[i], elementPath, sources);
      checkRange(element, spec, elementPath, std::string(name) + "[" + std::to_string(i) + "]",
                 sources.origin(elementPath));
      value.push_back(element);
    }
  } else if constexpr (IsStringMap<T>::value) {
    requireObject(json, path, sources);
    value.clear();
    for (const auto& [key, entry] : json.items()) {
      typename T::mapped_type mapped{};
      read(entry, childPath(path, key), key, mapped, {}, sources);
      value.emplace(key, std::move(mapped));
    }
  } else {
    JsonReader reader(json, path, sources);
    visitFields(reader, value);
    reader.finish();
  }
}

// --- Writer ----------------------------------------------------------------------

class JsonWriter : public FieldVisitor {
 public:
  // Makes `object` an empty object and fills it.
  explicit JsonWriter(nlohmann::json& object) : object_(&object) { object = nlohmann::json::object(); }

  template <class T>
  void field(std::string_view key, T& value, const FieldSpec& = {}) {
    if (skipped(key)) return;
    (*object_)[std::string(key)] = toJson(value);
  }

  template <class Fn>
  void rule(Fn&&) const {}

  template <class T>
  static nlohmann::json toJson(const T& value) {
    if constexpr (kIsScalar<T> || kIsInt64Vector<T>) {
      return nlohmann::json(value);
    } else if constexpr (NamedEnum<T>) {
      return nlohmann::json(std::string(toString(value)));
    } else if constexpr (IsStringMap<T>::value) {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& [key, entry] : value) object[key] = toJson(entry);
      return object;
    } else {
      nlohmann::json object;
      JsonWriter writer(object);
      visitFields(writer, forVisit(value));
      return object;
    }
  }

 private:
  nlohmann::json* object_;
};

// --- Schema ----------------------------------------------------------------------

class SchemaBuilder : public FieldVisitor {
 public:
  // Makes `schema` the schema of a closed object with no properties yet.
  explicit SchemaBuilder(nlohmann::json& schema);

  // `defaults` is the field of a default-constructed struct.
  template <class T>
  void field(std::string_view key, T& defaults, const FieldSpec& spec = {}) {
    if (skipped(key)) return;
    (*schema_)["properties"][std::string(key)] = schemaOf(defaults, spec);
  }

  template <class Fn>
  void rule(Fn&&) const {}

  nlohmann::json& schema() noexcept { return *schema_; }

  template <class T>
  static nlohmann::json schemaOf(const T& defaults, const FieldSpec& spec);

 private:
  // "minimum", "exclusiveMinimum", ... of `spec`, as integers for integer
  // fields.
  static void addBounds(nlohmann::json& schema, const FieldSpec& spec, bool integer);

  nlohmann::json* schema_;
};

template <class T>
nlohmann::json SchemaBuilder::schemaOf(const T& defaults, const FieldSpec& spec) {
  nlohmann::json schema = nlohmann::json::object();
  if constexpr (std::is_same_v<T, bool>) {
    schema["type"] = "boolean";
  } else if constexpr (std::is_same_v<T, int64_t>) {
    schema["type"] = "integer";
    addBounds(schema, spec, true);
  } else if constexpr (std::is_same_v<T, double>) {
    schema["type"] = "number";
    addBounds(schema, spec, false);
  } else if constexpr (std::is_same_v<T, std::string>) {
    schema["type"] = "string";
  } else if constexpr (NamedEnum<T>) {
    schema["type"] = "string";
    schema["enum"] = kEnumNameList<T>;
  } else if constexpr (kIsInt64Vector<T>) {
    schema["type"] = "array";
    nlohmann::json items = {{"type", "integer"}};
    addBounds(items, spec, true);
    schema["items"] = std::move(items);
    if (spec.minItems) schema["minItems"] = *spec.minItems;
  } else if constexpr (IsStringMap<T>::value) {
    schema["type"] = "object";
    schema["additionalProperties"] = schemaOf(typename T::mapped_type{}, {});
  } else {
    SchemaBuilder builder(schema);
    visitFields(builder, forVisit(defaults));
  }
  if constexpr (kIsScalar<T> || NamedEnum<T> || kIsInt64Vector<T> || IsStringMap<T>::value) {
    schema["default"] = JsonWriter::toJson(defaults);
  }
  if (!spec.doc.empty()) schema["description"] = spec.doc;
  return schema;
}

// --- Leaf paths ------------------------------------------------------------------

// A leaf is a scalar, an enum, an array, or an empty map; a non-empty map
// and a struct contribute the leaves of their members.
class LeafLister : public FieldVisitor {
 public:
  LeafLister(std::string path, std::vector<std::string>& leaves) : path_(std::move(path)), leaves_(&leaves) {}

  template <class T>
  void field(std::string_view key, T& value, const FieldSpec& = {}) {
    if (skipped(key)) return;
    list(childPath(path_, key), value, *leaves_);
  }

  template <class Fn>
  void rule(Fn&&) const {}

  template <class T>
  static void list(const std::string& path, const T& value, std::vector<std::string>& leaves) {
    if constexpr (kIsScalar<T> || NamedEnum<T> || kIsInt64Vector<T>) {
      leaves.push_back(path);
    } else if constexpr (IsStringMap<T>::value) {
      if (value.empty()) leaves.push_back(path);
      for (const auto& [key, entry] : value) list(childPath(path, key), entry, leaves);
    } else {
      LeafLister lister(path, leaves);
      visitFields(lister, forVisit(value));
    }
  }

 private:
  std::string path_;
  std::vector<std::string>* leaves_;
};

// --- Checker ---------------------------------------------------------------------

class RuleChecker : public FieldVisitor {
 public:
  explicit RuleChecker(std::string path) : path_(std::move(path)) {}

  template <class T>
  void field(std::string_view key, T& value, const FieldSpec& spec = {}) {
    if (skipped(key)) return;
    check(childPath(path_, key), key, value, spec);
  }

  template <class Fn>
  void rule(Fn&& fn) const {
    fn(RuleSite(path_, nullptr));
  }

  template <class T>
  static void check(const std::string& path, std::string_view name, const T& value, const FieldSpec& spec) {
    if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>) {
      checkRange(value, spec, path, name, {});
    } else if constexpr (NamedEnum<T>) {
      if (!isNamed(value)) throwUnnamedEnum(static_cast<int>(value), EnumNames<T>::kTypeName, path);
    } else if constexpr (kIsInt64Vector<T>) {
      checkItems(value.size(), spec, path, name, {});
      for (std::size_t i = 0; i < value.size(); ++i) {
        checkRange(value[i], spec, childPath(path, i), std::string(name) + "[" + std::to_string(i) + "]", {});
      }
    } else if constexpr (IsStringMap<T>::value) {
      for (const auto& [key, entry] : value) check(childPath(path, key), key, entry, {});
    } else if constexpr (!kIsScalar<T>) {
      RuleChecker checker(path);
      visitFields(checker, forVisit(value));
    }
  }

 private:
  std::string path_;
};

// --- Entry points ----------------------------------------------------------------

// Reads a T strictly from `json`, the value at `path` of a document.
template <class T>
T readValue(const nlohmann::json& json, const std::string& path, const SourceMap& sources) {
  T value{};
  JsonReader::read(json, path, {}, value, {}, sources);
  return value;
}

template <class T>
nlohmann::json writeValue(const T& value) {
  return JsonWriter::toJson(value);
}

// The schema of T with the defaults of T{}.
template <class T>
nlohmann::json schemaOf(std::string_view doc = {}) {
  return SchemaBuilder::schemaOf(T{}, FieldSpec{.doc = doc});
}

template <class T>
std::vector<std::string> leafPaths(const T& value, const std::string& path) {
  std::vector<std::string> leaves;
  LeafLister::list(path, value, leaves);
  return leaves;
}

// The ranges and rules of the field tables, applied to a C++ value.
template <class T>
void checkRules(const T& value, const std::string& path) {
  RuleChecker::check(path, {}, value, {});
}

// The JSON of a named enum, and its strict reading.
template <NamedEnum E>
nlohmann::json enumToJson(E value) {
  return JsonWriter::toJson(value);
}
template <NamedEnum E>
E enumFromJson(const nlohmann::json& json) {
  return readValue<E>(json, {}, SourceMap{});
}

}  // namespace tessera::jsonio

// Instantiates a visitFields template for every visitor; used once, in the
// file that defines the table.
#define TESSERA_INSTANTIATE_VISIT_FIELDS(Type)                         \
  template void visitFields(::tessera::jsonio::JsonReader&, Type&);    \
  template void visitFields(::tessera::jsonio::JsonWriter&, Type&);    \
  template void visitFields(::tessera::jsonio::SchemaBuilder&, Type&); \
  template void visitFields(::tessera::jsonio::LeafLister&, Type&);    \
  template void visitFields(::tessera::jsonio::RuleChecker&, Type&)
