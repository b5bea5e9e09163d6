// The training compile pipeline: the one place that lists the transforms a
// training graph goes through, in order.
//
//   virtualGraph → pipelineStages → executionPhases → weightSharding →
//   autodiff → pipelineBackward → executionPhaseBackward → recompute →
//   gradientAccumulation → replication → optimizerUpdate → locations →
//   ipuCopy → pipelineCycles → executionPhaseFill
//
// and the inference one: virtualGraph → pipelineStages → executionPhases →
// weightSharding → locations → ipuCopy → executionPhaseFill. `topology` is
// the session's replica topology (ReplicaTopology::fromOptions), whose
// global count the graph was checked against (checkReplicationFactor);
// without it, the options' topology with one IPU per replica.
//
// Gradients are accumulated before they are reduced over replicas, so each
// step all-reduces every gradient once rather than once per micro-batch,
// and the update consumes the reduced accumulator. Every transform is in the
// list whatever the options; one whose option is off changes nothing.
#pragma once

#include <memory>
#include <vector>

#include "tessera/optimizers/optimizer.hpp"
#include "tessera/lib/replica_topology.hpp"
#include "tessera/lib/session_options.hpp"
#include "tessera/sessions/transform.hpp"

namespace tessera {

// The transforms in order. They keep references to `optimizer` and
// `tensors`, which must outlive them; `tensors` describes the graph they are
// applied to.
std::vector<std::unique_ptr<Transform>> buildTrainingPipeline(const SessionOptions& options,
                                                              Optimizer& optimizer, TrainingTensors& tensors,
                                                              const ReplicaTopology& topology);
std::vector<std::unique_ptr<Transform>> buildTrainingPipeline(const SessionOptions& options,
                                                              Optimizer& optimizer, TrainingTensors& tensors);

std::vector<std::unique_ptr<Transform>> buildInferencePipeline(const SessionOptions& options,
                                                               const ReplicaTopology& topology);
std::vector<std::unique_ptr<Transform>> buildInferencePipeline(const SessionOptions& options);
void runInferencePipeline(Graph& graph, const SessionOptions& options, const ReplicaTopology& topology);
void runInferencePipeline(Graph& graph, const SessionOptions& options);

// Builds the pipeline for training.tensors and runs it on training.graph
// with runTransform (errors name the transform).
void runTrainingPipeline(TrainingGraph& training, const SessionOptions& options, Optimizer& optimizer,
                         const ReplicaTopology& topology);
void runTrainingPipeline(TrainingGraph& training, const SessionOptions& options, Optimizer& optimizer);

}  // namespace tessera
