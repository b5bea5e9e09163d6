// Pipelining (SessionOptions::enablePipelining): the IPUs of a replica run
// the micro-batches of a step one behind the other, as PopART's pipeline.
//
// Stages. A forward op's stage is its OpNode::pipelineStage
// (ops::pipelineStage, an ONNX node's __pipeline_stage); when no op names
// one, its IPU (PopART's default). Either every forward op names a stage or
// none does; the ops of a stage run on one IPU; the stages are numbered 0,
// 1, ... and a later stage never runs on an earlier IPU, so stages that
// share an IPU are consecutive and are merged (as PopART merges them). With
// S forward stages (after merging) the backward ops of forward stage s run
// in stage 2 (S - 1) - s: the pipeline has 2 S - 1 stages, the last forward
// stage and its backward sharing stage S - 1 on the last IPU. In training,
// accumulationFactor must be at least 2 S - 1 (PopART's "depth must equal at
// least the number of pipeline stages"), so that the pipeline fills.
//
// Three transforms, at three points of the compile pipeline:
//  - PipelineStagesTransform, after the virtual graph transform, checks the
//    forward stages and numbers them 0 .. S-1 (one per IPU used, in IPU
//    order). With pipelining off it clears every stage: PopART ignores
//    them then.
//  - PipelineBackwardTransform, after autodiff, renumbers each backward op
//    (autodiff gives it the stage of its forward op) 2 (S - 1) - s.
//  - PipelineCycleTransform, last, gives a stage to the ops added since
//    (micro-batch slices, accumulation, IpuCopy): an IpuCopy the stage of
//    the value it copies, any other op the latest stage of its inputs, else
//    the earliest of its consumers.
//
// The schedule of the ops is that of the accumulation run: pipelining
// changes nothing in the numbers. The time model runs micro-batch m of
// stage p in cycle m + p (sim::pipelineSchedule), and the memory plan adds
// each IPU's stashes: an activation of micro-batch m made in forward stage
// s and read in its backward stage is kept for 2 (S - 1 - s) + 1
// micro-batches (PopART's stash size, restore stage - stash stage + 1),
// none on the last IPU.
#pragma once

#include <cstdint>

#include "tessera/lib/session_options.hpp"
#include "tessera/sessions/transform.hpp"

namespace tessera {

class PipelineStagesTransform final : public Transform {
 public:
  // `training`: the accumulation rule applies.
  PipelineStagesTransform(const SessionOptions& options, int64_t ipusPerReplica, bool training)
      : options_(options), ipus_(ipusPerReplica), training_(training) {}

  std::string_view name() const noexcept override { return "pipelineStages"; }
  // Throws ConfigError: PipeliningWithoutVirtualGraphs (mode Off or one IPU),
  // PartialPipelineStages, PipelineStageOnTwoIpus, PipelineStagesOutOfOrder,
  // PipeliningAccumulationTooLow; GraphError(PipelineStageBackwards) for a
  // forward op reading a value of a later stage.
  void apply(Graph& graph) override;

 private:
  const SessionOptions& options_;
  int64_t ipus_;
  bool training_;
};

class PipelineBackwardTransform final : public Transform {
 public:
  PipelineBackwardTransform(const SessionOptions& options, const TrainingTensors& tensors)
      : options_(options), tensors_(tensors) {}

  std::string_view name() const noexcept override { return "pipelineBackward"; }
  void apply(Graph& graph) override;

 private:
  const SessionOptions& options_;
  const TrainingTensors& tensors_;
};

class PipelineCycleTransform final : public Transform {
 public:
  explicit PipelineCycleTransform(const SessionOptions& options) : options_(options) {}

  std::string_view name() const noexcept override { return "pipelineCycles"; }
  void apply(Graph& graph) override;

 private:
  const SessionOptions& options_;
};

}  // namespace tessera
