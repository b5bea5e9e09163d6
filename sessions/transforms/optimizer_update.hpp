// The optimizer update transform: appends the optimizer's update of every
// trainable weight, consuming the gradients the earlier transforms left.
#pragma once

#include "tessera/optimizer.hpp"
#include "tessera/transform.hpp"

namespace tessera {

class OptimizerUpdateTransform final : public Transform {
 public:
  OptimizerUpdateTransform(Optimizer& optimizer, TrainingTensors& tensors)
      : optimizer_(optimizer), tensors_(tensors) {}

  std::string_view name() const noexcept override { return "optimizerUpdate"; }
  // Throws GraphError(InvalidOperand) when autodiff has not run, and what
  // Optimizer::addUpdates throws.
  void apply(Graph& graph) override;

 private:
  Optimizer& optimizer_;
  TrainingTensors& tensors_;
};

}  // namespace tessera
