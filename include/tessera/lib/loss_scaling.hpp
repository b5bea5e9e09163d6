// Loss scaling: the gradient of the loss is seeded with a scale S instead of
// 1, so that small gradients stay representable (in float16), and every
// gradient is divided by S again (in float32) before the optimizer uses it.
//
// The initial scale is the optimizer's `lossScaling` (SgdOptions,
// AdamOptions; PopART's name). Static scaling keeps it. Automatic scaling
// (SessionOptions::automaticLossScalingSettings) keeps S in a variable of the
// program and, after every weight update step:
//   - checks that every gradient the optimizer consumes is finite, agreed
//     over every replica and instance;
//   - on an overflow skips the step (weights and optimizer state keep their
//     values exactly), multiplies S by backoffFactor (not below minLossScale)
//     and restarts the count of clean steps;
//   - after updatePeriod clean steps in a row multiplies S by growthFactor
//     (not above maxLossScale) and restarts the count.
// The state lives in float32 scalar variables of category OptimizerState,
// the same on every replica, named below; checkpoints keep them like any
// optimizer state.
#pragma once

#include <cstdint>
#include <string_view>

namespace tessera {

// The current loss scale.
inline constexpr std::string_view kLossScaleTensor = "lossScaling.scale";
// Clean steps since the scale last changed (or since the last overflow).
inline constexpr std::string_view kLossScaleCleanStepsTensor = "lossScaling.cleanSteps";
// Steps skipped because of an overflow, since the start of training.
inline constexpr std::string_view kLossScaleSkippedStepsTensor = "lossScaling.skippedSteps";

// PopART's name; the dynamic-scaling knobs of a user who wants to tune it.
struct AutomaticLossScalingSettings {
  // Adjust the loss scale during training and skip the steps whose
  // gradients overflow. Off: the optimizer's lossScaling stays fixed and an
  // overflow reaches the weights.
  bool enabled = false;
  // Clean steps in a row before the scale grows. Must be >= 1.
  int64_t updatePeriod = 2000;
  // The scale is multiplied by growthFactor after updatePeriod clean steps.
  // Must be > 1.
  double growthFactor = 2.0;
  // The scale is multiplied by backoffFactor after an overflow. Must be in
  // (0, 1).
  double backoffFactor = 0.5;
  // The scale never goes below minLossScale (> 0) nor above maxLossScale
  // (>= minLossScale); the optimizer's lossScaling, the initial scale, must
  // lie between them.
  double minLossScale = 1.0;
  double maxLossScale = 16777216.0;  // 2^24

  bool operator==(const AutomaticLossScalingSettings&) const = default;
};

}  // namespace tessera
