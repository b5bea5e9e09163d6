// Phased execution (SessionOptions::virtualGraphMode ExecutionPhases,
// SessionOptions::executionPhaseSettings), as PopART's execution phases.
//
// Phases. A forward op's phase is its OpNode::executionPhase
// (ops::executionPhase, an ONNX node's __execution_phase); when no op names
// one, the forward schedule is cut into `phases` contiguous parts of about
// equal memory, as virtualGraphMode Auto cuts it into IPUs
// (autoVirtualGraphs). Either every forward op names a phase or none does;
// each is below `phases`, and no forward op reads a value of a later phase.
// The backward ops of forward phase p run in phase 2 phases - 2 - p (PopART's
// rule): the last forward phase and its backward share phase phases - 1.
// Phase q runs on IPU q % stages, so a forward op and its backward run on
// the same IPU; a replica has `stages` IPUs.
//
// Three transforms, at three points of the compile pipeline:
//  - ExecutionPhasesTransform, after the virtual graph transform, checks or
//    assigns the forward phases and places each op on its phase's IPU. In any
//    other mode it clears the phases: they are read only in this mode.
//  - ExecutionPhaseBackwardTransform, after autodiff, renumbers the backward
//    ops (autodiff gives them the phase of their forward op).
//  - ExecutionPhaseFillTransform, last, gives a phase to the ops added since
//    (accumulation, optimizer, IpuCopy, remote loads and stores): the latest
//    phase of its inputs, else the earliest of its consumers.
//
// Where tensors live is the locations transform's (locations.hpp): a
// variable or activation whose location is OffChip is loaded in every phase
// that reads it (and a variable again for the optimizer's update, which runs
// after the phases; an activation read by the backward pass or by a later
// forward phase is stored after the op that makes it), and the load of phase
// p is scheduled after the ops of phase p - 2 (Preload: it may run during
// phase p - 1) or p - 1 (OnDemand), by its category's IO schedule; through the
// IO tiles the memory plan holds what it loads from there. The schedule of the computing ops is that of the
// run without phases: the numbers do not change.
#pragma once

#include <cstdint>

#include "tessera/lib/session_options.hpp"
#include "tessera/sessions/transform.hpp"

namespace tessera {

class ExecutionPhasesTransform final : public Transform {
 public:
  ExecutionPhasesTransform(const SessionOptions& options, int64_t ipusPerReplica)
      : options_(options), ipus_(ipusPerReplica) {}

  std::string_view name() const noexcept override { return "executionPhases"; }
  // Throws ConfigError(InvalidExecutionPhaseStages) when ipusPerReplica is
  // not stages; GraphError: ExecutionPhaseOutOfRange, PartialExecutionPhases,
  // ExecutionPhaseBackwards (a forward op reading a value of a later phase).
  void apply(Graph& graph) override;

 private:
  const SessionOptions& options_;
  int64_t ipus_;
};

class ExecutionPhaseBackwardTransform final : public Transform {
 public:
  ExecutionPhaseBackwardTransform(const SessionOptions& options, const TrainingTensors& tensors)
      : options_(options), tensors_(tensors) {}

  std::string_view name() const noexcept override { return "executionPhaseBackward"; }
  void apply(Graph& graph) override;

 private:
  const SessionOptions& options_;
  const TrainingTensors& tensors_;
};

class ExecutionPhaseFillTransform final : public Transform {
 public:
  explicit ExecutionPhaseFillTransform(const SessionOptions& options) : options_(options) {}

  std::string_view name() const noexcept override { return "executionPhaseFill"; }
  void apply(Graph& graph) override;

 private:
  const SessionOptions& options_;
};

// Whether `options` ask for phased execution.
inline bool phasedExecution(const SessionOptions& options) {
  return options.virtualGraphMode == VirtualGraphMode::ExecutionPhases &&
         options.executionPhaseSettings.phases >= 2;
}

}  // namespace tessera
