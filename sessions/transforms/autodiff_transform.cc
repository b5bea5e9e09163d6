#include "autodiff_transform.hpp"

#include "tessera/lib/autodiff.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"

namespace tessera {

void AutodiffTransform::apply(Graph& graph) {
  if (tensors_.loss == kNoTensor) {
    throw GraphError(ErrorCode::UnknownTensor, "loss",
                     "no loss tensor was given; set TrainingTensors::loss to the per-replica loss");
  }
  if (tensors_.weights.empty()) {
    for (const OpNode& op : graph.ops()) {
      if (op.kind != OpKind::Variable) continue;
      const TensorNode& node = graph.tensor(op.outputs.front());
      if (node.category == TensorCategory::Weight && isFloating(node.dtype)) {
        tensors_.weights.push_back(op.outputs.front());
      }
    }
  }
  tensors_.firstBackwardOp = static_cast<OpId>(graph.ops().size());
  std::vector<Tensor> wrt;
  wrt.reserve(tensors_.weights.size());
  for (TensorId w : tensors_.weights) wrt.emplace_back(&graph, w);
  // Without loss scaling autodiff seeds the gradient with 1 itself.
  Tensor seed;
  if (automatic_) {
    seed = ops::variable(graph, std::string(kLossScaleTensor), {static_cast<float>(lossScaling_)}, {},
                         std::nullopt, RetrievalMode::OnePerGroup, TensorCategory::OptimizerState);
  } else if (lossScaling_ != 1.0) {
    seed = ops::constant(graph, graph.uniqueName(graph.tensor(tensors_.loss).name + ".grad"),
                         {static_cast<float>(lossScaling_)}, {});
  }
  tensors_.lossScale = seed.valid() ? seed.id() : kNoTensor;
  tensors_.gradients.clear();
  for (const Tensor& gradient : autodiff(graph, Tensor{&graph, tensors_.loss}, wrt, seed)) {
    tensors_.gradients.push_back(gradient.id());
  }
}

}  // namespace tessera
