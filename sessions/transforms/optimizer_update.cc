#include "optimizer_update.hpp"

#include <fmt/format.h>

#include "tessera/lib/error.hpp"

namespace tessera {

void OptimizerUpdateTransform::apply(Graph& graph) {
  if (tensors_.gradients.size() != tensors_.weights.size()) {
    throw GraphError(ErrorCode::InvalidOperand, "gradients",
                     fmt::format("{} weights but {} gradients; run autodiff before the optimizer update",
                                 tensors_.weights.size(), tensors_.gradients.size()));
  }
  std::vector<GradientPair> pairs;
  pairs.reserve(tensors_.weights.size());
  for (std::size_t k = 0; k < tensors_.weights.size(); ++k) {
    pairs.push_back({tensors_.weights[k], tensors_.gradients[k]});
  }
  optimizer_.addUpdates(graph, pairs, GradientScaling{tensors_.lossScale, automatic_});
}

}  // namespace tessera
