#include "run_model.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <span>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "json_reader.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/app/transformer.hpp"

namespace tessera {
namespace {

std::string suggestion(std::string_view word, const std::vector<std::string>& candidates) {
  const std::vector<std::string_view> views(candidates.begin(), candidates.end());
  const auto closest = jsonio::closestMatch(word, views);
  return closest ? fmt::format(" (did you mean \"{}\"?)", *closest) : std::string();
}

bool isCount(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The dimension values of the import: the first axis of every input bound to
// the batch, then /model/dimensions, each of whose names must be a symbolic
// dimension of the model.
std::map<std::string, int64_t, std::less<>> boundDimensions(const ModelConfig& model, int64_t batchSize) {
  const OnnxSignature signature = readOnnxSignature(model.path);
  std::map<std::string, int64_t, std::less<>> dimensions;
  std::set<std::string> symbolic;
  for (const OnnxValueInfo& input : signature.inputs) {
    for (std::size_t axis = 0; axis < input.dims.size(); ++axis) {
      const std::string& dim = input.dims[axis];
      if (isCount(dim) || dim == "?") continue;
      symbolic.insert(dim);
      if (axis == 0) dimensions.emplace(dim, batchSize);
    }
  }
  for (const auto& [name, value] : model.dimensions) {
    const std::string path = jsonio::childPath("/model/dimensions", name);
    if (!symbolic.contains(name)) {
      const std::vector<std::string> names(symbolic.begin(), symbolic.end());
      throw ConfigError(
          ErrorCode::InvalidModel, path,
          fmt::format("the model's inputs have no symbolic dimension \"{}\"; they have {}{}",
                      jsonio::printable(name),
                      names.empty() ? std::string("none") : fmt::format("\"{}\"", fmt::join(names, "\", \"")),
                      suggestion(name, names)));
    }
    int64_t count = batchSize;
    if (value != kBatchSizeDimension) {
      const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), count);
      if (error != std::errc() || end != value.data() + value.size() || count < 1) {
        throw ConfigError(
            ErrorCode::InvalidModel, path,
            fmt::format("\"{}\" is neither \"batchSize\" nor a positive integer", jsonio::printable(value)));
      }
    }
    dimensions[name] = count;
  }
  return dimensions;
}

std::string describeInput(const Graph& graph, const std::string& name) {
  const TensorNode& node = graph.tensor(graph.find(name));
  return fmt::format("\"{}\" ({} [{}])", name, toString(node.dtype), fmt::join(node.shape, ", "));
}

// The graph input that `setting` (/model/images or /model/labels) names, or
// by default the only input of `dtype`.
std::string pickInput(const RunConfig& config, const RunModel& run, const std::string& setting,
                      const std::string& path, DType dtype, std::string_view role) {
  const Graph& graph = run.graph;
  std::vector<std::string> described;
  for (const std::string& input : run.inputs) described.push_back(describeInput(graph, input));
  const std::string inputs =
      described.empty() ? std::string("none") : fmt::format("{}", fmt::join(described, ", "));
  if (!setting.empty()) {
    if (std::find(run.inputs.begin(), run.inputs.end(), setting) == run.inputs.end()) {
      throw ConfigError(ErrorCode::InvalidModel, path,
                        fmt::format("{} has no input \"{}\"; its inputs are {}{}", config.model.path,
                                    jsonio::printable(setting), inputs, suggestion(setting, run.inputs)));
    }
    if (graph.tensor(graph.find(setting)).dtype != dtype) {
      throw ConfigError(ErrorCode::InvalidModel, path,
                        fmt::format("input {} of {} cannot hold {}: they are {}",
                                    describeInput(graph, setting), config.model.path, role, toString(dtype)));
    }
    return setting;
  }
  std::vector<std::string> candidates;
  for (const std::string& input : run.inputs)
    if (graph.tensor(graph.find(input)).dtype == dtype) candidates.push_back(input);
  if (candidates.size() != 1) {
    throw ConfigError(
        ErrorCode::InvalidModel, path,
        fmt::format("{} has {} {} inputs, so which one holds {} is not clear; its inputs are {}; "
                    "set {} to the name of one",
                    config.model.path, candidates.size(), toString(dtype), role, inputs, path));
  }
  return candidates.front();
}

// The images and labels inputs of an onnx model, where an IDX dataset feeds
// them or the test accuracy needs the labels.
void bindDataInputs(const RunConfig& config, RunModel& run) {
  const ModelConfig& model = config.model;
  const bool idx = config.data.dataset != DatasetKind::Tensors;
  if (idx || !model.images.empty())
    run.images = pickInput(config, run, model.images, "/model/images", model.dtype, "the images");
  if (idx || !model.labels.empty() || !model.logits.empty())
    run.labels = pickInput(config, run, model.labels, "/model/labels", DType::Int32, "the class labels");
  if (!run.labels.empty()) {
    const TensorNode& labels = run.graph.tensor(run.graph.find(run.labels));
    if (labels.shape.size() != 1) {
      throw ConfigError(
          ErrorCode::InvalidModel, "/model/labels",
          fmt::format("input {} of {} is not a batch of class labels: they have the shape [batch]",
                      describeInput(run.graph, run.labels), model.path));
    }
  }
  if (!idx) return;
  if (run.images == run.labels) {
    throw ConfigError(ErrorCode::InvalidModel, "/model/labels",
                      fmt::format("/model/images and /model/labels both name input \"{}\"", run.labels));
  }
  for (const std::string& input : run.inputs) {
    if (input == run.images || input == run.labels) continue;
    throw ConfigError(
        ErrorCode::InvalidData, "/data/dataset",
        fmt::format("the {} dataset feeds two inputs of {}, the images (\"{}\") and the labels (\"{}\"), "
                    "but the graph has input {} too; feed every input from a tensors dataset (a .safetensors "
                    "file with a tensor per graph input)",
                    toString(config.data.dataset), model.path, run.images, run.labels,
                    describeInput(run.graph, input)));
  }
}

// /model/logits: a graph output [batch, classes] whose argmax over the
// classes is added to the graph as the predictions.
void addPredictions(const RunConfig& config, const std::vector<std::string>& outputs, RunModel& run) {
  const ModelConfig& model = config.model;
  if (std::find(outputs.begin(), outputs.end(), model.logits) == outputs.end()) {
    throw ConfigError(ErrorCode::InvalidModel, "/model/logits",
                      fmt::format("{} has no output \"{}\"; its outputs are \"{}\"{}", model.path,
                                  jsonio::printable(model.logits), fmt::join(outputs, "\", \""),
                                  suggestion(model.logits, outputs)));
  }
  Graph& graph = run.graph;
  const TensorId logits = graph.find(model.logits);
  const TensorNode& node = graph.tensor(logits);
  const Shape& labels = graph.tensor(graph.find(run.labels)).shape;
  if (node.dtype != model.dtype || node.shape.size() != 2 || node.shape[0] != labels[0] ||
      node.shape[1] < 1) {
    throw ConfigError(
        ErrorCode::InvalidModel, "/model/logits",
        fmt::format(
            "output \"{}\" of {} is {} [{}]; logits are {} (the model's dtype) [batch, classes], one row "
            "per label of input \"{}\" [{}]",
            model.logits, model.path, toString(node.dtype), fmt::join(node.shape, ", "),
            toString(model.dtype), run.labels, fmt::join(labels, ", ")));
  }
  const Tensor predictions = ops::argmax(Tensor{&graph, logits});
  // With the model's ops placed on IPUs (__ipu_number), the predictions are
  // made where the logits are.
  if (const OpId producer = graph.tensor(logits).producer; producer != kNoOp)
    ops::virtualGraph(predictions, graph.op(producer).virtualGraph);
  run.predictions = predictions.node().name;
}

RunModel importModel(const RunConfig& config, int64_t batchSize, int64_t replicationFactor) {
  const ModelConfig& model = config.model;
  OnnxImportOptions options;
  options.replicationFactor = replicationFactor;
  options.dimensions = boundDimensions(model, batchSize);
  // /model/dtype float16 casts the float32 model on import.
  options.floatType = model.dtype;
  OnnxModel imported = importOnnx(model.path, options);

  std::string loss = model.loss;
  if (loss.empty()) {
    if (imported.outputs.size() != 1) {
      throw ConfigError(
          ErrorCode::InvalidModel, "/model/loss",
          fmt::format("{} has {} outputs (\"{}\"); set /model/loss to the name of the scalar loss",
                      model.path, imported.outputs.size(), fmt::join(imported.outputs, "\", \"")));
    }
    loss = imported.outputs.front();
  }
  const std::optional<TensorId> id = imported.graph.tryFind(loss);
  if (!id) {
    throw ConfigError(
        ErrorCode::InvalidModel, "/model/loss",
        fmt::format("{} has no tensor \"{}\"; its outputs are \"{}\"{}", model.path, jsonio::printable(loss),
                    fmt::join(imported.outputs, "\", \""), suggestion(loss, imported.outputs)));
  }
  const TensorNode& node = imported.graph.tensor(*id);
  if (!node.shape.empty() || node.dtype != DType::Float32) {
    throw ConfigError(ErrorCode::InvalidModel, "/model/loss",
                      fmt::format("tensor \"{}\" of {} is {} [{}]; a loss must be a float32 scalar{}", loss,
                                  model.path, toString(node.dtype), fmt::join(node.shape, ", "),
                                  model.dtype == DType::Float16 && node.shape.empty()
                                      ? " (with /model/dtype float16 the float inputs of "
                                        "SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss are cast to "
                                        "float32; a loss computed by other ops stays float16)"
                                      : ""));
  }
  RunModel run;
  run.loss = *id;
  run.inputs = std::move(imported.inputs);
  run.graph = std::move(imported.graph);
  run.onnxInitializers = std::move(imported.weights);
  run.onnxInitializers.insert(run.onnxInitializers.end(), imported.state.begin(), imported.state.end());
  bindDataInputs(config, run);
  if (!model.logits.empty()) addPredictions(config, imported.outputs, run);
  return run;
}

// The host streams' settings of /io on the model's inputs; a stream entry
// that names neither an input nor the loss is tessera.config.182.
RunModel withIo(const RunConfig& config, RunModel run) {
  const std::string& loss = run.graph.tensor(run.loss).name;
  std::vector<std::string_view> names(run.inputs.begin(), run.inputs.end());
  names.push_back(loss);
  for (const auto& entry : config.io.streams) {
    if (std::find(names.begin(), names.end(), entry.first) != names.end()) continue;
    const auto closest = jsonio::closestMatch(entry.first, names);
    throw ConfigError(ErrorCode::UnknownHostStream, jsonio::childPath("/io/streams", entry.first),
                      fmt::format("the model has no host stream \"{}\"{}; its streams are the inputs {} and the "
                                  "loss \"{}\"",
                                  jsonio::printable(entry.first),
                                  closest ? fmt::format(" (did you mean \"{}\"?)", *closest) : std::string(),
                                  jsonio::quotedList(std::span<const std::string_view>(names).first(names.size() - 1)),
                                  loss));
  }
  for (const std::string& name : run.inputs) {
    const IoStreamConfig settings = config.io.of(name);
    run.graph.tensor(run.graph.find(name)).inputSettings = {settings.tileSet, settings.exchangeStrategy};
  }
  return run;
}

RunModel buildModel(const RunConfig& config, int64_t batchSize, int64_t replicationFactor);

}  // namespace

RunModel buildRunModel(const RunConfig& config, int64_t batchSize, int64_t replicationFactor) {
  return withIo(config, buildModel(config, batchSize, replicationFactor));
}

DataFlow runDataFlow(const RunConfig& config, const RunModel& model) {
  const std::string& loss = model.graph.tensor(model.loss).name;
  const IoStreamConfig settings = config.io.of(loss);
  return DataFlow{config.data.batchesPerStep,
                  {{loss, {AnchorReturnTypeId::All, 0, settings.tileSet, settings.exchangeStrategy}}}};
}

namespace {

RunModel buildModel(const RunConfig& config, int64_t batchSize, int64_t replicationFactor) {
  if (config.model.type == kOnnxModel) return importModel(config, batchSize, replicationFactor);
  if (config.model.type == kTransformerModel) {
    TransformerGraph transformer =
        buildTransformer(config.model.transformer, batchSize, replicationFactor, config.data.seed, config.model.dtype);
    RunModel run;
    run.loss = transformer.loss;
    run.inputs = {transformer.graph.tensor(transformer.tokens).name,
                  transformer.graph.tensor(transformer.targets).name};
    run.graph = std::move(transformer.graph);
    return run;
  }
  MlpGraph mlp = buildMlp(config.model, batchSize, replicationFactor, config.data.seed);
  RunModel run;
  run.loss = mlp.loss;
  run.inputs = {mlp.graph.tensor(mlp.input).name, mlp.graph.tensor(mlp.labels).name};
  run.images = run.inputs[0];
  run.labels = run.inputs[1];
  run.predictions = mlp.graph.tensor(mlp.predictions).name;
  run.graph = std::move(mlp.graph);
  return run;
}

}  // namespace

}  // namespace tessera
