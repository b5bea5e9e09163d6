#include "run_model.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "json_reader.hpp"
#include "tessera/error.hpp"
#include "tessera/mlp.hpp"
#include "tessera/onnx.hpp"
#include "tessera/transformer.hpp"

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

RunModel importModel(const RunConfig& config, int64_t batchSize, int64_t replicationFactor) {
  const ModelConfig& model = config.model;
  OnnxImportOptions options;
  options.replicationFactor = replicationFactor;
  options.dimensions = boundDimensions(model, batchSize);
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
                      fmt::format("tensor \"{}\" of {} is {} [{}]; a loss must be a float32 scalar", loss,
                                  model.path, toString(node.dtype), fmt::join(node.shape, ", ")));
  }
  RunModel run;
  run.loss = *id;
  run.inputs = std::move(imported.inputs);
  run.graph = std::move(imported.graph);
  return run;
}

}  // namespace

RunModel buildRunModel(const RunConfig& config, int64_t batchSize, int64_t replicationFactor) {
  if (config.model.type == kOnnxModel) return importModel(config, batchSize, replicationFactor);
  if (config.model.type == kTransformerModel) {
    TransformerGraph transformer =
        buildTransformer(config.model.transformer, batchSize, replicationFactor, config.data.seed);
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
  run.predictions = mlp.graph.tensor(mlp.predictions).name;
  run.graph = std::move(mlp.graph);
  return run;
}

}  // namespace tessera
