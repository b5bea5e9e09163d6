// The training compile pipeline: the one place that lists the transforms a
// training graph goes through, in order.
//
//   virtualGraph → pipelineStages → executionPhases → weightSharding →
//   autodiff → pipelineBackward → executionPhaseBackward → recompute →
//   gradientAccumulation → replication → optimizerUpdate → locations →
//   ipuCopy → pipelineCycles → executionPhaseFill
//
// and the inference one: virtualGraph → pipelineStages → executionPhases →
// weightSharding → locations → ipuCopy → executionPhaseFill. `ipusPerReplica` is DeviceSpec::ipusPerReplica.
//
// Gradients are accumulated before they are reduced over replicas, so each
// step all-reduces every gradient once rather than once per micro-batch,
// and the update consumes the reduced accumulator. Every transform is in the
// list whatever the options; one whose option is off changes nothing.
#pragma once

#include <memory>
#include <vector>

#include "tessera/optimizer.hpp"
#include "tessera/session_options.hpp"
#include "tessera/transform.hpp"

namespace tessera {

// The transforms in order. They keep references to `optimizer` and
// `tensors`, which must outlive them; `tensors` describes the graph they are
// applied to.
std::vector<std::unique_ptr<Transform>> buildTrainingPipeline(const SessionOptions& options,
                                                              Optimizer& optimizer, TrainingTensors& tensors,
                                                              int64_t ipusPerReplica = 1);

std::vector<std::unique_ptr<Transform>> buildInferencePipeline(const SessionOptions& options,
                                                               int64_t ipusPerReplica = 1);
void runInferencePipeline(Graph& graph, const SessionOptions& options, int64_t ipusPerReplica = 1);

// Builds the pipeline for training.tensors and runs it on training.graph
// with runTransform (errors name the transform).
void runTrainingPipeline(TrainingGraph& training, const SessionOptions& options, Optimizer& optimizer,
                         int64_t ipusPerReplica = 1);

}  // namespace tessera
