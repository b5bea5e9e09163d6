// Graph transforms: the steps of a session's compile pipeline.
//
// A transform rewrites a graph with the same public ops a user can write by
// hand (ops.hpp). Transforms are plain objects run in an explicit order; the
// training pipeline (sessions/training_pipeline.cc) is the one place that
// fixes that order. Nothing registers itself.
//
// The training transforms also need to know which tensors are the loss, the
// trainable weights and their gradients: they share a TrainingTensors, given
// to their constructors, and keep it up to date as they rewrite the graph.
#pragma once

#include <string_view>
#include <vector>

#include "tessera/lib/graph.hpp"

namespace tessera {

class Transform {
 public:
  virtual ~Transform() = default;
  // A short camelCase name ("autodiff", "replication", ...) that the errors
  // of the transform start with.
  virtual std::string_view name() const noexcept = 0;
  // Rewrites `graph`; a transform may replace it by a rebuilt graph.
  virtual void apply(Graph& graph) = 0;
};

// What the training transforms know about a training graph besides its ops.
// Ids refer to the graph the transforms are applied to.
struct TrainingTensors {
  // The per-replica loss: a float32 scalar; one value per micro-batch
  // ([accumulationFactor]) after gradient accumulation.
  TensorId loss = kNoTensor;
  // The trainable weights. Empty: every float32 or float16 variable of
  // category Weight, filled in by autodiff.
  std::vector<TensorId> weights{};
  // gradients[i] is what the update of weights[i] consumes: the gradient,
  // then its accumulator, then its all-reduced value.
  std::vector<TensorId> gradients{};
  // The float32 scalar the loss gradient was seeded with (loss scaling, set
  // by autodiff); kNoTensor: 1, the gradients are not scaled.
  TensorId lossScale = kNoTensor;
  // The first op autodiff created: the ops before it are the forward pass,
  // the ops from it on the backward pass (kNoOp before autodiff). The
  // recomputation transform reads it.
  OpId firstBackwardOp = kNoOp;
};

// A graph with its training tensors.
struct TrainingGraph {
  Graph graph;
  TrainingTensors tensors{};
};

// transform.apply(graph); a tessera error thrown inside is rethrown with the
// same type, code and subject and "<transform name>: " in front of its
// message, so that every error says which transform reported it.
void runTransform(Transform& transform, Graph& graph);

}  // namespace tessera
