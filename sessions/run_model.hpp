// The model of a run config's "model" section as a plain training graph: the
// MLP builder's, the transformer builder's, or the ONNX model imported with
// its symbolic dimensions bound. train(), planRun() and explain build it the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/graph.hpp"
#include "tessera/run_config.hpp"

namespace tessera {

struct RunModel {
  Graph graph;
  TensorId loss = kNoTensor;
  // The host input streams, in the model's order.
  std::vector<std::string> inputs;
  // mlp: the int32 argmax of the logits, whose agreement with the "labels"
  // input is the test accuracy; empty for a model without one (onnx,
  // transformer).
  std::string predictions;
};

// The model of `config` with per-replica micro-batch `batchSize` for a graph
// of `replicationFactor` replicas. For onnx: the first axis of every input
// is bound to batchSize unless /model/dimensions names it, the other
// symbolic dimensions from /model/dimensions; the loss is /model/loss or the
// graph's only output. Throws ConfigError(InvalidModel) at the JSON path of
// the setting that does not fit the model, and the importer's errors.
RunModel buildRunModel(const RunConfig& config, int64_t batchSize, int64_t replicationFactor);

}  // namespace tessera
