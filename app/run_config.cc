// The run config: field tables of its sections, the loader with --set
// overrides and provenance, validate(RunConfig) and the JSON Schema.
#include "tessera/app/run_config.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "device_spec_json.hpp"
#include "input_file.hpp"
#include "json_reader.hpp"
#include "optimizer_options_json.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/app/transformer.hpp"

namespace tessera {

// --- Field tables ----------------------------------------------------------------

constexpr std::array<std::string_view, 3> kModelTypes = {kMlpModel, kOnnxModel, kTransformerModel};

constexpr jsonio::FieldSpec kModelTypeSpec{
    .doc =
        "The model: \"Mlp\" (fully connected layers with `activation` between them and softmax "
        "cross-entropy on the last), \"Onnx\" (the ONNX model in `path`, trained from its initializers) or "
        "\"Transformer\" (a decoder-only transformer in GPT-2's layout, trained on token sequences of a "
        "Tensors dataset). The other keys of the section are the options of that type."};

// The dtypes a model may have.
constexpr std::array<std::string_view, 2> kModelDTypes = {"float32", "float16"};

constexpr jsonio::FieldSpec kModelDTypeSpec{
    .doc =
        "The element type of the weights and activations: \"float32\" or \"float16\". float16 (Mlp and "
        "Transformer): float16 weights, inputs and activations with the logits cast to float32 before the "
        "loss. float16 (Onnx): the float32 model is cast on import (OnnxImportOptions::floatType): float "
        "initializers, inputs and ops in float16, the loss ops' float inputs cast to float32."};

// The fields of one model type; `type` itself is visited by the caller.
template <class V>
void visitModelTypeFields(V& v, ModelConfig& value, std::string_view type) {
  v.field("dtype", value.dtype, kModelDTypeSpec);
  if (type == kOnnxModel) {
    v.field("path", value.path,
            {.doc = "The .onnx file, relative to the folder of the config file. Required."});
    v.field("loss", value.loss,
            {.doc = "The name of the graph's scalar loss tensor; empty: the graph's only output."});
    v.field("dimensions", value.dimensions,
            {.doc = "Values of the model's symbolic dimensions by name: \"batchSize\" (the per-replica batch "
                    "size) or a positive integer as a string (\"128\"). By default the first axis of every "
                    "input is the per-replica batch size."});
    v.field(
        "images", value.images,
        {.doc = "The graph input that the images of an IDX dataset (FashionMnist, Mnist, Synthetic) feed: "
                "each sample's pixels / 255 in the input's shape, which must hold rows x cols elements per "
                "sample (e.g. [batch, 1, 28, 28]). Empty: the graph's only float32 input."});
    v.field(
        "labels", value.labels,
        {.doc = "The graph input [batch] of integer class labels: the one an IDX dataset's labels feed and "
                "the one `logits` is compared with for the test accuracy. Empty: the graph's only integer "
                "input."});
    v.field(
        "logits", value.logits,
        {.doc = "A graph output [batch, classes]: the test accuracy is the fraction of test samples whose "
                "largest logit is at the index of their label (`labels`). Empty: no accuracy; train "
                "reports the test loss only."});
    return;
  }
  if (type == kTransformerModel) {
    TransformerConfig& t = value.transformer;
    v.field("layers", t.layers,
            {.min = 1, .rangeCode = ErrorCode::InvalidModel, .doc = "Decoder blocks. >= 1."});
    v.field("hidden", t.hidden,
            {.min = 1,
             .rangeCode = ErrorCode::InvalidModel,
             .doc = "Width of the residual stream (GPT-2's n_embd). >= 1, a multiple of heads."});
    v.field("heads", t.heads,
            {.min = 1,
             .rangeCode = ErrorCode::InvalidModel,
             .doc = "Attention heads; each attends over hidden / heads dimensions. >= 1."});
    v.field("vocab", t.vocab,
            {.min = 1, .rangeCode = ErrorCode::InvalidModel, .doc = "Token ids are in [0, vocab). >= 1."});
    v.field(
        "sequence", t.sequence,
        {.min = 1,
         .rangeCode = ErrorCode::InvalidModel,
         .doc = "Tokens per sample: the length of the \"tokens\" and \"targets\" inputs and of the position "
                "table. >= 1."});
    v.field(
        "tiedHead", t.tiedHead,
        {.doc = "The head reuses the token embedding (logits = x wte^T, as GPT-2); false: a head weight of "
                "its own, lm_head.weight [hidden, vocab]."});
    return;
  }
  v.field("layers", value.layers,
          {.min = 1,
           .minItems = 2,
           .rangeCode = ErrorCode::InvalidModel,
           .doc = "Layer widths from input to output: at least two, each >= 1."});
  v.field("activation", value.activation, {.doc = "The activation between layers."});
}

// A value of ModelConfig::dimensions: "batchSize" or a positive count.
bool isDimensionValue(std::string_view text) {
  if (text == kBatchSizeDimension) return true;
  if (text.empty() || text.size() > 18 || text[0] == '0') return false;
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The rules of a model section: a known type, and for onnx a path and
// dimension values that mean something.
void checkModel(const ModelConfig& value, const jsonio::RuleSite& site) {
  if (!isFloating(value.dtype) || value.dtype == DType::Float64) {
    const std::string path = site.path("dtype");
    throw ConfigError(ErrorCode::InvalidModel, path,
                      fmt::format("dtype \"{}\" is not a model dtype: weights and activations are floats; "
                                  "expected one of {}{}",
                                  toString(value.dtype), jsonio::quotedList(kModelDTypes), site.origin(path)));
  }
  if (std::find(kModelTypes.begin(), kModelTypes.end(), value.type) == kModelTypes.end()) {
    const std::string path = site.path("type");
    const auto closest = jsonio::closestMatch(value.type, kModelTypes);
    throw ConfigError(ErrorCode::InvalidModel, path,
                      fmt::format("model type \"{}\" is not supported; expected one of {}{}{}", value.type,
                                  jsonio::quotedList(kModelTypes),
                                  closest ? fmt::format(" (did you mean \"{}\"?)", *closest) : std::string(),
                                  site.origin(path)));
  }
  if (value.type == kTransformerModel) {
    const TransformerConfig& t = value.transformer;
    if (t.hidden % t.heads != 0) {
      const std::string path = site.path("heads");
      throw ConfigError(
          ErrorCode::InvalidModel, path,
          fmt::format("heads {} does not divide hidden {}: every head attends over hidden / heads "
                      "dimensions; choose heads among the divisors of hidden{}",
                      t.heads, t.hidden, site.origin(path)));
    }
    return;
  }
  if (value.type != kOnnxModel) return;
  if (value.path.empty()) {
    const std::string path = site.path("path");
    throw ConfigError(
        ErrorCode::InvalidModel, path,
        fmt::format("model type \"Onnx\" needs the path of its .onnx file{}", site.origin(path)));
  }
  for (const auto& [name, dimension] : value.dimensions) {
    if (isDimensionValue(dimension)) continue;
    const std::string path = jsonio::childPath(site.path("dimensions"), name);
    const std::array<std::string_view, 1> names = {kBatchSizeDimension};
    const auto closest = jsonio::closestMatch(dimension, names);
    throw ConfigError(
        ErrorCode::InvalidModel, path,
        fmt::format("dimension \"{}\" is \"{}\"; expected \"batchSize\" (the per-replica batch size) "
                    "or a positive integer as a string such as \"128\"{}{}",
                    jsonio::printable(name), jsonio::printable(dimension),
                    closest ? fmt::format(" (did you mean \"{}\"?)", *closest) : std::string(),
                    site.origin(path)));
  }
}

// The model section is flat: "type" and the fields of that type, as the
// optimizer section is. The reader explains the keys of the other type.
template <class V>
void visitFields(V& v, ModelConfig& value) {
  v.field("type", value.type, kModelTypeSpec);
  if constexpr (std::is_same_v<V, jsonio::JsonReader>) {
    v.setKeyContext(fmt::format("for model type \"{}\"", jsonio::printable(value.type)));
    // Every type's keys with the types that take them; a key of other types only is explained.
    struct TypeKey {
      const char* key;
      std::array<std::string_view, 2> types;
    };
    static constexpr std::array<TypeKey, 13> kTypeKeys = {{
        {"layers", {kMlpModel, kTransformerModel}},
        {"activation", {kMlpModel, {}}},
        {"path", {kOnnxModel, {}}},
        {"loss", {kOnnxModel, {}}},
        {"dimensions", {kOnnxModel, {}}},
        {"images", {kOnnxModel, {}}},
        {"labels", {kOnnxModel, {}}},
        {"logits", {kOnnxModel, {}}},
        {"hidden", {kTransformerModel, {}}},
        {"heads", {kTransformerModel, {}}},
        {"vocab", {kTransformerModel, {}}},
        {"sequence", {kTransformerModel, {}}},
        {"tiedHead", {kTransformerModel, {}}},
    }};
    for (const TypeKey& key : kTypeKeys) {
      if (key.types[0] == value.type || key.types[1] == value.type) continue;
      v.explainKey(key.key, fmt::format("it is an option of model type \"{}\"", key.types[0]));
    }
  }
  visitModelTypeFields(v, value, value.type);
  v.rule([&value](const jsonio::RuleSite& site) { checkModel(value, site); });
}

// One closed alternative per model type ("oneOf"), so that a schema
// validator rejects the options of another type as the reader does.
void visitFields(jsonio::SchemaBuilder& v, ModelConfig&) {
  nlohmann::json& schema = v.schema();
  schema.erase("properties");
  schema.erase("additionalProperties");
  nlohmann::json alternatives = nlohmann::json::array();
  for (const std::string_view type : kModelTypes) {
    ModelConfig defaults;
    nlohmann::json alternative;
    jsonio::SchemaBuilder builder(alternative);
    visitModelTypeFields(builder, defaults, type);
    alternative["title"] = type;
    alternative["properties"]["dtype"]["enum"] = kModelDTypes;
    alternative["properties"]["type"] = {{"const", type}, {"description", kModelTypeSpec.doc}};
    if (type == kMlpModel) {
      alternative["properties"]["type"]["default"] = type;
    } else if (type == kOnnxModel) {
      alternative["required"] = {"type", "path"};
    } else {
      alternative["required"] = {"type"};
    }
    alternatives.push_back(std::move(alternative));
  }
  schema["oneOf"] = std::move(alternatives);
}

template <class V>
void visitFields(V& v, DataConfig& value) {
  v.field("dataset", value.dataset, {.doc = "The dataset to train and test on."});
  v.field(
      "path", value.path,
      {.doc = "Folder holding the IDX files ({train,t10k}-{images-idx3,labels-idx1}-ubyte, optionally .gz). "
              "Empty: the dataset-fashion-mnist package's location (FashionMnist only). For Tensors: the "
              "training set's .safetensors file, relative to the folder of the config file, whose tensor of "
              "each graph input's name feeds that input, split along axis 0."});
  v.field(
      "test", value.test,
      {.doc = "Tensors only: the test set's .safetensors file, relative to the folder of the config file; "
              "empty: no test set."});
  v.field("batchSize", value.batchSize, {.min = 1, .doc = "Samples per replica per micro-batch. >= 1."});
  v.field("testBatchSize", value.testBatchSize,
          {.min = 1, .doc = "Test samples per replica per step. >= 1."});
  v.field("epochs", value.epochs, {.min = 1, .doc = "Passes over the training set. >= 1."});
  v.field("batchesPerStep", value.batchesPerStep,
          {.min = 1,
           .doc = "Batches (weight updates) per session run, PopART's DataFlow batchesPerStep. >= 1; above 1 it "
                  "must divide the batches of an epoch and /output/checkpointEvery, with one instance."});
  v.field("seed", value.seed, {.doc = "Seed for initialisation and shuffling."});
  v.field("limitTrainSamples", value.limitTrainSamples,
          {.min = 0, .doc = "Use only the first N training samples (0: all). >= 0."});
  v.field("limitTestSamples", value.limitTestSamples,
          {.min = 0, .doc = "Use only the first N test samples (0: all). >= 0."});
  v.field("shuffle", value.shuffle, {.doc = "Shuffle the training samples before every epoch."});
  v.rule([&value](const jsonio::RuleSite& site) {
    if (value.dataset == DatasetKind::Mnist && value.path.empty()) {
      const std::string path = site.path("path");
      throw ConfigError(
          ErrorCode::InvalidData, path,
          fmt::format("the Mnist dataset needs a path to its IDX files; only FashionMnist has a "
                      "default location{}",
                      site.origin(path)));
    }
    if (value.dataset == DatasetKind::Tensors && value.path.empty()) {
      const std::string path = site.path("path");
      throw ConfigError(ErrorCode::InvalidData, path,
                        fmt::format("the Tensors dataset needs the path of its training .safetensors file{}",
                                    site.origin(path)));
    }
    if (value.dataset != DatasetKind::Tensors && !value.test.empty()) {
      const std::string path = site.path("test");
      throw ConfigError(
          ErrorCode::InvalidData, path,
          fmt::format("test names a .safetensors test set, which only the Tensors dataset reads "
                      "({} has its own test split); remove it or set /data/dataset to "
                      "\"Tensors\"{}",
                      toString(value.dataset), site.origin(path)));
    }
  });
}

template <class V>
void visitFields(V& v, ScheduleConfig& value) {
  v.field("type", value.type,
          {.doc = "Constant: the optimizer's learningRate throughout; Cosine: from it down to learningRate x "
                  "finalFactor along half a cosine over the run's steps; Step: times gamma after every "
                  "stepEpochs epochs."});
  v.field("finalFactor", value.finalFactor,
          {.min = 0, .max = 1, .doc = "Cosine: the factor of the learning rate at the end of the run. In [0, 1]."});
  v.field("stepEpochs", value.stepEpochs, {.min = 1, .doc = "Step: epochs between decays. >= 1."});
  v.field("gamma", value.gamma,
          {.exclusiveMin = 0, .max = 1, .doc = "step: the factor of each decay. In (0, 1]."});
}

template <class V>
void visitFields(V& v, OutputConfig& value) {
  v.field(
      "checkpoint", value.checkpoint,
      {.doc = "Checkpoint (.safetensors) written after training, and when training is interrupted; empty: "
              "not written."});
  v.field(
      "checkpointEvery", value.checkpointEvery,
      {.min = 0,
       .doc = "Also write the checkpoint every this many steps (0: only at the end and when interrupted). "
              ">= 0; > 0 needs a checkpoint path."});
  v.field(
      "profile", value.profile,
      {.doc = "Profile report (memory, traffic, modelled time) written after training; empty: not written."});
  v.field("trace", value.trace, {.doc = "Chrome trace of the modelled run; empty: not written."});
  v.field("onnx", value.onnx,
          {.doc = "The ONNX model (model type Onnx only) with the trained weights (float32 master weights of a "
                  "float16 run) and BatchNormalization's running statistics in its initializers, written after "
                  "training; empty: not written."});
  // A file name cannot hold a NUL: the system would write to the name cut there.
  v.rule([&value](const jsonio::RuleSite& site) {
    for (const auto& [key, file] :
         {std::pair<std::string_view, const std::string*>{"checkpoint", &value.checkpoint},
          {"profile", &value.profile},
          {"trace", &value.trace}}) {
      const std::size_t nul = file->find('\0');
      if (nul == std::string::npos) continue;
      const std::string path = site.path(key);
      throw ConfigError(
          ErrorCode::InvalidOutput, path,
          fmt::format("the path \"{}\" has a NUL character after its first {} bytes; a file name "
                      "cannot hold one, so remove it{}",
                      jsonio::printable(file->substr(0, nul)), nul, site.origin(path)));
    }
  });
  v.rule([&value](const jsonio::RuleSite& site) {
    if (value.checkpointEvery == 0 || !value.checkpoint.empty()) return;
    const std::string path = site.path("checkpointEvery");
    throw ConfigError(
        ErrorCode::InvalidOutput, path,
        fmt::format("checkpointEvery is {} but no checkpoint path is set; set {} to a file such as "
                    "\"out/model.safetensors\" or checkpointEvery to 0{}",
                    value.checkpointEvery, site.path("checkpoint"), site.origin(path)));
  });
}

template <class V>
void visitFields(V& v, LimitsConfig& value) {
  v.field("maxTensorBytes", value.maxTensorBytes,
          {.min = 1,
           .doc = "The largest tensor a run may create, in bytes: one weight; the model's weights together; "
                  "one replica's activations of the widest layer for a (test) micro-batch; or the host "
                  "buffer of one step's input samples. validate() rejects larger sizes before anything is "
                  "allocated. >= 1."});
  v.field(
      "maxLayers", value.maxLayers,
      {.min = 1,
       .doc = "The most layers a model may have: weight layers of the Mlp model (entries of /model/layers "
              "minus one) or blocks of the Transformer model. Each layer adds ops, tensors and plans whose host "
              "memory and planning time grow with the count. >= 1."});
  v.field("maxReplicas", value.maxReplicas,
          {.min = 1,
           .doc = "The most replicas a run may have over all its instances (the global replication "
                  "factor). Planning keeps an entry per replica, so the host memory of validate, explain "
                  "and train grows with the count. >= 1."});
  v.field("maxHostBytes", value.maxHostBytes,
          {.min = 1,
           .doc = "The most host memory train and evaluate may allocate for the program, in bytes: the "
                  "simulator's buffers of every tensor (weights once, activations per local replica), remote "
                  "buffers, a host copy of the variables and the dataset. Estimated before anything is "
                  "allocated; validate and explain do not apply it. >= 1."});
}

template <class V>
void visitFields(V& v, IoStreamConfig& value) {
  v.field("tileSet", value.tileSet,
          {.doc = "The tiles the stream's host transfers land on or leave from (PopART's TileSet): \"IO\" "
                  "needs /sessionOptions/numIOTiles > 0."});
  v.field("exchangeStrategy", value.exchangeStrategy,
          {.doc = "When the stream's transfers run (PopART's ExchangeStrategy): \"JustInTime\", "
                  "\"OverlapInnerLoop\" or \"OverlapLoops\" (\"OverlapStep\" is not supported, as in PopART)."});
  v.rule([&value](const jsonio::RuleSite& site) {
    if (value.exchangeStrategy != ExchangeStrategy::OverlapStep) return;
    const std::string path = site.path("exchangeStrategy");
    throw ConfigError(ErrorCode::UnsupportedExchangeStrategy, path,
                      fmt::format("OverlapStep (overlap across host steps) is declared by PopART but not "
                                  "supported, and tessera does not support it either; use \"OverlapLoops\", "
                                  "which overlaps across both loops of a step{}",
                                  site.origin(path)));
  });
}

template <class V>
void visitFields(V& v, IoConfig& value) {
  v.field("tileSet", value.tileSet,
          {.doc = "The tile set of every host stream (inputs and the loss) that /io/streams does not set: "
                  "\"Compute\" or \"IO\" (needs /sessionOptions/numIOTiles > 0)."});
  v.field("exchangeStrategy", value.exchangeStrategy,
          {.doc = "The exchange strategy of every host stream that /io/streams does not set: \"JustInTime\", "
                  "\"OverlapInnerLoop\" or \"OverlapLoops\"."});
  v.field("streams", value.streams,
          {.doc = "Settings of single streams by name (an input of the model, or its loss); a key an entry "
                  "leaves out takes the default above."});
  v.rule([&value](const jsonio::RuleSite& site) {
    if (value.exchangeStrategy != ExchangeStrategy::OverlapStep) return;
    const std::string path = site.path("exchangeStrategy");
    throw ConfigError(ErrorCode::UnsupportedExchangeStrategy, path,
                      fmt::format("OverlapStep (overlap across host steps) is declared by PopART but not "
                                  "supported, and tessera does not support it either; use \"OverlapLoops\"{}",
                                  site.origin(path)));
  });
}

template <class V>
void visitFields(V& v, RunConfig& value) {
  v.field("sessionOptions", value.sessionOptions,
          {.doc = "Replication, gradient accumulation and tensor locations (PopART's SessionOptions)."});
  v.field("device", value.device, {.doc = "The simulated hardware; all values are per processor (replica)."});
  v.field("model", value.model, {.doc = "The model to train."});
  v.field("optimizer", value.optimizer,
          {.doc = "The optimizer: \"type\" and the options of that type, e.g. {\"type\": \"SGD\", "
                  "\"learningRate\": 0.05, \"momentum\": 0.9}."});
  v.field("data", value.data, {.doc = "Dataset, batch sizes, epochs and seed."});
  v.field("schedule", value.schedule, {.doc = "How the learning rate changes over the run's steps."});
  v.field("output", value.output, {.doc = "Files written by a training run."});
  v.field("limits", value.limits, {.doc = "Bounds on the sizes the config implies, checked by validate()."});
  v.field("io", value.io,
          {.doc = "Host streams: the tile set and exchange strategy (PopART's InputSettings and the pair on "
                  "AnchorReturnType) of every input and of the loss."});
}

// --- Public JSON -------------------------------------------------------------------

void to_json(nlohmann::json& j, Activation value) { j = jsonio::enumToJson(value); }
void from_json(const nlohmann::json& j, Activation& value) { value = jsonio::enumFromJson<Activation>(j); }
void to_json(nlohmann::json& j, DatasetKind value) { j = jsonio::enumToJson(value); }
void from_json(const nlohmann::json& j, DatasetKind& value) { value = jsonio::enumFromJson<DatasetKind>(j); }
void to_json(nlohmann::json& j, ScheduleType value) { j = jsonio::enumToJson(value); }
void from_json(const nlohmann::json& j, ScheduleType& value) { value = jsonio::enumFromJson<ScheduleType>(j); }
void to_json(nlohmann::json& j, Provenance value) { j = jsonio::enumToJson(value); }
void from_json(const nlohmann::json& j, Provenance& value) { value = jsonio::enumFromJson<Provenance>(j); }

#define TESSERA_SECTION_JSON(Type)                                                      \
  void to_json(nlohmann::json& j, const Type& value) { j = jsonio::writeValue(value); } \
  void from_json(const nlohmann::json& j, Type& value) {                                \
    value = jsonio::readValue<Type>(j, {}, jsonio::SourceMap{});                        \
  }

TESSERA_SECTION_JSON(ModelConfig)
TESSERA_SECTION_JSON(DataConfig)
TESSERA_SECTION_JSON(ScheduleConfig)
TESSERA_SECTION_JSON(OutputConfig)
TESSERA_SECTION_JSON(LimitsConfig)
TESSERA_SECTION_JSON(IoConfig)
TESSERA_SECTION_JSON(RunConfig)
#undef TESSERA_SECTION_JSON

double learningRateFactor(const ScheduleConfig& schedule, int64_t step, int64_t stepsPerEpoch, int64_t epochs) {
  switch (schedule.type) {
    case ScheduleType::Constant: return 1.0;
    case ScheduleType::Cosine: {
      // (1 + cos(pi x)) / 2 = sin^2(pi (1 - x) / 2), from the steps left so
      // that the factor stays above finalFactor until the end of any run.
      const int64_t total = std::max<int64_t>(stepsPerEpoch * epochs, 1);
      const int64_t stepsLeft = std::clamp<int64_t>(total - step, 0, total);
      const double left = static_cast<double>(stepsLeft) / static_cast<double>(total);
      const double s = std::sin(std::numbers::pi * left / 2.0);
      return schedule.finalFactor + (1.0 - schedule.finalFactor) * s * s;
    }
    case ScheduleType::Step: {
      const int64_t epoch = step / std::max<int64_t>(stepsPerEpoch, 1);
      return std::pow(schedule.gamma, static_cast<double>(epoch / std::max<int64_t>(schedule.stepEpochs, 1)));
    }
  }
  return 1.0;
}

// --- Loading -----------------------------------------------------------------------

namespace {

[[noreturn]] void badOverride(const std::string& text, std::string_view message) {
  throw ConfigError(ErrorCode::BadOverride, text, std::string(message));
}

// "12" -> 12; nullopt for anything but a canonical decimal index.
std::optional<std::size_t> arrayIndex(const std::string& token) {
  if (token.empty() || token.size() > 9 || (token.size() > 1 && token[0] == '0')) return std::nullopt;
  std::size_t index = 0;
  for (const char c : token) {
    if (c < '0' || c > '9') return std::nullopt;
    index = index * 10 + static_cast<std::size_t>(c - '0');
  }
  return index;
}

// The value of an override: JSON if it parses, else the text as a string.
nlohmann::json overrideValue(std::string_view valueText, const std::string& path, const std::string& text) {
  try {
    return parseJsonDocument(valueText, fmt::format("--set {}", text));
  } catch (const ConfigError& error) {
    if (error.code() == ErrorCode::JsonSyntax) return std::string(valueText);
    if (error.code() == ErrorCode::DuplicateKey)
      throw ConfigError(error.code(), path + error.subject(), error.detail());
    throw;
  }
}

// Applies "PATH=VALUE" to `document`, creating missing objects on the way;
// returns the canonical JSON pointer it wrote.
std::string applyOverride(nlohmann::json& document, const std::string& text) {
  // A value that is not JSON is kept as a string, so nothing else would
  // check its encoding; every string of a config must be UTF-8 to be written
  // out again (explain, checkpoints).
  if (const auto bad = jsonio::invalidUtf8Offset(text)) {
    badOverride(jsonio::printable(text),
                fmt::format("byte {} (0x{:02x}) is not valid UTF-8; paths and values must be UTF-8 text",
                            *bad, static_cast<unsigned char>(text[*bad])));
  }
  const std::size_t equals = text.find('=');
  if (equals == std::string::npos) {
    badOverride(text,
                "missing \"=\"; an override is PATH=VALUE, e.g. /sessionOptions/replicatedGraphCount=4");
  }
  const std::string_view pointer = std::string_view(text).substr(0, equals);
  if (!pointer.starts_with('/')) {
    badOverride(
        text,
        "the path must be a JSON pointer starting with \"/\", e.g. /sessionOptions/replicatedGraphCount=4");
  }
  const auto tokens = jsonio::splitPointer(pointer);
  if (!tokens)
    badOverride(text, "in a JSON pointer \"~\" must be followed by 0 (for \"~\") or 1 (for \"/\")");
  // Missing objects on the way are created, so the path's length is the
  // depth it adds to the document.
  if (tokens->size() > jsonio::kMaxDepth) {
    throw ConfigError(
        ErrorCode::DocumentLimit, text,
        fmt::format("the path has {} segments; the limit is {}, the nesting depth of a document",
                    tokens->size(), jsonio::kMaxDepth));
  }
  std::string path;
  for (const std::string& token : *tokens) path = jsonio::childPath(path, token);
  nlohmann::json value = overrideValue(std::string_view(text).substr(equals + 1), path, text);

  nlohmann::json* node = &document;
  std::string at;
  for (std::size_t i = 0; i < tokens->size(); ++i) {
    const std::string& token = (*tokens)[i];
    const bool last = i + 1 == tokens->size();
    if (node->is_object()) {
      if (last) {
        (*node)[token] = std::move(value);
        break;
      }
      const auto it = node->find(token);
      node = it != node->end() ? &*it : &((*node)[token] = nlohmann::json::object());
    } else if (node->is_array()) {
      const auto index = arrayIndex(token);
      if (!index || *index >= node->size()) {
        badOverride(text,
                    fmt::format("{} is an array of {} entries and \"{}\" is not the index of one of them",
                                at.empty() ? "the document" : at, node->size(), token));
      }
      if (last) {
        (*node)[*index] = std::move(value);
        break;
      }
      node = &(*node)[*index];
    } else {
      badOverride(text, fmt::format("the path goes through {}, which holds {}, not an object", at,
                                    jsonio::describeValue(*node)));
    }
    at = jsonio::childPath(at, token);
  }
  return path;
}

bool documentHas(const nlohmann::json& document, const std::string& pointer) {
  const auto tokens = jsonio::splitPointer(pointer);
  if (!tokens) return false;
  const nlohmann::json* node = &document;
  for (const std::string& token : *tokens) {
    if (node->is_object()) {
      const auto it = node->find(token);
      if (it == node->end()) return false;
      node = &*it;
    } else if (node->is_array()) {
      const auto index = arrayIndex(token);
      if (!index || *index >= node->size()) return false;
      node = &(*node)[*index];
    } else {
      return false;
    }
  }
  return true;
}

Provenance provenanceOf(const std::string& leaf, const std::vector<std::string>& setPaths,
                        const nlohmann::json& fileDocument) {
  for (const std::string& set : setPaths) {
    if (jsonio::isPathWithin(leaf, set) || jsonio::isPathWithin(set, leaf)) return Provenance::Set;
  }
  return documentHas(fileDocument, leaf) ? Provenance::File : Provenance::Default;
}

std::string readFile(const std::string& path) {
  const detail::InputFile file(path);
  return file.readAll<std::string>(jsonio::kMaxDocumentBytes, [&path](uint64_t size) {
    throw ConfigError(ErrorCode::DocumentLimit, path,
                      fmt::format("the file has {} bytes, more than the limit of {} bytes (64 MiB)", size,
                                  jsonio::kMaxDocumentBytes));
  });
}

// Layer widths the datasets fix (the synthetic set stands in for
// Fashion-MNIST: 28 x 28 images of 10 classes).
constexpr int64_t kMnistInputs = 28 * 28;
constexpr int64_t kMnistClasses = 10;

void checkModelFitsData(const RunConfig& config) {
  const std::vector<int64_t>& layers = config.model.layers;
  const std::string_view dataset = toString(config.data.dataset);
  if (layers.front() != kMnistInputs) {
    throw ConfigError(
        ErrorCode::InvalidModel, "/model/layers/0",
        fmt::format("the input width is {} but {} images have {} pixels; set /model/layers/0 to {}",
                    layers.front(), dataset, kMnistInputs, kMnistInputs));
  }
  if (layers.back() != kMnistClasses) {
    throw ConfigError(ErrorCode::InvalidModel, fmt::format("/model/layers/{}", layers.size() - 1),
                      fmt::format("the output width is {} but {} has {} classes; set the last layer to {}",
                                  layers.back(), dataset, kMnistClasses, kMnistClasses));
  }
}

// A training subset smaller than one step's samples would train nothing.
void checkStepFitsSubset(const RunConfig& config) {
  const DataConfig& data = config.data;
  if (data.limitTrainSamples == 0) return;
  const int64_t replicas = config.sessionOptions.getGlobalReplicationFactor();
  const int64_t factor = config.sessionOptions.getAccumulationFactor();
  int64_t perStep = 0;
  const bool overflow = __builtin_mul_overflow(data.batchSize, replicas, &perStep) ||
                        __builtin_mul_overflow(perStep, factor, &perStep);
  if (!overflow && data.limitTrainSamples >= perStep) return;
  throw ConfigError(ErrorCode::InvalidData, "/data/limitTrainSamples",
                    fmt::format("limitTrainSamples is {} but one step takes batchSize {} x {} replicas x "
                                "accumulationFactor {} samples; raise the limit or lower the batch size",
                                data.limitTrainSamples, data.batchSize, replicas, factor));
}

// --- Size bounds ---

// Host buffers of inputs are float32 (float16 inputs are rounded on the
// device) or int32; logits are float32 before the loss whatever the dtype.
constexpr int64_t kFloatBytes = 4;
constexpr int64_t kInt32Bytes = 4;

// The product of positive factors; nullopt when it overflows int64.
std::optional<int64_t> product(std::initializer_list<int64_t> factors) {
  int64_t result = 1;
  for (const int64_t factor : factors) {
    if (__builtin_mul_overflow(result, factor, &result)) return std::nullopt;
  }
  return result;
}

// Rejects a size over the limit; `bytes` is nullopt when computing it
// overflowed. Without a limit (a command that plans and never makes the
// tensors) only a size that 64 bits cannot count is rejected.
void checkSize(const std::optional<int64_t>& bytes, std::optional<int64_t> limit, const std::string& path,
               std::string_view what) {
  if (bytes && (!limit || *bytes <= *limit)) return;
  if (!limit) {
    throw ConfigError(ErrorCode::ShapeTooLarge, path,
                      fmt::format("{} would take more bytes than 64 bits count; lower {}", what, path));
  }
  const std::string size =
      bytes ? fmt::format("{} bytes", *bytes) : std::string("more bytes than 64 bits count");
  throw ConfigError(ErrorCode::ShapeTooLarge, path,
                    fmt::format("{} would take {}, more than /limits/maxTensorBytes ({} bytes); lower {}, or "
                                "raise /limits/maxTensorBytes if the host has the memory",
                                what, size, *limit, path));
}

// The transformer's largest tensors: its widest weights, its weights
// together (what a host that trains it holds once), one replica's logits and
// attention scores, and the host buffer of one step's tokens.
void checkTransformerSizes(const RunConfig& config, std::optional<int64_t> limit) {
  const TransformerConfig& t = config.model.transformer;
  const DataConfig& data = config.data;
  const int64_t local = config.sessionOptions.getLocalReplicationFactor();
  const int64_t factor = config.sessionOptions.getAccumulationFactor();
  const int64_t bytes = dtypeBytes(config.model.dtype);
  const std::string_view dtype = toString(config.model.dtype);
  checkSize(product({t.vocab, t.hidden, bytes}), limit, "/model/vocab",
            fmt::format("the token embedding wte.weight of {} x {} {}", t.vocab, t.hidden, dtype));
  checkSize(product({t.sequence, t.hidden, bytes}), limit, "/model/sequence",
            fmt::format("the position embedding wpe.weight of {} x {} {}", t.sequence, t.hidden, dtype));
  checkSize(product({t.hidden, 4, t.hidden, bytes}), limit, "/model/hidden",
            fmt::format("an MLP weight of hidden {} x 4 hidden {}", t.hidden, dtype));
  const std::optional<int64_t> parameters = transformerParameterCount(t);
  checkSize(parameters ? product({*parameters, bytes}) : std::nullopt, limit, "/model/layers",
            fmt::format("the model's {} weights together (layers {}, hidden {}, vocab {})",
                        parameters ? std::to_string(*parameters) : std::string("more than 2^63"), t.layers,
                        t.hidden, t.vocab));
  checkSize(product({data.batchSize, t.sequence, t.vocab, kFloatBytes}), limit, "/data/batchSize",
            fmt::format("one replica's logits (batchSize {} x sequence {} x vocab {} float32)",
                        data.batchSize, t.sequence, t.vocab));
  checkSize(product({data.batchSize, t.heads, t.sequence, t.sequence, bytes}), limit, "/data/batchSize",
            fmt::format("one replica's attention scores (batchSize {} x heads {} x sequence {} x sequence {} "
                        "{})",
                        data.batchSize, t.heads, t.sequence, t.sequence, dtype));
  checkSize(product({data.testBatchSize, t.sequence, t.vocab, kFloatBytes}), limit, "/data/testBatchSize",
            fmt::format("one replica's test logits (testBatchSize {} x sequence {} x vocab {} float32)",
                        data.testBatchSize, t.sequence, t.vocab));
  checkSize(product({data.batchSize, local, factor, t.sequence, kInt32Bytes}), limit, "/data/batchSize",
            fmt::format("the host buffer of one step's tokens (batchSize {} x {} local replicas x "
                        "accumulationFactor {} x sequence {}, int32)",
                        data.batchSize, local, factor, t.sequence));
}

// Every size the config implies, computed before anything of that size is
// allocated, against `limit` (none: only countable in 64 bits). The fields are
// in range here (the section rules ran first).
void checkSizes(const RunConfig& config, std::optional<int64_t> limit) {
  const int64_t maxLayers = config.limits.maxLayers;
  const int64_t layerCount = config.model.type == kTransformerModel
                                 ? config.model.transformer.layers
                                 : static_cast<int64_t>(config.model.layers.size()) - 1;
  if (config.model.type != kOnnxModel && layerCount > maxLayers) {
    throw ConfigError(
        ErrorCode::ShapeTooLarge, "/model/layers",
        fmt::format("the model has {} layers, more than /limits/maxLayers ({}); use fewer layers, "
                    "or raise /limits/maxLayers if the host has the memory and time to plan them",
                    layerCount, maxLayers));
  }
  const std::vector<int64_t>& layers = config.model.layers;
  const int64_t local = config.sessionOptions.getLocalReplicationFactor();
  const int64_t global = config.sessionOptions.getGlobalReplicationFactor();
  if (global > config.limits.maxReplicas) {
    const std::string path = config.sessionOptions.enableDistributedReplicatedGraphs
                                 ? "/sessionOptions/globalReplicationFactor"
                                 : "/sessionOptions/replicatedGraphCount";
    throw ConfigError(ErrorCode::ShapeTooLarge, path,
                      fmt::format("the run has {} replicas, more than /limits/maxReplicas ({}); lower {}, or "
                                  "raise /limits/maxReplicas if the host has the memory and time to plan them",
                                  global, config.limits.maxReplicas, path));
  }
  const int64_t factor = config.sessionOptions.getAccumulationFactor();
  const DataConfig& data = config.data;
  // The global batch is a count, never one buffer, but the step loop computes it.
  const auto checkGlobalBatch = [&] {
    if (product({data.batchSize, global, factor})) return;
    throw ConfigError(ErrorCode::ShapeTooLarge, "/data/batchSize",
                      fmt::format("a global batch of batchSize {} x {} replicas x accumulationFactor {} "
                                  "samples does not fit in a 64-bit count; lower /data/batchSize",
                                  data.batchSize, global, factor));
  };
  if (config.model.type == kTransformerModel) {
    checkTransformerSizes(config, limit);
    checkGlobalBatch();
    return;
  }
  // An ONNX model's sizes come with the model: the import checks them.
  if (config.model.type != kMlpModel) {
    checkGlobalBatch();
    return;
  }

  const int64_t bytes = dtypeBytes(config.model.dtype);
  const std::string_view dtype = toString(config.model.dtype);
  std::optional<int64_t> total = 0;
  std::size_t widest = 0;
  for (std::size_t i = 0; i + 1 < layers.size(); ++i) {
    const std::size_t larger = layers[i + 1] >= layers[i] ? i + 1 : i;
    const std::optional<int64_t> weight = product({layers[i], layers[i + 1], bytes});
    checkSize(weight, limit, fmt::format("/model/layers/{}", larger),
              fmt::format("weight W{} of {} x {} {}", i, layers[i], layers[i + 1], dtype));
    // A bias is one row of its weight, so its size cannot overflow.
    const int64_t bias = layers[i + 1] * bytes;
    if (total &&
        (__builtin_add_overflow(*total, *weight, &*total) || __builtin_add_overflow(*total, bias, &*total))) {
      total = std::nullopt;
    }
    if (layers[i + 1] > layers[widest]) widest = i + 1;
  }
  checkSize(
      total, limit, "/model/layers",
      fmt::format("the model's {} weights and {} biases together", layers.size() - 1, layers.size() - 1));
  // The widest activation in the model's dtype, or the float32 logits of a
  // float16 model when they take more bytes.
  int64_t width = layers[widest];
  int64_t widthBytes = bytes;
  std::string_view widthType = dtype;
  if (layers.back() * kFloatBytes > width * bytes) {
    width = layers.back();
    widthBytes = kFloatBytes;
    widthType = "float32";
  }
  checkSize(product({data.batchSize, width, widthBytes}), limit, "/data/batchSize",
            fmt::format("one replica's activations of the widest layer (batchSize {} x {} {})", data.batchSize,
                        width, widthType));
  checkSize(product({data.testBatchSize, width, widthBytes}), limit, "/data/testBatchSize",
            fmt::format("one replica's test activations of the widest layer (testBatchSize {} x {} {})",
                        data.testBatchSize, width, widthType));
  checkSize(product({data.batchSize, local, factor, layers.front(), kFloatBytes}), limit, "/data/batchSize",
            fmt::format("the host buffer of one step's inputs (batchSize {} x {} local replicas x "
                        "accumulationFactor {} x {} inputs, float32)",
                        data.batchSize, local, factor, layers.front()));
  checkSize(product({data.testBatchSize, local, layers.front(), kFloatBytes}), limit, "/data/testBatchSize",
            fmt::format("the host buffer of one test step's inputs (testBatchSize {} x {} local replicas x "
                        "{} inputs, float32)",
                        data.testBatchSize, local, layers.front()));
  checkGlobalBatch();
}

}  // namespace

IoStreamConfig IoConfig::of(const std::string& name) const {
  const auto it = streams.find(name);
  return it != streams.end() ? it->second : IoStreamConfig{tileSet, exchangeStrategy};
}

namespace {

// A key an /io/streams entry leaves out takes the /io default.
void inheritIoDefaults(nlohmann::json& document) {
  const auto io = document.find("io");
  if (io == document.end() || !io->is_object()) return;
  const auto streams = io->find("streams");
  if (streams == io->end() || !streams->is_object()) return;
  for (auto& item : streams->items()) {
    nlohmann::json& entry = item.value();
    if (!entry.is_object()) continue;
    for (const char* key : {"tileSet", "exchangeStrategy"}) {
      const auto given = io->find(key);
      if (given != io->end() && !entry.contains(key)) entry[key] = *given;
    }
  }
}

}  // namespace

LoadedRunConfig parseRunConfig(std::string_view text, std::string_view source,
                               const std::vector<std::string>& overrides) {
  nlohmann::json document = parseJsonDocument(text, source);
  jsonio::SourceMap sources{std::string(source)};
  if (!document.is_object()) jsonio::throwWrongType("an object (the run config)", document, {}, sources);
  // Provenance compares with the document as the file gave it.
  const nlohmann::json fileDocument = overrides.empty() ? nlohmann::json() : document;
  std::vector<std::string> setPaths;
  for (const std::string& override : overrides) {
    setPaths.push_back(applyOverride(document, override));
    sources.addOverride(setPaths.back(), override);
  }
  inheritIoDefaults(document);
  LoadedRunConfig loaded;
  loaded.config = jsonio::readValue<RunConfig>(document, {}, sources);
  const nlohmann::json& original = overrides.empty() ? document : fileDocument;
  for (std::string& leaf : jsonio::leafPaths(loaded.config, {})) {
    const Provenance provenance = provenanceOf(leaf, setPaths, original);
    loaded.provenance.emplace(std::move(leaf), provenance);
  }
  return loaded;
}

LoadedRunConfig loadRunConfig(const std::string& path, const std::vector<std::string>& overrides) {
  LoadedRunConfig loaded = parseRunConfig(readFile(path), path, overrides);
  // The files an ONNX model and a tensors dataset name travel with the
  // config: relative paths are relative to its folder.
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  const auto besideConfig = [&folder](std::string& file) {
    if (file.empty() || std::filesystem::path(file).is_absolute()) return;
    file = (folder / file).lexically_normal().generic_string();
  };
  RunConfig& config = loaded.config;
  if (config.model.type == kOnnxModel) besideConfig(config.model.path);
  if (config.data.dataset == DatasetKind::Tensors) {
    besideConfig(config.data.path);
    besideConfig(config.data.test);
  }
  return loaded;
}

namespace {

// A stream on the IO tiles needs some (tessera.config.183).
void checkIoTiles(const RunConfig& config) {
  if (config.sessionOptions.numIOTiles > 0) return;
  std::string path;
  if (config.io.tileSet == TileSet::IO) path = "/io/tileSet";
  for (const auto& [name, stream] : config.io.streams) {
    if (path.empty() && stream.tileSet == TileSet::IO)
      path = jsonio::childPath(jsonio::childPath("/io/streams", name), "tileSet");
  }
  if (path.empty()) return;
  throw ConfigError(ErrorCode::HostStreamIOTilesWithoutIOTiles, path,
                    "the host stream is on the IO tiles but /sessionOptions/numIOTiles is 0; set numIOTiles to an "
                    "even number >= 32 (e.g. 64), or the tile set to \"Compute\"");
}

void validate(const RunConfig& config, std::optional<int64_t> sizeLimit) {
  // The device first: the options are checked against it.
  jsonio::checkRules(config.device, "/device");
  validate(config.sessionOptions, config.device);
  jsonio::checkRules(config.model, "/model");
  jsonio::checkRules(config.optimizer, "/optimizer");
  checkLossScaling(config.optimizer.type == OptimizerType::Sgd ? config.optimizer.sgd.lossScaling
                                                               : config.optimizer.adam.lossScaling,
                   config.sessionOptions.automaticLossScalingSettings);
  jsonio::checkRules(config.data, "/data");
  jsonio::checkRules(config.output, "/output");
  jsonio::checkRules(config.limits, "/limits");
  jsonio::checkRules(config.io, "/io");
  checkIoTiles(config);
  const int64_t batchesPerStep = config.data.batchesPerStep;
  if (batchesPerStep > 1 && config.output.checkpointEvery % batchesPerStep != 0) {
    throw ConfigError(ErrorCode::InvalidBatchesPerStep, "/output/checkpointEvery",
                      fmt::format("checkpointEvery is {} batches but a run takes /data/batchesPerStep {} at a "
                                  "time, so checkpoints can only fall on multiples of {}; set checkpointEvery to "
                                  "one",
                                  config.output.checkpointEvery, batchesPerStep, batchesPerStep));
  }
  // Sizes first: a width beyond the limits is reported as such whatever the
  // dataset.
  checkSizes(config, sizeLimit);
  // A tensors dataset is checked against the graph's inputs when it is loaded.
  if (config.model.type == kMlpModel && config.data.dataset != DatasetKind::Tensors)
    checkModelFitsData(config);
  if (config.model.type == kTransformerModel && config.data.dataset != DatasetKind::Tensors) {
    const TransformerConfig& t = config.model.transformer;
    throw ConfigError(
        ErrorCode::InvalidData, "/data/dataset",
        fmt::format("the {} dataset holds images; the Transformer model is fed token sequences by the "
                    "Tensors dataset: set /data/dataset to \"Tensors\" and /data/path to a .safetensors file "
                    "with int32 or int64 tensors \"tokens\" and \"targets\" of [N, {}] ids in [0, {})",
                    toString(config.data.dataset), t.sequence, t.vocab));
  }
  checkStepFitsSubset(config);
  if (!config.output.onnx.empty() && config.model.type != kOnnxModel) {
    throw ConfigError(ErrorCode::InvalidOutput, "/output/onnx",
                      fmt::format("the {} model was not imported from ONNX, so there is no ONNX model to write "
                                  "its weights into; remove /output/onnx, or write a checkpoint "
                                  "(/output/checkpoint)",
                                  config.model.type));
  }
}

}  // namespace

void validate(const RunConfig& config) { validate(config, config.limits.maxTensorBytes); }

void validateForPlanning(const RunConfig& config) { validate(config, std::nullopt); }

nlohmann::json runConfigSchema() {
  nlohmann::json schema = jsonio::schemaOf<RunConfig>(
      "A tessera run config: session options, simulated device, model, optimizer, data and outputs. Every "
      "section and key is optional; missing keys take their defaults. Enum values are PascalCase, as the "
      "PopART or ONNX names they stand for (\"OnChip\", \"SGD\", \"Relu\", \"FashionMnist\"); dtypes are "
      "lowercase (\"float32\") (docs/run-configs.md, spelling of enum values).");
  schema["$schema"] = "https://json-schema.org/draft/2020-12/schema";
  schema["title"] = "tessera run config";
  return schema;
}

}  // namespace tessera
