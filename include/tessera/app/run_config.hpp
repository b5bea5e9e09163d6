// The run config: one JSON document that describes a whole training run.
//
//   {
//     "sessionOptions": { ... SessionOptions ... },
//     "device":         { ... DeviceSpec ... },
//     "model":          {"type": "Mlp", "layers": [784, 256, 128, 10]},
//     "optimizer":      {"type": "SGD", "learningRate": 0.05, "momentum": 0.9},
//     "data":           {"dataset": "FashionMnist", "batchSize": 64, "epochs": 10, ...},
//     "output":         {"checkpoint": "...", "checkpointEvery": 100, "profile": "...", "trace": "..."},
//     "limits":         {"maxTensorBytes": 4294967296}
//   }
//
// Every section and key is optional; missing keys take the defaults of the
// C++ types. Unknown keys, wrong types, out-of-range numbers, invalid enum
// strings, duplicate keys and trailing garbage are ConfigErrors naming the
// JSON path.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/enum_names.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/lib/input_settings.hpp"
#include "tessera/optimizers/optimizer_options.hpp"
#include "tessera/lib/session_options.hpp"

namespace tessera {

// Names equal but for case, '-' and '_' ("FashionMnist" and
// "fashion-mnist", "SGD" and "sgd"), and the lookup by that equality: the
// spellings of enum values before they were PascalCase (docs/run-configs.md).
// For did-you-mean hints and for reading files written with the old
// spellings, never for configs.
constexpr bool sameFoldedName(std::string_view a, std::string_view b) noexcept {
  const auto fold = [](std::string_view text, std::size_t& i) -> char {
    while (i < text.size() && (text[i] == '-' || text[i] == '_')) ++i;
    if (i == text.size()) return '\0';
    const char c = text[i++];
    return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
  };
  std::size_t i = 0;
  std::size_t j = 0;
  while (true) {
    const char x = fold(a, i);
    if (x != fold(b, j)) return false;
    if (x == '\0') return true;
  }
}

template <NamedEnum E>
constexpr std::optional<E> enumFromFoldedString(std::string_view name) noexcept {
  for (const auto& [v, n] : EnumNames<E>::kNames) {
    if (sameFoldedName(name, n)) return v;
  }
  return std::nullopt;
}

enum class Activation { Relu, Gelu, Tanh, Sigmoid };

template <>
struct EnumNames<Activation> {
  static constexpr std::string_view kTypeName = "Activation";
  static constexpr std::array kNames = {std::pair{Activation::Relu, std::string_view{"Relu"}},
                                        std::pair{Activation::Gelu, std::string_view{"Gelu"}},
                                        std::pair{Activation::Tanh, std::string_view{"Tanh"}},
                                        std::pair{Activation::Sigmoid, std::string_view{"Sigmoid"}}};
};

// The model types of ModelConfig::type.
inline constexpr std::string_view kMlpModel = "Mlp";
inline constexpr std::string_view kOnnxModel = "Onnx";
inline constexpr std::string_view kTransformerModel = "Transformer";

// The value of ModelConfig::dimensions that binds a symbolic dimension to the
// per-replica batch size of the session being built (DataConfig::batchSize
// for training, testBatchSize for the test set).
inline constexpr std::string_view kBatchSizeDimension = "batchSize";

// A decoder-only transformer in GPT-2's layout (see transformer.hpp): token
// and position embeddings, `layers` pre-LayerNorm blocks of causal
// self-attention and a GELU MLP of 4 x hidden, a final LayerNorm, a head over
// the vocabulary and the next-token cross-entropy. The defaults are GPT-2
// small's.
struct TransformerConfig {
  // Decoder blocks. >= 1.
  int64_t layers = 12;
  // Width of the residual stream (GPT-2's n_embd). >= 1, a multiple of heads.
  int64_t hidden = 768;
  // Attention heads; each attends over hidden / heads dimensions. >= 1.
  int64_t heads = 12;
  // Token ids are in [0, vocab). >= 1.
  int64_t vocab = 50257;
  // Tokens per sample, the size of the position table (GPT-2's n_positions). >= 1.
  int64_t sequence = 1024;
  // The head reuses the token embedding (logits = x wte^T, as GPT-2);
  // false: a head weight of its own, "lm_head.weight" [hidden, vocab].
  bool tiedHead = true;
  bool operator==(const TransformerConfig&) const = default;
};

struct ModelConfig {
  // "Mlp": fully connected layers with `activation` between them and softmax
  // cross-entropy on the last. "Onnx": the ONNX model in `path`, trained
  // from its initializers (not re-drawn). "Transformer": the decoder-only
  // transformer of `transformer`.
  std::string type = std::string(kMlpModel);

  // ----- every type -----

  // The element type of the weights and activations: float32 or float16
  // (int32 is not a model dtype). float16 (Mlp and Transformer): the
  // builders make float16 weights, inputs and activations and cast the
  // logits to float32 before the loss (mixed-precision training). The host
  // feeds float inputs as float; the device rounds them to half on store.
  // float16 (Onnx): the float32 model is imported as float16
  // (OnnxImportOptions::floatType), the float inputs of its loss ops cast to
  // float32.
  DType dtype = DType::Float32;

  // ----- type "Mlp" -----

  // Layer widths from input to output: at least two, each >= 1.
  std::vector<int64_t> layers{784, 256, 128, 10};
  Activation activation = Activation::Relu;

  // ----- type "Onnx" -----

  // The .onnx file. loadRunConfig() takes a relative path relative to the
  // folder of the config file; a config parsed from text keeps it as given
  // (relative to the working directory).
  std::string path{};
  // The name of the graph's scalar loss tensor; empty: the graph's only
  // output.
  std::string loss{};
  // Values of symbolic dimensions (ONNX dim_param) by name: "batchSize" (the
  // per-replica batch of the session: batchSize for training, testBatchSize
  // for testing) or a positive integer written as a string ("128"). By
  // default the first axis of every input is the per-replica batch size;
  // entries here take precedence.
  std::map<std::string, std::string> dimensions{};
  // The graph input that the images of an IDX dataset (FashionMnist, Mnist,
  // Synthetic) feed, each sample's pixels / 255 in the input's shape; empty:
  // the graph's only float32 input.
  std::string images{};
  // The graph input of the class labels: the one an IDX dataset's labels
  // feed, and the one test accuracy compares `logits` with; empty: the
  // graph's only integer input.
  std::string labels{};
  // A graph output [batch, classes] whose argmax is the predicted class:
  // train reports the test accuracy from it (besides the test loss). Empty:
  // no accuracy.
  std::string logits{};

  // ----- type "Transformer" -----

  // In JSON its fields are the model section's own keys: {"type":
  // "transformer", "layers": 48, "hidden": 1600, ...}.
  TransformerConfig transformer{};

  bool operator==(const ModelConfig&) const = default;
};

enum class DatasetKind { FashionMnist, Mnist, Synthetic, Tensors };

template <>
struct EnumNames<DatasetKind> {
  static constexpr std::string_view kTypeName = "DatasetKind";
  static constexpr std::array kNames = {
      std::pair{DatasetKind::FashionMnist, std::string_view{"FashionMnist"}},
      std::pair{DatasetKind::Mnist, std::string_view{"Mnist"}},
      std::pair{DatasetKind::Synthetic, std::string_view{"Synthetic"}},
      std::pair{DatasetKind::Tensors, std::string_view{"Tensors"}}};
};

struct DataConfig {
  DatasetKind dataset = DatasetKind::FashionMnist;
  // Folder holding the IDX files ({train,t10k}-{images-idx3,labels-idx1}-ubyte,
  // optionally .gz). Empty: the dataset-fashion-mnist package's location.
  // For "Tensors": the training set's .safetensors file (required), whose
  // tensor of each graph input's name feeds that input, split along axis 0;
  // loadRunConfig() takes it relative to the config file's folder.
  std::string path{};
  // "Tensors" only: the test set's .safetensors file, relative like `path`;
  // empty: no test set.
  std::string test{};
  // Samples per replica per micro-batch. >= 1.
  int64_t batchSize = 64;
  // Test samples per replica per step. >= 1. The mlp model's accuracy runs
  // at most ceil(test samples / replicas) per replica: a larger batch would
  // only add padding.
  int64_t testBatchSize = 100;
  // Passes over the training set. >= 1.
  int64_t epochs = 1;
  // Batches (weight updates) per session run, PopART's DataFlow
  // batchesPerStep. >= 1; more than 1 must divide the batches of an epoch
  // and /output/checkpointEvery, and needs one instance.
  int64_t batchesPerStep = 1;
  // Seed for initialisation and shuffling.
  int64_t seed = 0;
  // Use only the first N training samples (0: all). >= 0.
  int64_t limitTrainSamples = 0;
  // Use only the first N test samples (0: all). >= 0.
  int64_t limitTestSamples = 0;
  bool shuffle = true;
  bool operator==(const DataConfig&) const = default;
};

enum class ScheduleType { Constant, Cosine, Step };

template <>
struct EnumNames<ScheduleType> {
  static constexpr std::string_view kTypeName = "ScheduleType";
  static constexpr std::array kNames = {std::pair{ScheduleType::Constant, std::string_view{"Constant"}},
                                        std::pair{ScheduleType::Cosine, std::string_view{"Cosine"}},
                                        std::pair{ScheduleType::Step, std::string_view{"Step"}}};
};

// The learning rate of each training step: the optimizer's learningRate
// times learningRateFactor(schedule, step, ...).
struct ScheduleConfig {
  // Constant: the optimizer's rate throughout. Cosine: from the rate down to
  // rate x finalFactor along half a cosine over the run's steps. Step: the
  // rate times gamma after every stepEpochs epochs.
  ScheduleType type = ScheduleType::Constant;
  // Cosine: the factor at the end of the run. In [0, 1].
  double finalFactor = 0.0;
  // Step: epochs between decays. >= 1.
  int64_t stepEpochs = 1;
  // Step: the factor of each decay. In (0, 1].
  double gamma = 0.1;
  bool operator==(const ScheduleConfig&) const = default;
};

// The factor of the learning rate at global step `step` (0-based) of a run of
// `epochs` epochs of `stepsPerEpoch` steps.
double learningRateFactor(const ScheduleConfig& schedule, int64_t step, int64_t stepsPerEpoch,
                          int64_t epochs);

struct OutputConfig {
  // Paths to write; empty: not written.
  std::string checkpoint{};
  std::string profile{};
  std::string trace{};
  // The ONNX model (model type "Onnx" only) with its initializers replaced by
  // the trained weights (the float32 master weights of a float16 run) and the
  // running statistics of BatchNormalization, written after training:
  // PopART's modelToHost. See writeOnnx (tessera/onnx/onnx.hpp).
  std::string onnx{};
  // Also write the checkpoint every this many steps (0: only at the end and
  // when interrupted). >= 0; > 0 needs a checkpoint path.
  int64_t checkpointEvery = 0;
  bool operator==(const OutputConfig&) const = default;
};

// The default of LimitsConfig::maxTensorBytes: 4 GiB.
inline constexpr int64_t kDefaultMaxTensorBytes = int64_t{4} << 30;

// The default of LimitsConfig::maxLayers.
inline constexpr int64_t kDefaultMaxLayers = 1024;

// The default of LimitsConfig::maxReplicas: 64 times the 1,024 replicas of
// the largest sample.
inline constexpr int64_t kDefaultMaxReplicas = 65536;

// The default of LimitsConfig::maxHostBytes: 16 GiB, a fixed amount (not a
// share of the machine's memory) so that a config is accepted or refused
// alike on every machine and by every instance of a run.
inline constexpr int64_t kDefaultMaxHostBytes = int64_t{16} << 30;

// Bounds on the sizes a run config implies. validate() computes every size
// with overflow checks and rejects one over its bound (ShapeTooLarge, at the
// path of the setting that makes it large) before anything is allocated, so
// that a mistyped width or batch size fails with a message instead of
// exhausting the host's memory. They bound what the host allocates to train:
// validateForPlanning() (tessera validate, explain) does not apply them.
struct LimitsConfig {
  // The largest tensor a run may create, in bytes: one weight; the model's
  // weights together; one replica's activations of the widest layer for a
  // (test) micro-batch; or the host buffer of one step's input samples
  // (batchSize x local replicas x accumulationFactor samples). >= 1. The
  // default is far above what the simulator trains in reasonable time; raise
  // it only for a host with the memory to match.
  int64_t maxTensorBytes = kDefaultMaxTensorBytes;
  // The most layers a model may have: weight layers of the mlp model
  // (entries of /model/layers minus one) or blocks of the transformer. Each
  // layer adds ops, tensors and plans, whose host memory and planning time
  // grow with the count whatever the widths. >= 1.
  int64_t maxLayers = kDefaultMaxLayers;
  // The most replicas a run may have over all its instances (the global
  // replication factor). Planning keeps an entry per replica, so the host
  // memory of validate, explain and train grows with the count. >= 1.
  int64_t maxReplicas = kDefaultMaxReplicas;
  // The most host memory train (and evaluate) may allocate for the program,
  // in bytes: the simulator's buffers of every tensor (one value per group
  // of replicas that hold the same one: weights once, activations per local
  // replica), remote buffers, one host copy of the variables (checkpoints)
  // and the dataset. Estimated from the plan before anything is allocated;
  // a run over it is refused (DeviceError HostMemoryLimit) naming the
  // largest parts. The device's memory (tilesPerIpu x bytesPerTile) does not
  // bound this: a simulated device of 10^8 tiles is still simulated in host
  // memory. validateForPlanning() (validate, explain) does not apply it. >= 1.
  int64_t maxHostBytes = kDefaultMaxHostBytes;
  bool operator==(const LimitsConfig&) const = default;
};

// The tile set and exchange strategy of one host stream (PopART's
// InputSettings, or the pair on an anchor's AnchorReturnType).
struct IoStreamConfig {
  TileSet tileSet = TileSet::Compute;
  ExchangeStrategy exchangeStrategy = ExchangeStrategy::JustInTime;
  bool operator==(const IoStreamConfig&) const = default;
};

// The host streams of the run: every input the model reads from the host and
// every output returned to it (the loss), e.g.
//   "io": {"tileSet": "IO", "exchangeStrategy": "OverlapInnerLoop",
//          "streams": {"labels": {"exchangeStrategy": "JustInTime"}}}
// tileSet and exchangeStrategy are the defaults of every stream; `streams`
// sets streams by name (a key an entry leaves out takes the default above
// when read from JSON). A name that is no stream of the model is
// tessera.config.182, IO without /sessionOptions/numIOTiles
// tessera.config.183, OverlapStep tessera.config.184.
struct IoConfig {
  TileSet tileSet = TileSet::Compute;
  ExchangeStrategy exchangeStrategy = ExchangeStrategy::JustInTime;
  std::map<std::string, IoStreamConfig> streams{};
  // The settings of stream `name`.
  IoStreamConfig of(const std::string& name) const;
  bool operator==(const IoConfig&) const = default;
};

struct RunConfig {
  SessionOptions sessionOptions{};
  DeviceSpec device{};
  ModelConfig model{};
  OptimizerConfig optimizer{};
  DataConfig data{};
  ScheduleConfig schedule{};
  OutputConfig output{};
  LimitsConfig limits{};
  IoConfig io{};
  bool operator==(const RunConfig&) const = default;
};

// Where a value of a loaded config came from.
enum class Provenance { Default, File, Set };

template <>
struct EnumNames<Provenance> {
  static constexpr std::string_view kTypeName = "Provenance";
  static constexpr std::array kNames = {std::pair{Provenance::Default, std::string_view{"default"}},
                                        std::pair{Provenance::File, std::string_view{"file"}},
                                        std::pair{Provenance::Set, std::string_view{"--set"}}};
};

struct LoadedRunConfig {
  RunConfig config;
  // Canonical JSON pointer of every leaf value -> where it came from.
  std::map<std::string, Provenance> provenance;
};

// Parses `text` (named `source` in errors), applies each "PATH=VALUE"
// override (PATH a JSON pointer of at most 64 segments; VALUE parsed as
// JSON, else taken as a string), then reads the result strictly. Does not
// run validate().
LoadedRunConfig parseRunConfig(std::string_view text, std::string_view source,
                               const std::vector<std::string>& overrides = {});
// The same for a file; IoError(FileUnreadable) when it cannot be read.
LoadedRunConfig loadRunConfig(const std::string& path, const std::vector<std::string>& overrides = {});

// validate(options, device) plus the rules of the other sections and the
// size bounds of config.limits.
void validate(const RunConfig& config);

// validate() for what only plans the run (planRun, `tessera validate` and
// `tessera explain`): every rule but the host bounds of config.limits, since
// planning makes no tensor of the sizes they bound; a size must still be
// countable in 64 bits (ShapeTooLarge otherwise). A plan of a model larger
// than the host is answered; training it is refused by validate().
void validateForPlanning(const RunConfig& config);

// JSON Schema (draft 2020-12) of the run config, generated from the tables
// the parser uses.
nlohmann::json runConfigSchema();

// JSON of the sections and of the whole run config, without overrides or
// provenance (see parseRunConfig for those), by the conventions of
// tessera/lib/json.hpp; the JSON of sessionOptions, device and optimizer is
// declared with their types.
void to_json(nlohmann::json& j, Activation value);
void from_json(const nlohmann::json& j, Activation& value);
void to_json(nlohmann::json& j, DatasetKind value);
void from_json(const nlohmann::json& j, DatasetKind& value);
void to_json(nlohmann::json& j, ScheduleType value);
void from_json(const nlohmann::json& j, ScheduleType& value);
void to_json(nlohmann::json& j, Provenance value);
void from_json(const nlohmann::json& j, Provenance& value);
void to_json(nlohmann::json& j, const ModelConfig& value);
void from_json(const nlohmann::json& j, ModelConfig& value);
void to_json(nlohmann::json& j, const DataConfig& value);
void from_json(const nlohmann::json& j, DataConfig& value);
void to_json(nlohmann::json& j, const ScheduleConfig& value);
void from_json(const nlohmann::json& j, ScheduleConfig& value);
void to_json(nlohmann::json& j, const OutputConfig& value);
void from_json(const nlohmann::json& j, OutputConfig& value);
void to_json(nlohmann::json& j, const LimitsConfig& value);
void from_json(const nlohmann::json& j, LimitsConfig& value);
void to_json(nlohmann::json& j, const IoConfig& value);
void from_json(const nlohmann::json& j, IoConfig& value);
void to_json(nlohmann::json& j, const RunConfig& value);
void from_json(const nlohmann::json& j, RunConfig& value);

}  // namespace tessera
