// The autodiff transform: gradients of the loss for every trainable weight.
#pragma once

#include "tessera/transform.hpp"

namespace tessera {

class AutodiffTransform final : public Transform {
 public:
  explicit AutodiffTransform(TrainingTensors& tensors) : tensors_(tensors) {}

  std::string_view name() const noexcept override { return "autodiff"; }
  // Fills tensors.weights when empty (every float32 Weight variable, in
  // creation order) and sets tensors.gradients to "<weight>.grad". Throws
  // GraphError(UnknownTensor) when no loss was given, AutodiffError as
  // autodiff() does.
  void apply(Graph& graph) override;

 private:
  TrainingTensors& tensors_;
};

}  // namespace tessera
