// The recomputation transform: forward ops whose outputs are not kept for
// the backward pass are cloned into it (PopART's implicit recomputation).
//
// Which forward ops are recomputed: the ops marked RecomputeType::Recompute
// (ops::recomputeOutputInBackwardPass, an ONNX node's
// __recompute_output_in_backward_pass), plus the ops
// SessionOptions::autoRecomputation chooses among those left Undefined:
//  - Standard: the forward schedule is cut into about sqrt(n) intervals; in
//    each, the point where the fewest activation bytes are live (counting
//    forward consumers only) is a checkpoint: the ops live there keep their
//    outputs. Every other forward op is recomputed.
//  - NormOnly: the normalisation ops (OpNode::normalisation) are recomputed,
//    every other op is a checkpoint.
//  - RecomputeAll: every forward op is recomputed, then, as in PopART, the
//    segment that ends at the loss is made checkpoints again, walking back
//    from the loss until an op that is not recomputed: without pipeline
//    stages or checkpoints marked by hand the whole forward pass is that
//    segment, and nothing is recomputed.
//  - Pipeline (with pipelining only): every forward op of a pipeline stage
//    but the last is recomputed in that stage's backward pass, from the
//    stage's inputs: the outputs a forward op of another stage reads are
//    checkpoints, and they are all the pipeline stashes for the stage. The
//    last forward stage runs its backward pass in the same cycle and keeps
//    its outputs. Without pipeline stages the type is refused, as PopART
//    refuses it.
// Ops that cannot be recomputed (sources, in-place, remote and collective
// ops, and ops reading storage that an in-place op modifies) always keep
// their outputs.
//
// The forward pass runs as before. Every backward op that reads the output
// of a recomputed op reads a clone instead ("<name>.recomputed", its op
// marked Recomputed), made just before the first backward op that needs it
// from the nearest kept values; clones are shared by the later backward ops.
// The graph is rebuilt so that creation order is the new program order: the
// memory plan sees the forward activations die at their last forward
// consumer and the clones live only while their backward consumers run; the
// time model charges the clones as any op. With pipelining or phased
// execution a clone runs in the pipeline stage and execution phase of the
// backward op that first reads it, on that op's IPU (the backward stage or
// phase of the op it repeats when its own backward op reads it), so the
// pipeline stashes what the clones read (the cycle and phase fills would
// otherwise give it its inputs' forward stage or phase). The clones compute the same values from the same inputs,
// so training gives the same bits.
#pragma once

#include "tessera/lib/session_options.hpp"
#include "tessera/sessions/transform.hpp"

namespace tessera {

class RecomputeTransform final : public Transform {
 public:
  RecomputeTransform(RecomputationType type, TrainingTensors& tensors) : type_(type), tensors_(tensors) {}

  std::string_view name() const noexcept override { return "recompute"; }
  // Runs after autodiff (tensors.firstBackwardOp) and before gradient
  // accumulation. Throws ConfigError(RecomputationNeedsPipelining) for
  // Pipeline when the forward ops have no pipeline stages.
  void apply(Graph& graph) override;

 private:
  RecomputationType type_;
  TrainingTensors& tensors_;
};

// The ops of `graph` (forward ops before `firstBackwardOp`, on a path to
// `loss`) that the recomputation transform recomputes under `type`.
// Exposed for tests and for explain.
std::vector<bool> recomputedOps(const Graph& graph, TensorId loss, OpId firstBackwardOp,
                                RecomputationType type);

}  // namespace tessera
