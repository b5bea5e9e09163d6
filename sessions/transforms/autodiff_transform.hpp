// The autodiff transform: gradients of the loss for every trainable weight.
#pragma once

#include "tessera/lib/loss_scaling.hpp"
#include "tessera/sessions/transform.hpp"

namespace tessera {

class AutodiffTransform final : public Transform {
 public:
  // `lossScaling` seeds the loss gradient: a constant, or with automatic
  // loss scaling the variable kLossScaleTensor it initialises.
  AutodiffTransform(TrainingTensors& tensors, double lossScaling, bool automaticLossScaling)
      : tensors_(tensors), lossScaling_(lossScaling), automatic_(automaticLossScaling) {}

  std::string_view name() const noexcept override { return "autodiff"; }
  // Fills tensors.weights when empty (every float32 Weight variable, in
  // creation order) and sets tensors.gradients to "<weight>.grad", and
  // tensors.lossScale to the seed when the loss is scaled. Throws
  // GraphError(UnknownTensor) when no loss was given,
  // GraphError(DuplicateTensorName) when the graph already has a tensor named
  // kLossScaleTensor, AutodiffError as autodiff() does.
  void apply(Graph& graph) override;

 private:
  TrainingTensors& tensors_;
  double lossScaling_;
  bool automatic_;
};

}  // namespace tessera
