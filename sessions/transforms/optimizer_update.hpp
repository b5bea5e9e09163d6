// The optimizer update transform: appends the optimizer's update of every
// trainable weight, consuming the gradients the earlier transforms left.
#pragma once

#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/transform.hpp"

namespace tessera {

class OptimizerUpdateTransform final : public Transform {
 public:
  // The gradients are unscaled by tensors.lossScale; `automatic` says how
  // the scale is adjusted.
  OptimizerUpdateTransform(Optimizer& optimizer, TrainingTensors& tensors,
                           const AutomaticLossScalingSettings& automatic)
      : optimizer_(optimizer), tensors_(tensors), automatic_(automatic) {}

  std::string_view name() const noexcept override { return "optimizerUpdate"; }
  // Throws GraphError(InvalidOperand) when autodiff has not run, and what
  // Optimizer::addUpdates throws.
  void apply(Graph& graph) override;

 private:
  Optimizer& optimizer_;
  TrainingTensors& tensors_;
  AutomaticLossScalingSettings automatic_;
};

}  // namespace tessera
