#include "training_pipeline.hpp"

#include "transforms/autodiff_transform.hpp"
#include "transforms/execution_phases.hpp"
#include "transforms/gradient_accumulation.hpp"
#include "transforms/locations.hpp"
#include "transforms/optimizer_update.hpp"
#include "transforms/pipeline.hpp"
#include "transforms/recompute.hpp"
#include "transforms/replication.hpp"
#include "transforms/virtual_graph.hpp"

namespace tessera {

std::vector<std::unique_ptr<Transform>> buildTrainingPipeline(const SessionOptions& options,
                                                              Optimizer& optimizer, TrainingTensors& tensors,
                                                              const ReplicaTopology& topology) {
  const int64_t ipusPerReplica = topology.ipusPerReplica;
  std::vector<std::unique_ptr<Transform>> pipeline;
  pipeline.push_back(std::make_unique<VirtualGraphTransform>(options.virtualGraphMode, ipusPerReplica));
  pipeline.push_back(std::make_unique<PipelineStagesTransform>(options, ipusPerReplica, true));
  pipeline.push_back(std::make_unique<ExecutionPhasesTransform>(options, ipusPerReplica));
  pipeline.push_back(std::make_unique<WeightShardingTransform>(options, &tensors));
  pipeline.push_back(std::make_unique<AutodiffTransform>(tensors, optimizer.lossScaling(),
                                                         options.automaticLossScalingSettings.enabled));
  pipeline.push_back(std::make_unique<PipelineBackwardTransform>(options, tensors));
  pipeline.push_back(std::make_unique<ExecutionPhaseBackwardTransform>(options, tensors));
  pipeline.push_back(std::make_unique<RecomputeTransform>(options.autoRecomputation, tensors));
  pipeline.push_back(
      std::make_unique<GradientAccumulationTransform>(options, tensors, optimizer.accumType()));
  pipeline.push_back(std::make_unique<ReplicationTransform>(options, topology, tensors));
  pipeline.push_back(
      std::make_unique<OptimizerUpdateTransform>(optimizer, tensors, options.automaticLossScalingSettings));
  pipeline.push_back(std::make_unique<LocationTransform>(options, &tensors));
  pipeline.push_back(std::make_unique<IpuCopyTransform>(options.virtualGraphMode, &tensors));
  pipeline.push_back(std::make_unique<PipelineCycleTransform>(options));
  pipeline.push_back(std::make_unique<ExecutionPhaseFillTransform>(options));
  return pipeline;
}

std::vector<std::unique_ptr<Transform>> buildTrainingPipeline(const SessionOptions& options,
                                                              Optimizer& optimizer,
                                                              TrainingTensors& tensors) {
  return buildTrainingPipeline(options, optimizer, tensors, ReplicaTopology::fromOptions(options));
}

std::vector<std::unique_ptr<Transform>> buildInferencePipeline(const SessionOptions& options,
                                                               const ReplicaTopology& topology) {
  const int64_t ipusPerReplica = topology.ipusPerReplica;
  std::vector<std::unique_ptr<Transform>> pipeline;
  pipeline.push_back(std::make_unique<VirtualGraphTransform>(options.virtualGraphMode, ipusPerReplica));
  pipeline.push_back(std::make_unique<PipelineStagesTransform>(options, ipusPerReplica, false));
  pipeline.push_back(std::make_unique<ExecutionPhasesTransform>(options, ipusPerReplica));
  pipeline.push_back(std::make_unique<WeightShardingTransform>(options, nullptr));
  pipeline.push_back(std::make_unique<LocationTransform>(options, nullptr));
  pipeline.push_back(std::make_unique<IpuCopyTransform>(options.virtualGraphMode, nullptr));
  pipeline.push_back(std::make_unique<ExecutionPhaseFillTransform>(options));
  return pipeline;
}

std::vector<std::unique_ptr<Transform>> buildInferencePipeline(const SessionOptions& options) {
  return buildInferencePipeline(options, ReplicaTopology::fromOptions(options));
}

void runInferencePipeline(Graph& graph, const SessionOptions& options, const ReplicaTopology& topology) {
  for (const auto& transform : buildInferencePipeline(options, topology)) runTransform(*transform, graph);
}

void runInferencePipeline(Graph& graph, const SessionOptions& options) {
  runInferencePipeline(graph, options, ReplicaTopology::fromOptions(options));
}

void runTrainingPipeline(TrainingGraph& training, const SessionOptions& options, Optimizer& optimizer,
                         const ReplicaTopology& topology) {
  checkLossScaling(optimizer.lossScaling(), options.automaticLossScalingSettings);
  for (const auto& transform : buildTrainingPipeline(options, optimizer, training.tensors, topology)) {
    runTransform(*transform, training.graph);
  }
  optimizer.rebindHyperParameters(training.graph);
}

void runTrainingPipeline(TrainingGraph& training, const SessionOptions& options, Optimizer& optimizer) {
  runTrainingPipeline(training, options, optimizer, ReplicaTopology::fromOptions(options));
}

}  // namespace tessera
