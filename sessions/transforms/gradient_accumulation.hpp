// The gradient accumulation transform (PopART's enableGradientAccumulation).
//
// With accumulation factor af > 1 every input takes af micro-batches,
// [af, ...micro-batch shape], and the forward and backward passes are
// unrolled af times, each on its micro-batch (a slice of the inputs). Only
// the ops that depend on input data are unrolled; the rest (variables,
// weight-only computations) stays once. The schedule is flat: micro-batch
// i+1 starts after micro-batch i has finished, so the activations of one
// micro-batch are dead before the next is computed and the memory peak is
// that of one micro-batch.
//
// Each gradient is accumulated into a variable "<weight>.accum" of category
// Accumulator, shaped, grouped and sharded like its weight. The first
// micro-batch overwrites it (so it starts from zero every step); the others
// are combined per accumulationAndReplicationReductionType:
//   Sum           acc = acc + g
//   Mean, Post    acc = acc + g, then acc = acc / af once after the last
//   Mean, Running acc = i/(i+1) acc + g/(i+1) for micro-batch i (0-based)
// The update then consumes the accumulator. The loss becomes one value per
// micro-batch: shape [af].
//
// The rebuilt graph names the micro-batch copies of a tensor "<name>.mb<i>";
// inputs, variables, the loss and everything computed once keep their names.
#pragma once

#include <cstdint>

#include "tessera/lib/session_options.hpp"
#include "tessera/sessions/transform.hpp"

namespace tessera {

class GradientAccumulationTransform final : public Transform {
 public:
  // Throws ConfigError(AccumulationDisabledButFactor) as
  // SessionOptions::getAccumulationFactor() does.
  // Accumulators of float16 weights have `accumType` (the optimizer's).
  GradientAccumulationTransform(const SessionOptions& options, TrainingTensors& tensors,
                                DType accumType = DType::Float32);

  std::string_view name() const noexcept override { return "gradientAccumulation"; }
  int64_t factor() const noexcept { return factor_; }
  // Replaces `graph` by the unrolled graph and updates the training tensors;
  // does nothing for a factor of 1. Throws GraphError(InvalidOperand) when
  // autodiff has not run (no gradients).
  void apply(Graph& graph) override;

 private:
  const SessionOptions& options_;
  int64_t factor_;
  ReductionType reduction_;
  MeanReductionStrategy strategy_;
  TrainingTensors& tensors_;
  DType accumType_;
};

}  // namespace tessera
