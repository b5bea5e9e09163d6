// The model of a run config's "model" section as a plain training graph: the
// MLP builder's, the transformer builder's, or the ONNX model imported with
// its symbolic dimensions bound. train(), planRun() and explain build it the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/sessions/data_flow.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/app/run_config.hpp"

namespace tessera {

struct RunModel {
  Graph graph;
  TensorId loss = kNoTensor;
  // The host input streams, in the model's order.
  std::vector<std::string> inputs;
  // The input an IDX dataset's images feed; empty for an onnx model trained
  // on a tensors dataset without /model/images.
  std::string images;
  // The input of the class labels; empty for an onnx model that needs none
  // (a tensors dataset, no /model/labels or /model/logits).
  std::string labels;
  // The int32 argmax of the logits, whose agreement with `labels` is the test
  // accuracy: the mlp's, or the one added to an onnx graph for
  // /model/logits; empty when there is none (a transformer).
  std::string predictions;
  // onnx: the initializers that are variables (the weights, and the running
  // statistics of BatchNormalization), in the model's order: what
  // /output/onnx writes back.
  std::vector<std::string> onnxInitializers;
};

// The model of `config` with per-replica micro-batch `batchSize` for a graph
// of `replicationFactor` replicas. For onnx: the first axis of every input
// is bound to batchSize unless /model/dimensions names it, the other
// symbolic dimensions from /model/dimensions; the loss is /model/loss or the
// graph's only output. The images and labels inputs are bound as
// /model/images and /model/labels say (by default the only float32 and the
// only integer input) when an IDX dataset feeds the model or accuracy needs
// them. Throws ConfigError(InvalidModel) at the JSON path of the setting
// that does not fit the model, ConfigError(InvalidData) at /data/dataset
// when an IDX dataset cannot feed every input, and the importer's errors.
// The inputs take their host stream settings from /io (a /io/streams entry
// naming no input or loss is ConfigError(UnknownHostStream)).
RunModel buildRunModel(const RunConfig& config, int64_t batchSize, int64_t replicationFactor);

// The data flow of a run: /data/batchesPerStep batches, the loss returned
// for every batch ("All") with its /io settings.
DataFlow runDataFlow(const RunConfig& config, const RunModel& model);

}  // namespace tessera
