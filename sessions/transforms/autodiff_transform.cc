#include "autodiff_transform.hpp"

#include "tessera/autodiff.hpp"
#include "tessera/error.hpp"
#include "tessera/ops.hpp"

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
      if (node.category == TensorCategory::Weight && node.dtype == DType::Float32) {
        tensors_.weights.push_back(op.outputs.front());
      }
    }
  }
  std::vector<Tensor> wrt;
  wrt.reserve(tensors_.weights.size());
  for (TensorId w : tensors_.weights) wrt.emplace_back(&graph, w);
  tensors_.gradients.clear();
  for (const Tensor& gradient : autodiff(graph, Tensor{&graph, tensors_.loss}, wrt)) {
    tensors_.gradients.push_back(gradient.id());
  }
}

}  // namespace tessera
