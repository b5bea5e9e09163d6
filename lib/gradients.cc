// One gradient rule per OpKind, written with the public ops so that every
// gradient is an ordinary graph a transform or a test can inspect.
#include "gradients.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "tessera/error.hpp"
#include "tessera/ops.hpp"

namespace tessera {
namespace {

// dy summed back to `shape` when a broadcast made it larger.
Tensor reduceTo(Tensor dy, Shape shape) {
  if (dy.shape() == shape) return dy;
  Graph& graph = dy.graph();
  OpAttributes attributes;
  attributes.shape = std::move(shape);
  return {&graph, graph.op(graph.addOp(OpKind::ReduceToShape, {dy.id()}, attributes)).outputs[0]};
}

Tensor scaled(Tensor t, double factor) {
  if (factor == 1.0) return t;
  return ops::mul(t, ops::scalar(t.graph(), factor));
}

}  // namespace

bool hasGradient(OpKind kind) noexcept {
  switch (kind) {
    case OpKind::ArgMax:
    case OpKind::ReluGrad:
    case OpKind::GeluGrad:
    case OpKind::SoftmaxCrossEntropyGrad:
    case OpKind::RemoteLoad:
    case OpKind::RemoteStore: return false;
    default: return true;
  }
}

std::vector<TensorId> gradientOf(Graph& graph, OpId opId, std::span<const TensorId> outputGradients,
                                 std::span<const char> wanted) {
  // A copy: adding ops below may reallocate the op list.
  const OpNode op = graph.op(opId);
  const OpAttributes& at = op.attributes;
  auto in = [&](std::size_t i) { return Tensor{&graph, op.inputs[i]}; };
  auto out = [&](std::size_t i) { return Tensor{&graph, op.outputs[i]}; };
  auto isWanted = [&](std::size_t i) { return wanted.empty() || wanted[i] != 0; };
  auto make = [&](OpKind kind, std::vector<TensorId> inputs, OpAttributes attributes) {
    return Tensor{&graph, graph.op(graph.addOp(kind, std::move(inputs), std::move(attributes))).outputs[0]};
  };
  auto noGradient = [&]() -> std::vector<TensorId> {
    throw AutodiffError(ErrorCode::NoGradient, op.name,
                        fmt::format("op \"{}\" ({}) has no gradient rule", op.name, op.kind));
  };
  if (outputGradients.empty() || outputGradients[0] == kNoTensor) {
    return std::vector<TensorId>(op.inputs.size(), kNoTensor);
  }
  const Tensor dy{&graph, outputGradients[0]};
  using R = std::vector<Tensor>;
  R g;
  switch (op.kind) {
    case OpKind::Input:
    case OpKind::Variable:
    case OpKind::Constant: return {};

    case OpKind::MatMul: {
      const Tensor a = in(0);
      const Tensor b = in(1);
      const int64_t k = b.shape()[0];
      const int64_t n = b.shape()[1];
      // Each gradient is a GEMM as large as the forward product: build only the wanted ones.
      g = R{Tensor{}, Tensor{}};
      if (isWanted(0)) g[0] = ops::matmul(dy, ops::transpose(b));
      if (isWanted(1)) {
        const Tensor a2 = a.shape().size() == 2 ? a : ops::reshape(a, {-1, k});
        const Tensor dy2 = dy.shape().size() == 2 ? dy : ops::reshape(dy, {-1, n});
        g[1] = ops::matmul(ops::transpose(a2), dy2);
      }
      break;
    }
    case OpKind::Add: g = R{reduceTo(dy, in(0).shape()), reduceTo(dy, in(1).shape())}; break;
    case OpKind::Sub: g = R{reduceTo(dy, in(0).shape()), reduceTo(ops::neg(dy), in(1).shape())}; break;
    case OpKind::Mul:
      g = R{reduceTo(ops::mul(dy, in(1)), in(0).shape()), reduceTo(ops::mul(dy, in(0)), in(1).shape())};
      break;
    case OpKind::Div:
      // d(a/b)/db = -(a/b)/b, with a/b the output.
      g = R{reduceTo(ops::div(dy, in(1)), in(0).shape()),
            reduceTo(ops::neg(ops::div(ops::mul(dy, out(0)), in(1))), in(1).shape())};
      break;
    case OpKind::Neg: g = R{ops::neg(dy)}; break;
    case OpKind::Relu: g = R{make(OpKind::ReluGrad, {dy.id(), in(0).id()}, {})}; break;
    case OpKind::Gelu: g = R{make(OpKind::GeluGrad, {dy.id(), in(0).id()}, {})}; break;
    case OpKind::Tanh: g = R{ops::sub(dy, ops::mul(ops::mul(dy, out(0)), out(0)))}; break;
    case OpKind::Sigmoid: g = R{ops::mul(dy, ops::sub(out(0), ops::mul(out(0), out(0))))}; break;
    case OpKind::Exp: g = R{ops::mul(dy, out(0))}; break;
    case OpKind::Log: g = R{ops::div(dy, in(0))}; break;
    case OpKind::Sqrt: g = R{ops::div(scaled(dy, 0.5), out(0))}; break;
    case OpKind::Softmax:
      g = R{ops::mul(out(0), ops::sub(dy, ops::reduceSum(ops::mul(dy, out(0)), {-1}, true)))};
      break;
    case OpKind::LogSoftmax:
      g = R{ops::sub(dy, ops::mul(ops::exp(out(0)), ops::reduceSum(dy, {-1}, true)))};
      break;
    case OpKind::SoftmaxCrossEntropy: {
      OpAttributes attributes;
      attributes.reduction = at.reduction;
      g = R{make(OpKind::SoftmaxCrossEntropyGrad, {dy.id(), in(0).id(), in(1).id()}, attributes), Tensor{}};
      break;
    }
    case OpKind::ReduceSum:
    case OpKind::ReduceMean: {
      const Shape xShape = in(0).shape();
      Shape kept = xShape;
      for (std::size_t d = 0; d < kept.size(); ++d) {
        const bool reduced = at.axes.empty() || std::find(at.axes.begin(), at.axes.end(),
                                                          static_cast<int64_t>(d)) != at.axes.end();
        if (reduced) kept[d] = 1;
      }
      Tensor spread = ops::broadcastTo(dy.shape() == kept ? dy : ops::reshape(dy, kept), xShape);
      if (op.kind == OpKind::ReduceMean) {
        const int64_t outElements = numElements(kept);
        if (outElements > 0 && numElements(xShape) > 0) {
          spread =
              scaled(spread, static_cast<double>(outElements) / static_cast<double>(numElements(xShape)));
        }
      }
      g = R{spread};
      break;
    }
    case OpKind::Reshape: g = R{ops::reshape(dy, in(0).shape())}; break;
    case OpKind::Transpose: {
      std::vector<int64_t> inverse(at.axes.size());
      for (std::size_t i = 0; i < at.axes.size(); ++i)
        inverse[static_cast<std::size_t>(at.axes[i])] = static_cast<int64_t>(i);
      g = R{ops::transpose(dy, inverse)};
      break;
    }
    case OpKind::Slice: {
      OpAttributes attributes;
      attributes.starts = at.starts;
      attributes.ends = at.ends;
      attributes.shape = in(0).shape();
      g = R{make(OpKind::SlicePad, {dy.id()}, attributes)};
      break;
    }
    case OpKind::SlicePad: g = R{ops::slice(dy, at.starts, at.ends)}; break;
    case OpKind::Concat: {
      const auto axis = static_cast<std::size_t>(at.axis);
      std::vector<int64_t> starts(dy.shape().size(), 0);
      std::vector<int64_t> ends = dy.shape();
      for (std::size_t i = 0; i < op.inputs.size(); ++i) {
        ends[axis] = starts[axis] + in(i).shape()[axis];
        g.push_back(ops::slice(dy, starts, ends));
        starts[axis] = ends[axis];
      }
      break;
    }
    case OpKind::BroadcastTo: g = R{reduceTo(dy, in(0).shape())}; break;
    case OpKind::ReduceToShape: g = R{ops::broadcastTo(dy, in(0).shape())}; break;
    case OpKind::ScaledAddInplace: g = R{scaled(dy, at.a), reduceTo(scaled(dy, at.b), in(1).shape())}; break;
    case OpKind::Copy: g = R{dy}; break;
    case OpKind::CopyInplace: g = R{Tensor{}, dy}; break;

    // The global loss is the sum of the replicas' losses, so a collective's
    // gradient sends each replica's dy back along the same groups.
    case OpKind::ReplicatedAllReduce: g = R{ops::replicatedAllReduce(dy, at.reduction, at.grouping)}; break;
    case OpKind::ReplicatedReduceScatter: {
      Tensor gathered = ops::replicatedAllGather(dy, at.grouping, in(0).shape());
      if (at.reduction == ReductionType::Mean)
        gathered = scaled(gathered, 1.0 / static_cast<double>(at.grouping->groupSize()));
      g = R{gathered};
      break;
    }
    case OpKind::ReplicatedAllGather:
      g = R{ops::replicatedReduceScatter(dy, ReductionType::Sum, at.grouping)};
      break;
    case OpKind::ReplicaShardedSlice: {
      OpAttributes attributes;
      attributes.grouping = at.grouping;
      attributes.shape = in(0).shape();
      g = R{make(OpKind::ReplicaShardedPad, {dy.id()}, attributes)};
      break;
    }
    case OpKind::ReplicaShardedPad: g = R{ops::replicaShardedSlice(dy, at.grouping)}; break;

    case OpKind::ArgMax:
    case OpKind::ReluGrad:
    case OpKind::GeluGrad:
    case OpKind::SoftmaxCrossEntropyGrad:
    case OpKind::RemoteLoad:
    case OpKind::RemoteStore: return noGradient();
  }
  std::vector<TensorId> ids;
  ids.reserve(g.size());
  for (const Tensor& t : g) ids.push_back(t.valid() ? t.id() : kNoTensor);
  return ids;
}

}  // namespace tessera
