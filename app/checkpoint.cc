// Checkpoints (see include/tessera/app/checkpoint.hpp): tessera's metadata over
// the safetensors container of lib/safetensors, the session's variables, and
// reading and writing files.
#include "tessera/app/checkpoint.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "atomic_file.hpp"
#include "half.hpp"
#include "input_file.hpp"
#include "safetensors.hpp"
#include "tessera/optimizers/adam.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/optimizers/sgd.hpp"

namespace tessera {
namespace {

using nlohmann::json;

constexpr std::string_view kFormat = "tessera.checkpoint";
// The optimizer's hyper-parameter scalars (see optimizer.hpp) are derived
// from the step and the learning rate, so they are not saved.
constexpr std::string_view kHyperParameterPrefix = "optimizer.";
// The float32 master weight of a float16 weight W is the optimizer state
// "W.master".
constexpr std::string_view kMasterSuffix = ".master";

// Metadata keys of tessera's own.
constexpr std::string_view kFormatKey = "format";
constexpr std::string_view kFormatVersionKey = "formatVersion";
constexpr std::string_view kVersionKey = "tesseraVersion";
constexpr std::string_view kStepKey = "step";
constexpr std::string_view kOptimizerStepKey = "optimizerStep";
constexpr std::string_view kOptimizerKey = "optimizer";
constexpr std::string_view kOptionsKey = "sessionOptions";
constexpr std::string_view kOptionsHashKey = "sessionOptionsHash";
constexpr std::string_view kTensorsKey = "tensors";
constexpr std::array kReservedKeys = {kFormatKey,  kFormatVersionKey, kVersionKey,
                                      kStepKey,    kOptimizerStepKey, kOptimizerKey,
                                      kOptionsKey, kOptionsHashKey,   kTensorsKey};

// Warnings list at most this many differing values.
constexpr std::size_t kListedDifferences = 8;

bool isReserved(std::string_view key) {
  return std::find(kReservedKeys.begin(), kReservedKeys.end(), key) != kReservedKeys.end();
}

// The safetensors name of a dtype.
std::string_view dtypeName(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "F32";
    case DType::Float16: return "F16";
    case DType::Int32: return "I32";
    case DType::Float64: return "F64";  // no variable is float64 (ops::variable refuses it)
  }
  return "F32";
}

// --- What a session saves -----------------------------------------------------------

struct SessionVariable {
  std::string name;
  DType dtype = DType::Float32;
  TensorCategory category = TensorCategory::Weight;
};

std::vector<SessionVariable> savedVariables(const Graph& graph) {
  std::vector<SessionVariable> variables;
  for (const OpNode& op : graph.ops()) {
    if (op.kind != OpKind::Variable) continue;
    const TensorNode& node = graph.tensor(op.outputs.front());
    const bool state = node.category == TensorCategory::OptimizerState;
    if (node.category != TensorCategory::Weight && !state) continue;
    if (state && node.name.starts_with(kHyperParameterPrefix)) continue;
    variables.push_back({node.name, node.dtype, node.category});
  }
  return variables;
}

OptimizerConfig optimizerConfig(const Optimizer& optimizer) {
  OptimizerConfig config;
  if (const auto* sgd = dynamic_cast<const Sgd*>(&optimizer)) {
    config.type = OptimizerType::Sgd;
    config.sgd = sgd->options();
    return config;
  }
  if (const auto* adam = dynamic_cast<const Adam*>(&optimizer)) {
    config.adam = adam->options();
    config.type = config.adam.decoupledWeightDecay ? OptimizerType::AdamW : OptimizerType::Adam;
    return config;
  }
  throw ConfigError(
      ErrorCode::InvalidOptimizer, "/optimizer",
      fmt::format("optimizer \"{}\" cannot be saved in a checkpoint; checkpoints know the optimizers "
                  "SGD, Adam and AdamW",
                  optimizer.name()));
}

// --- Comparing JSON for warnings --------------------------------------------------------

void flatten(const json& value, const std::string& path, std::vector<std::pair<std::string, json>>& out) {
  if (value.is_object() && !value.empty()) {
    for (const auto& [key, child] : value.items()) flatten(child, path + "/" + jsonPointerToken(key), out);
    return;
  }
  out.emplace_back(path, value);
}

// "PATH A -> B" for every leaf that differs (missing leaves print as "-").
std::vector<std::string> differences(const json& before, const json& after, const std::string& prefix) {
  std::vector<std::pair<std::string, json>> a;
  std::vector<std::pair<std::string, json>> b;
  flatten(before, prefix, a);
  flatten(after, prefix, b);
  std::map<std::string, std::pair<std::string, std::string>> changed;
  const auto text = [](const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); };
  for (const auto& [path, value] : a) changed[path].first = text(value);
  for (const auto& [path, value] : b) changed[path].second = text(value);
  std::vector<std::string> lines;
  for (const auto& [path, values] : changed) {
    if (values.first == values.second) continue;
    lines.push_back(fmt::format("{} {} -> {}", path, values.first.empty() ? "-" : values.first,
                                values.second.empty() ? "-" : values.second));
  }
  return lines;
}

std::string listed(const std::vector<std::string>& lines) {
  std::string text;
  for (std::size_t i = 0; i < lines.size() && i < kListedDifferences; ++i) text += (i ? ", " : "") + lines[i];
  if (lines.size() > kListedDifferences)
    text += fmt::format(" and {} more", lines.size() - kListedDifferences);
  return text;
}

// --- Reading -----------------------------------------------------------------------

class Decoder {
 public:
  explicit Decoder(std::string_view source) : source_(source) {}

  Checkpoint decode(std::span<const uint8_t> bytes) { return decode(safetensors::parse(bytes, source_)); }

  // A file's length field and header alone (the data section has
  // `dataBytes` bytes): the tensors come without their values.
  Checkpoint decodeHeader(std::span<const uint8_t> header, uint64_t dataBytes) {
    withData_ = false;
    return decode(safetensors::parseHeader(header, dataBytes, source_));
  }

  Checkpoint decode(const safetensors::FileView& file) {
    if (!file.metadata) {
      unsupported(
          "not a tessera checkpoint: the header has no \"__metadata__\" (a safetensors file of "
          "another program?)");
    }
    metadata_ = &*file.metadata;
    const auto format = metadata_->find(std::string(kFormatKey));
    if (format == metadata_->end() || format->second != kFormat) {
      unsupported("not a tessera checkpoint: metadata \"format\" is {}; expected \"{}\"",
                  format == metadata_->end() ? "missing" : fmt::format("\"{}\"", format->second), kFormat);
    }
    Checkpoint checkpoint;
    const int64_t version = integer(kFormatVersionKey);
    if (version < 1) corrupt("metadata \"formatVersion\" is {}; it must be >= 1", version);
    if (version > kCheckpointFormatVersion) {
      unsupported("format version {} is newer than this tessera reads ({}); use a newer tessera", version,
                  kCheckpointFormatVersion);
    }
    checkpoint.formatVersion = static_cast<int>(version);
    checkpoint.tesseraVersion = string(kVersionKey);
    checkpoint.step = integer(kStepKey);
    checkpoint.optimizerStep = integer(kOptimizerStepKey);
    if (checkpoint.optimizerStep != checkpoint.step) {
      corrupt("metadata \"optimizerStep\" is {} but \"step\" is {}; they are the same count",
              checkpoint.optimizerStep, checkpoint.step);
    }
    checkpoint.optimizer = optimizer();
    checkpoint.sessionOptions = string(kOptionsKey);
    checkpoint.sessionOptionsHash = string(kOptionsHashKey);
    if (!parseMetadataJson(kOptionsKey).is_object())
      corrupt("metadata \"sessionOptions\" is not a JSON object");
    const std::string hash = fnv1a(checkpoint.sessionOptions);
    if (checkpoint.sessionOptionsHash != hash) {
      corrupt("metadata \"sessionOptionsHash\" is \"{}\" but \"sessionOptions\" hashes to \"{}\"",
              checkpoint.sessionOptionsHash, hash);
    }
    const json tensors = parseMetadataJson(kTensorsKey);
    if (!tensors.is_object()) corrupt("metadata \"tensors\" is not a JSON object");
    for (const safetensors::TensorView& view : file.tensors) {
      checkpoint.tensors.push_back(tensor(view, file.data, tensors));
    }
    for (const auto& item : tensors.items()) {
      const std::string& name = item.key();
      const bool held = std::any_of(file.tensors.begin(), file.tensors.end(),
                                    [&](const safetensors::TensorView& view) { return view.name == name; });
      if (!held) corrupt("metadata \"tensors\" describes tensor \"{}\", which the file does not hold", name);
    }
    for (const auto& [key, value] : *metadata_) {
      if (!isReserved(key)) checkpoint.extraMetadata.emplace(key, value);
    }
    return checkpoint;
  }

  static std::string fnv1a(std::string_view text) {
    uint64_t hash = 0xcbf29ce484222325ull;
    for (const char c : text) {
      hash ^= static_cast<uint8_t>(c);
      hash *= 0x100000001b3ull;
    }
    return fmt::format("fnv1a64:{:016x}", hash);
  }

 private:
  template <class... Args>
  [[noreturn]] void corrupt(fmt::format_string<Args...> format, Args&&... args) const {
    throw IoError(ErrorCode::CorruptCheckpoint, std::string(source_),
                  fmt::format(format, std::forward<Args>(args)...));
  }

  template <class... Args>
  [[noreturn]] void unsupported(fmt::format_string<Args...> format, Args&&... args) const {
    throw IoError(ErrorCode::UnsupportedCheckpoint, std::string(source_),
                  fmt::format(format, std::forward<Args>(args)...));
  }

  const std::string& string(std::string_view key) const {
    const auto it = metadata_->find(std::string(key));
    if (it == metadata_->end()) corrupt("metadata has no \"{}\"; every tessera checkpoint has it", key);
    return it->second;
  }

  int64_t integer(std::string_view key) const {
    const std::string& text = string(key);
    int64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc{} || end != text.data() + text.size() || text.empty() || value < 0) {
      corrupt("metadata \"{}\" is \"{}\"; expected a non-negative integer", key, text);
    }
    return value;
  }

  json parseMetadataJson(std::string_view key) const {
    try {
      return parseJsonDocument(string(key), key);
    } catch (const ConfigError& e) {
      corrupt("metadata \"{}\" is not valid JSON ({}: {})", key, e.subject(), e.detail());
    }
  }

  OptimizerConfig optimizer() const {
    json value = parseMetadataJson(kOptimizerKey);
    // Checkpoints written before enum values were PascalCase (docs/run-configs.md)
    // name the type "sgd", "adam" or "adamw": read as "SGD", "Adam", "AdamW".
    if (value.is_object() && value.contains("type") && value["type"].is_string()) {
      if (const auto type = enumFromFoldedString<OptimizerType>(value["type"].get<std::string>()))
        value["type"] = toString(*type);
    }
    try {
      return value.get<OptimizerConfig>();
    } catch (const ConfigError& e) {
      corrupt("metadata \"optimizer\" is not a valid optimizer ({}: {})",
              e.subject().empty() ? "/" : e.subject(), e.detail());
    }
  }

  CheckpointTensor tensor(const safetensors::TensorView& view, std::span<const uint8_t> data,
                          const json& described) const {
    CheckpointTensor tensor;
    tensor.name = view.name;
    if (view.dtype == "F32") {
      tensor.dtype = DType::Float32;
    } else if (view.dtype == "F16") {
      tensor.dtype = DType::Float16;
    } else if (view.dtype == "I32") {
      tensor.dtype = DType::Int32;
    } else {
      unsupported("tensor \"{}\" has dtype {}; tessera checkpoints hold F32, F16 and I32 only", view.name,
                  view.dtype);
    }
    const auto entry = described.find(view.name);
    if (entry == described.end()) corrupt("tensor \"{}\" has no entry in metadata \"tensors\"", view.name);
    if (!entry->is_object()) corrupt("metadata \"tensors\" entry of \"{}\" is not an object", view.name);
    for (const auto& [key, value] : entry->items()) {
      if (key != "category" && key != "shardLayoutVersion") {
        corrupt(
            "metadata \"tensors\" entry of \"{}\" has an unknown key \"{}\"; the keys are category and "
            "shardLayoutVersion",
            view.name, key);
      }
    }
    const auto category = entry->find("category");
    const std::optional<TensorCategory> parsed =
        category != entry->end() && category->is_string()
            ? enumFromString<TensorCategory>(category->get<std::string>())
            : std::nullopt;
    if (!parsed || (*parsed != TensorCategory::Weight && *parsed != TensorCategory::OptimizerState)) {
      corrupt("tensor \"{}\": metadata category is {}; expected \"Weight\" or \"OptimizerState\"", view.name,
              category == entry->end() ? "missing" : category->dump());
    }
    tensor.category = *parsed;
    const auto layout = entry->find("shardLayoutVersion");
    if (layout == entry->end() || !layout->is_number_unsigned() || layout->get<uint64_t>() < 1) {
      corrupt("tensor \"{}\": metadata shardLayoutVersion is {}; expected an integer >= 1", view.name,
              layout == entry->end() ? "missing" : layout->dump());
    }
    if (layout->get<uint64_t>() > static_cast<uint64_t>(ShardLayout::kVersion)) {
      unsupported(
          "tensor \"{}\" was written with shard layout version {}, newer than this tessera's ({}); use a "
          "newer tessera",
          view.name, layout->get<uint64_t>(), ShardLayout::kVersion);
    }
    tensor.shardLayoutVersion = static_cast<int>(layout->get<uint64_t>());
    for (const uint64_t dim : view.shape) tensor.value.shape.push_back(static_cast<int64_t>(dim));
    if (!withData_) return tensor;
    const auto bytes =
        data.subspan(static_cast<std::size_t>(view.begin), static_cast<std::size_t>(view.end - view.begin));
    if (tensor.dtype == DType::Float16) {
      // The container checked that the byte count is 2 x the shape's elements.
      std::vector<uint16_t> halves(bytes.size() / 2);
      for (std::size_t i = 0; i < halves.size(); ++i)
        halves[i] = static_cast<uint16_t>(bytes[2 * i] | bytes[2 * i + 1] << 8);
      tensor.value.data.resize(halves.size());
      halvesToFloats(halves.data(), tensor.value.data.data(), halves.size());
      return tensor;
    }
    tensor.value.data.resize(bytes.size() / 4);
    for (std::size_t i = 0; i < tensor.value.data.size(); ++i) {
      const uint32_t word =
          static_cast<uint32_t>(bytes[4 * i]) | static_cast<uint32_t>(bytes[4 * i + 1]) << 8 |
          static_cast<uint32_t>(bytes[4 * i + 2]) << 16 | static_cast<uint32_t>(bytes[4 * i + 3]) << 24;
      tensor.value.data[i] = tensor.dtype == DType::Int32 ? static_cast<float>(std::bit_cast<int32_t>(word))
                                                          : std::bit_cast<float>(word);
    }
    return tensor;
  }

  std::string_view source_;
  const std::map<std::string, std::string>* metadata_ = nullptr;
  bool withData_ = true;
};

// --- Files -------------------------------------------------------------------------

// The file's bytes, checked before anything is allocated: a regular file
// (InputFile), at most `maxBytes`, and as long as its header says the header
// is (the tensors' byte ranges are checked against the file by the parser).
// The header length a file's first 8 bytes give, checked against the file's
// size and the header limit; 0 for a file of fewer than 8 bytes (which the
// parser reports).
uint64_t headerLength(const detail::InputFile& file, const std::string& path) {
  if (file.size() < 8) return 0;
  std::array<char, 8> length{};
  file.readAt(0, length);
  uint64_t headerBytes = 0;
  for (std::size_t i = 0; i < length.size(); ++i) {
    headerBytes |= uint64_t{static_cast<unsigned char>(length[i])} << (8 * i);
  }
  if (headerBytes > safetensors::kMaxHeaderBytes || headerBytes > file.size() - 8) {
    throw IoError(ErrorCode::CorruptCheckpoint, path,
                  fmt::format("the header claims {} bytes but the file has {} bytes after the length field "
                              "and headers are at most {} bytes; the file is truncated or not a checkpoint",
                              headerBytes, file.size() - 8, safetensors::kMaxHeaderBytes));
  }
  return headerBytes;
}

std::vector<uint8_t> readBytes(const std::string& path, uint64_t maxBytes, std::string_view bound) {
  const detail::InputFile file(path);
  headerLength(file, path);
  return file.readAll<std::vector<uint8_t>>(maxBytes, [&](uint64_t size) {
    throw IoError(ErrorCode::UnsupportedCheckpoint, path,
                  fmt::format("the file has {} bytes, more than {} ({} bytes); nothing was read", size, bound,
                              maxBytes));
  });
}

// An upper bound of the size of a checkpoint of `session`: every variable as
// float32 at its largest host view (the per-replica shape times the
// replicas), twice (a float32 master of each float16 one), plus the largest
// header.
uint64_t checkpointBound(const TrainingSession& session) {
  const auto replicas =
      static_cast<uint64_t>(std::max<int64_t>(1, session.options().getGlobalReplicationFactor()));
  uint64_t bound = 8 + safetensors::kMaxHeaderBytes;
  for (const OpNode& op : session.graph().ops()) {
    if (op.kind != OpKind::Variable) continue;
    const auto elements =
        static_cast<uint64_t>(numElements(session.graph().tensor(op.outputs.front()).shape));
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(elements, 2 * 4 * replicas, &bytes) ||
        __builtin_add_overflow(bound, bytes, &bound)) {
      return std::numeric_limits<uint64_t>::max();
    }
  }
  return bound;
}

[[noreturn]] void mismatch(std::string_view source, std::string message) {
  throw IoError(ErrorCode::CheckpointMismatch, std::string(source), message);
}

}  // namespace

std::string sessionOptionsHash(const SessionOptions& options) { return Decoder::fnv1a(json(options).dump()); }

Checkpoint makeCheckpoint(const TrainingSession& session, std::map<std::string, std::string> extraMetadata) {
  for (const auto& [key, value] : extraMetadata) {
    if (isReserved(key)) {
      throw ConfigError(ErrorCode::DuplicateKey, key,
                        fmt::format("\"{}\" is a metadata key of tessera's own; choose another name", key));
    }
  }
  Checkpoint checkpoint;
  checkpoint.tesseraVersion = TESSERA_VERSION;
  checkpoint.step = session.step();
  checkpoint.optimizerStep = session.step();
  checkpoint.optimizer = optimizerConfig(session.optimizer());
  checkpoint.sessionOptions = json(session.options()).dump();
  checkpoint.sessionOptionsHash = sessionOptionsHash(session.options());
  for (SessionVariable& variable : savedVariables(session.graph())) {
    CheckpointTensor tensor;
    tensor.value = session.readVariable(variable.name, RetrievalMode::OnePerGroup);
    tensor.name = std::move(variable.name);
    tensor.dtype = variable.dtype;
    tensor.category = variable.category;
    checkpoint.tensors.push_back(std::move(tensor));
  }
  checkpoint.extraMetadata = std::move(extraMetadata);
  return checkpoint;
}

std::vector<uint8_t> encodeCheckpoint(const Checkpoint& checkpoint) {
  std::map<std::string, std::string> metadata = checkpoint.extraMetadata;
  json described = json::object();
  std::vector<std::vector<uint8_t>> data;
  std::vector<safetensors::TensorBytes> tensors;
  for (const CheckpointTensor& tensor : checkpoint.tensors) {
    described[tensor.name] = {{"category", toString(tensor.category)},
                              {"shardLayoutVersion", tensor.shardLayoutVersion}};
    std::vector<uint8_t>& bytes = data.emplace_back();
    if (tensor.dtype == DType::Float16) {
      // The value rounded to half (exact for what a float16 variable holds).
      std::vector<uint16_t> halves(tensor.value.data.size());
      floatsToHalves(tensor.value.data.data(), halves.data(), halves.size());
      bytes.reserve(2 * halves.size());
      for (const uint16_t half : halves) {
        bytes.push_back(static_cast<uint8_t>(half));
        bytes.push_back(static_cast<uint8_t>(half >> 8));
      }
    } else {
      bytes.reserve(4 * tensor.value.data.size());
      for (const float value : tensor.value.data) {
        const auto word = tensor.dtype == DType::Int32 ? std::bit_cast<uint32_t>(static_cast<int32_t>(value))
                                                       : std::bit_cast<uint32_t>(value);
        for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(word >> (8 * i)));
      }
    }
    std::vector<uint64_t> shape(tensor.value.shape.begin(), tensor.value.shape.end());
    tensors.push_back({tensor.name, std::string(dtypeName(tensor.dtype)), std::move(shape), bytes});
  }
  const auto put = [&metadata](std::string_view key, std::string value) {
    metadata.insert_or_assign(std::string(key), std::move(value));
  };
  put(kFormatKey, std::string(kFormat));
  put(kFormatVersionKey, std::to_string(checkpoint.formatVersion));
  put(kVersionKey, checkpoint.tesseraVersion);
  put(kStepKey, std::to_string(checkpoint.step));
  put(kOptimizerStepKey, std::to_string(checkpoint.optimizerStep));
  put(kOptimizerKey, json(checkpoint.optimizer).dump());
  put(kOptionsKey, checkpoint.sessionOptions);
  put(kOptionsHashKey, checkpoint.sessionOptionsHash);
  put(kTensorsKey, described.dump());
  return safetensors::encode(tensors, metadata);
}

Checkpoint decodeCheckpoint(std::span<const uint8_t> bytes, std::string_view source) {
  return Decoder(source).decode(bytes);
}

Checkpoint readCheckpoint(const std::string& path, uint64_t maxBytes) {
  return decodeCheckpoint(readBytes(path, maxBytes, "the limit of checkpoint files read without a session"),
                          path);
}

Checkpoint readCheckpointHeader(const std::string& path) {
  const detail::InputFile file(path);
  const uint64_t length = headerLength(file, path);
  // A file of fewer than 8 bytes: the parser names what is missing.
  std::vector<uint8_t> header(static_cast<std::size_t>(std::min<uint64_t>(file.size(), 8 + length)));
  file.readAt(0, std::span<char>(reinterpret_cast<char*>(header.data()), header.size()));
  if (header.size() < 8) return decodeCheckpoint(header, path);
  return Decoder(path).decodeHeader(header, file.size() - 8 - length);
}

Checkpoint readCheckpoint(const std::string& path, const TrainingSession& session) {
  return decodeCheckpoint(
      readBytes(path, checkpointBound(session), "a checkpoint of this session's variables can have"), path);
}

void writeCheckpoint(const Checkpoint& checkpoint, const std::string& path) {
  std::vector<uint8_t> bytes;
  try {
    bytes = encodeCheckpoint(checkpoint);
  } catch (const IoError& e) {
    throw IoError(
        ErrorCode::FileUnwritable, path,
        e.subject().empty() ? e.detail() : fmt::format("tensor \"{}\": {}", e.subject(), e.detail()));
  }
  detail::writeFileAtomically(path, bytes);
}

void saveCheckpoint(const TrainingSession& session, const std::string& path,
                    std::map<std::string, std::string> extraMetadata) {
  writeCheckpoint(makeCheckpoint(session, std::move(extraMetadata)), path);
}

CheckpointLoadReport restoreCheckpoint(TrainingSession& session, const Checkpoint& checkpoint,
                                       std::string_view source, bool allowNonFinite) {
  if (!allowNonFinite) {
    for (const CheckpointTensor& tensor : checkpoint.tensors) {
      const auto bad = std::find_if(tensor.value.data.begin(), tensor.value.data.end(),
                                    [](float value) { return !std::isfinite(value); });
      if (bad == tensor.value.data.end()) continue;
      throw IoError(
          ErrorCode::NonFiniteCheckpoint, std::string(source),
          fmt::format("tensor \"{}\" holds {} at element {} (the checkpoint of step {}, of a run that "
                      "diverged?); resume from an earlier checkpoint, or allow non-finite values "
                      "(tessera train --allow-non-finite) to load it anyway",
                      boundedText(tensor.name), *bad, bad - tensor.value.data.begin(), checkpoint.step));
    }
  }
  const OptimizerConfig current = optimizerConfig(session.optimizer());
  if (current.type != checkpoint.optimizer.type) {
    mismatch(source,
             fmt::format("the checkpoint holds the state of optimizer {} but the session's optimizer is {}; "
                         "use optimizer type \"{}\"",
                         checkpoint.optimizer.type, current.type, checkpoint.optimizer.type));
  }

  // Check everything before writing anything: each session variable gets
  // its value from one checkpoint tensor, converted to the variable's dtype.
  const std::vector<SessionVariable> variables = savedVariables(session.graph());
  const auto find = [&variables](std::string_view name) {
    return std::find_if(variables.begin(), variables.end(),
                        [&](const SessionVariable& v) { return v.name == name; });
  };
  const auto saved = [&checkpoint](std::string_view name) {
    return std::find_if(checkpoint.tensors.begin(), checkpoint.tensors.end(),
                        [&](const CheckpointTensor& t) { return t.name == name; });
  };
  struct Source {
    const SessionVariable* variable;
    const CheckpointTensor* tensor;
  };
  std::vector<Source> sources;
  std::vector<std::string> unusedMasters;
  const auto checkShape = [&](const SessionVariable& variable, const CheckpointTensor& tensor) {
    const Shape expected = session.readVariable(variable.name, RetrievalMode::OnePerGroup).shape;
    if (expected == tensor.value.shape) return;
    mismatch(source, fmt::format("tensor \"{}\" has shape {} in the checkpoint but {} in the model{}",
                                 tensor.name, shapeStr(tensor.value.shape), shapeStr(expected),
                                 tensor.name == variable.name
                                     ? std::string()
                                     : fmt::format(" (as the value of \"{}\")", variable.name)));
  };
  for (const CheckpointTensor& tensor : checkpoint.tensors) {
    const auto variable = find(tensor.name);
    if (variable == variables.end()) {
      // The master weights of a float16 run loaded into a run without them:
      // its weights take the checkpoint's float16 values.
      const std::string_view name = tensor.name;
      const bool master = tensor.category == TensorCategory::OptimizerState &&
                          name.ends_with(kMasterSuffix) &&
                          find(name.substr(0, name.size() - kMasterSuffix.size())) != variables.end();
      if (master) {
        unusedMasters.push_back(tensor.name);
        continue;
      }
      mismatch(source, fmt::format("tensor \"{}\" ({}) is in the checkpoint but not in the model",
                                   tensor.name, tensor.category));
    }
    if (variable->category != tensor.category) {
      mismatch(source, fmt::format("tensor \"{}\" is {} {} in the checkpoint but {} {} in the model",
                                   tensor.name, tensor.category, dtypeName(tensor.dtype), variable->category,
                                   dtypeName(variable->dtype)));
    }
    if (variable->dtype != tensor.dtype && !(isFloating(variable->dtype) && isFloating(tensor.dtype))) {
      mismatch(source,
               fmt::format("tensor \"{}\" is {} in the checkpoint but {} ({}) in the model; F32 and F16 "
                           "convert into each other, integers into nothing else",
                           tensor.name, dtypeName(tensor.dtype), dtypeName(variable->dtype), variable->dtype));
    }
    checkShape(*variable, tensor);
    sources.push_back({&*variable, &tensor});
  }
  std::vector<std::string> mastersFromWeights;
  for (const SessionVariable& variable : variables) {
    if (saved(variable.name) != checkpoint.tensors.end()) continue;
    // A master weight the checkpoint does not hold (one of a float32 run, or
    // of a float16 run without master weights) is its weight's value.
    const std::string_view name = variable.name;
    if (variable.category == TensorCategory::OptimizerState && name.ends_with(kMasterSuffix)) {
      const auto weight = saved(name.substr(0, name.size() - kMasterSuffix.size()));
      if (weight != checkpoint.tensors.end() && weight->category == TensorCategory::Weight &&
          isFloating(weight->dtype) && isFloating(variable.dtype)) {
        checkShape(variable, *weight);
        sources.push_back({&variable, &*weight});
        mastersFromWeights.push_back(variable.name);
        continue;
      }
    }
    mismatch(source, fmt::format("the model's {} variable \"{}\" is not in the checkpoint", variable.category,
                                 variable.name));
  }

  CheckpointLoadReport report;
  report.step = checkpoint.step;
  report.learningRate = checkpoint.optimizer.learningRate();
  const std::string hash = sessionOptionsHash(session.options());
  if (hash != checkpoint.sessionOptionsHash) {
    std::vector<std::string> changed;
    try {
      changed = differences(parseJsonDocument(checkpoint.sessionOptions, kOptionsKey),
                            json(session.options()), "/sessionOptions");
    } catch (const ConfigError&) {
      // A hand-made Checkpoint value; the hashes still tell that they differ.
    }
    report.warnings.push_back(
        {CheckpointWarningKind::SessionOptions,
         fmt::format("the checkpoint was written with other session options ({}); its tensors are whole, so "
                     "only where they live changes",
                     changed.empty()
                         ? fmt::format("hash {}, this session's {}", checkpoint.sessionOptionsHash, hash)
                         : listed(changed))});
  }
  if (current.learningRate() != report.learningRate) {
    report.warnings.push_back({CheckpointWarningKind::LearningRate,
                               fmt::format("the learning rate {} of the checkpoint replaces the session's {}",
                                           report.learningRate, current.learningRate())});
  }
  OptimizerConfig fixed = checkpoint.optimizer;
  fixed.learningRate() = current.learningRate();
  const std::vector<std::string> hyper = differences(json(fixed), json(current), "/optimizer");
  if (!hyper.empty()) {
    report.warnings.push_back(
        {CheckpointWarningKind::OptimizerHyperParameters,
         fmt::format("the checkpoint's optimizer had other hyper-parameters ({}); the session keeps its own",
                     listed(hyper))});
  }

  std::vector<std::string> rounded;
  std::vector<std::string> widened;
  for (const Source& entry : sources) {
    const CheckpointTensor& tensor = *entry.tensor;
    const SessionVariable& variable = *entry.variable;
    if (variable.dtype == DType::Float16 && tensor.dtype != DType::Float16) {
      // Rounded to nearest even, as the device rounds what it stores.
      HostTensor value = tensor.value;
      std::vector<uint16_t> halves(value.data.size());
      floatsToHalves(value.data.data(), halves.data(), halves.size());
      halvesToFloats(halves.data(), value.data.data(), halves.size());
      session.writeVariable(variable.name, value);
      rounded.push_back(variable.name);
      continue;
    }
    if (variable.dtype == DType::Float32 && tensor.dtype == DType::Float16) widened.push_back(variable.name);
    session.writeVariable(variable.name, tensor.value);
  }
  if (!rounded.empty()) {
    report.warnings.push_back(
        {CheckpointWarningKind::RoundedToHalf,
         fmt::format("{} float16 variable(s) of the model took the checkpoint's F32 values "
                     "rounded to half: {}",
                     rounded.size(), listed(rounded))});
  }
  if (!widened.empty()) {
    report.warnings.push_back(
        {CheckpointWarningKind::WidenedFromHalf,
         fmt::format("{} float32 variable(s) of the model took the checkpoint's F16 values "
                     "(exactly): {}",
                     widened.size(), listed(widened))});
  }
  if (!mastersFromWeights.empty()) {
    report.warnings.push_back(
        {CheckpointWarningKind::MastersFromWeights,
         fmt::format("the checkpoint has no master weights; {} master weight(s) took their "
                     "weight's value: {}",
                     mastersFromWeights.size(), listed(mastersFromWeights))});
  }
  if (!unusedMasters.empty()) {
    report.warnings.push_back(
        {CheckpointWarningKind::UnusedMasters,
         fmt::format("the model keeps no master weights; the checkpoint's {} were not loaded "
                     "(the weights are the checkpoint's float16 values)",
                     listed(unusedMasters))});
  }
  session.setLearningRate(report.learningRate);
  session.setStep(checkpoint.step);
  return report;
}

CheckpointLoadReport loadCheckpoint(TrainingSession& session, const std::string& path, bool allowNonFinite) {
  return restoreCheckpoint(session, readCheckpoint(path, session), path, allowNonFinite);
}

}  // namespace tessera
