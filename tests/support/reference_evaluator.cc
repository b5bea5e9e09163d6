#include "support/reference_evaluator.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>

#include <fmt/format.h>

#include "tessera/shard_layout.hpp"

namespace tessera::test {
namespace {

using Values = std::vector<double>;

[[noreturn]] void fail(const std::string& message) {
  throw std::invalid_argument("ReferenceEvaluator: " + message);
}

std::size_t count(const Shape& shape) { return static_cast<std::size_t>(numElements(shape)); }

std::vector<std::size_t> stridesOf(const Shape& shape) {
  std::vector<std::size_t> strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;)
    strides[d - 1] = strides[d] * static_cast<std::size_t>(shape[d]);
  return strides;
}

// The multi-index of flat index i in `shape`.
std::vector<int64_t> unravel(std::size_t i, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    const auto dim = static_cast<std::size_t>(shape[d]);
    index[d] = static_cast<int64_t>(i % dim);
    i /= dim;
  }
  return index;
}

// Flat index in `small` of element i of `big`, when `small` broadcasts to
// `big` (numpy rules: aligned right, size-1 dimensions repeat).
std::size_t broadcastSource(std::size_t i, const Shape& big, const Shape& small) {
  const std::vector<int64_t> index = unravel(i, big);
  const std::vector<std::size_t> strides = stridesOf(small);
  const std::size_t offset = big.size() - small.size();
  std::size_t flat = 0;
  for (std::size_t d = 0; d < small.size(); ++d)
    if (small[d] != 1) flat += static_cast<std::size_t>(index[offset + d]) * strides[d];
  return flat;
}

double geluOf(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

double geluDerivative(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  const double t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

// Softmax over rows of length c.
Values softmaxRows(const Values& x, std::size_t c) {
  Values out(x.size());
  for (std::size_t row = 0; row + c <= x.size() && c > 0; row += c) {
    double max = -std::numeric_limits<double>::infinity();
    for (std::size_t j = 0; j < c; ++j) max = std::max(max, x[row + j]);
    double sum = 0.0;
    for (std::size_t j = 0; j < c; ++j) sum += std::exp(x[row + j] - max);
    for (std::size_t j = 0; j < c; ++j) out[row + j] = std::exp(x[row + j] - max) / sum;
  }
  return out;
}

// Shard `shard` of `host` in ShardLayout(host.size(), shards): its real
// elements, then zeros up to shardElements.
Values shardOf(const Values& host, int64_t shards, int64_t shard) {
  const ShardLayout layout(static_cast<int64_t>(host.size()), shards);
  Values out(static_cast<std::size_t>(layout.shardElements()), 0.0);
  const auto begin = static_cast<std::size_t>(layout.hostOffset(shard));
  for (std::size_t j = 0; j < static_cast<std::size_t>(layout.realElements(shard)); ++j)
    out[j] = host[begin + j];
  return out;
}

// Writes shard `shard`'s real elements into their places in `host`.
void placeShard(const Values& shardValues, int64_t shards, int64_t shard, Values& host) {
  const ShardLayout layout(static_cast<int64_t>(host.size()), shards);
  const auto begin = static_cast<std::size_t>(layout.hostOffset(shard));
  for (std::size_t j = 0; j < static_cast<std::size_t>(layout.realElements(shard)); ++j)
    host[begin + j] = shardValues[j];
}

}  // namespace

ReferenceEvaluator::ReferenceEvaluator(const Graph& graph)
    : graph_(graph), replicas_(graph.replicationFactor()) {
  const auto r = static_cast<std::size_t>(replicas_);
  storage_.assign(r, std::vector<Values>(graph.tensors().size()));
  feeds_.assign(r, std::vector<Values>(graph.tensors().size()));
  buffers_.resize(r);
  for (auto& perReplica : buffers_) {
    for (const RemoteBufferInfo& info : graph.remoteBuffers()) {
      perReplica.emplace_back(static_cast<std::size_t>(info.entries), Values(count(info.shape), 0.0));
    }
  }
  for (const OpNode& op : graph.ops())
    if (op.kind == OpKind::Variable) initialiseVariable(op.outputs[0]);
}

void ReferenceEvaluator::initialiseVariable(TensorId t) {
  const TensorNode& node = graph_.tensor(t);
  const bool sharded = !node.metaShape.empty();
  const Shape& hostShape = sharded ? node.metaShape : node.shape;
  const std::size_t n = count(hostShape);
  const ReplicaGrouping grouping = node.grouping.value_or(ReplicaGrouping(replicas_));
  for (int64_t r = 0; r < replicas_; ++r) {
    const int64_t group = grouping.numGroups() > 1 ? grouping.groupAt(r) : 0;
    const auto first = node.data.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(group) * n);
    Values host(first, first + static_cast<std::ptrdiff_t>(n));
    Values value =
        sharded ? shardOf(host, node.shardCount, shardIndexAt(node, replicas_, r)) : host;
    if (node.remoteBuffer >= 0) {
      buffers_[static_cast<std::size_t>(r)][static_cast<std::size_t>(node.remoteBuffer)]
              [static_cast<std::size_t>(node.remoteEntry)] = value;
    }
    slot(t, r) = std::move(value);
  }
}

ReferenceEvaluator::Values& ReferenceEvaluator::slot(TensorId t, int64_t replica) {
  return storage_[static_cast<std::size_t>(replica)][static_cast<std::size_t>(graph_.storageOf(t))];
}

const std::vector<double>& ReferenceEvaluator::value(TensorId t, int64_t replica) const {
  if (replica < 0 || replica >= replicas_) fail(fmt::format("replica {} out of range", replica));
  return storage_[static_cast<std::size_t>(replica)][static_cast<std::size_t>(graph_.storageOf(t))];
}

double ReferenceEvaluator::sumOverReplicas(TensorId t) const {
  double sum = 0.0;
  for (int64_t r = 0; r < replicas_; ++r) sum += value(t, r).at(0);
  return sum;
}

std::vector<double>& ReferenceEvaluator::state(TensorId variable, int64_t replica) {
  if (graph_.op(graph_.tensor(variable).producer).kind != OpKind::Variable) {
    fail(fmt::format("\"{}\" is not a variable", graph_.tensor(variable).name));
  }
  return slot(variable, replica);
}

const std::vector<double>& ReferenceEvaluator::buffer(int64_t buffer, int64_t entry, int64_t replica) const {
  return buffers_.at(static_cast<std::size_t>(replica))
      .at(static_cast<std::size_t>(buffer))
      .at(static_cast<std::size_t>(entry));
}

void ReferenceEvaluator::feed(TensorId input, int64_t replica, std::vector<double> values) {
  const TensorNode& node = graph_.tensor(input);
  if (graph_.op(node.producer).kind != OpKind::Input) fail(fmt::format("\"{}\" is not an input", node.name));
  if (values.size() != count(node.shape)) {
    fail(fmt::format("input \"{}\" {} needs {} values, got {}", node.name, shapeStr(node.shape),
                     count(node.shape), values.size()));
  }
  if (replica < 0 || replica >= replicas_) fail(fmt::format("replica {} out of range", replica));
  feeds_[static_cast<std::size_t>(replica)][static_cast<std::size_t>(input)] = std::move(values);
}

void ReferenceEvaluator::feedAll(TensorId input, const std::vector<double>& values) {
  for (int64_t r = 0; r < replicas_; ++r) feed(input, r, values);
}

void ReferenceEvaluator::run() {
  for (OpId id : graph_.schedule()) {
    const OpNode& op = graph_.op(id);
    if (isCollective(op.kind)) {
      runCollective(op);
    } else {
      for (int64_t r = 0; r < replicas_; ++r) runOnReplica(op, r);
    }
  }
}

void ReferenceEvaluator::runCollective(const OpNode& op) {
  const OpAttributes& at = op.attributes;
  const ReplicaGrouping& grouping = at.grouping.value();
  const int64_t g = grouping.groupSize();
  const TensorId x = op.inputs[0];
  const TensorId y = op.outputs[0];
  for (int64_t group = 0; group < grouping.numGroups(); ++group) {
    const std::vector<int64_t> members = grouping.replicasAt(group);
    switch (op.kind) {
      case OpKind::ReplicatedAllReduce:
      case OpKind::ReplicatedReduceScatter: {
        // The reduction over the group's members.
        Values total(value(x, members[0]).size(), 0.0);
        for (int64_t m : members) {
          const Values& v = value(x, m);
          for (std::size_t i = 0; i < total.size(); ++i) total[i] += v[i];
        }
        if (at.reduction == ReductionType::Mean)
          for (double& v : total) v /= static_cast<double>(g);
        for (int64_t i = 0; i < g; ++i) {
          const int64_t m = members[static_cast<std::size_t>(i)];
          slot(y, m) = op.kind == OpKind::ReplicatedAllReduce ? total : shardOf(total, g, i);
        }
        break;
      }
      case OpKind::ReplicatedAllGather: {
        // Member i's input is shard i of the full value.
        Values full(count(graph_.tensor(y).shape), 0.0);
        for (int64_t i = 0; i < g; ++i)
          placeShard(value(x, members[static_cast<std::size_t>(i)]), g, i, full);
        for (int64_t m : members) slot(y, m) = full;
        break;
      }
      case OpKind::ReplicaShardedSlice:
        for (int64_t i = 0; i < g; ++i) {
          const int64_t m = members[static_cast<std::size_t>(i)];
          slot(y, m) = shardOf(value(x, m), g, i);
        }
        break;
      case OpKind::ReplicaShardedPad:
        for (int64_t i = 0; i < g; ++i) {
          const int64_t m = members[static_cast<std::size_t>(i)];
          Values full(count(graph_.tensor(y).shape), 0.0);
          placeShard(value(x, m), g, i, full);
          slot(y, m) = std::move(full);
        }
        break;
      default: fail(fmt::format("{} is not a collective", op.kind));
    }
  }
}

void ReferenceEvaluator::runOnReplica(const OpNode& op, int64_t r) {
  const OpAttributes& at = op.attributes;
  auto in = [&](std::size_t i) -> const Values& { return value(op.inputs[i], r); };
  auto inShape = [&](std::size_t i) -> const Shape& { return graph_.tensor(op.inputs[i]).shape; };
  const TensorId y = op.outputs.empty() ? kNoTensor : op.outputs[0];
  const Shape outShape = y == kNoTensor ? Shape{} : graph_.tensor(y).shape;
  Values out(y == kNoTensor ? 0 : count(outShape), 0.0);
  auto unary = [&](auto f) {
    const Values& x = in(0);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = f(x[i]);
  };
  auto binary = [&](auto f) {
    const Values& a = in(0);
    const Values& b = in(1);
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = f(a[broadcastSource(i, outShape, inShape(0))], b[broadcastSource(i, outShape, inShape(1))]);
  };

  switch (op.kind) {
    case OpKind::Input: {
      const Values& fed = feeds_[static_cast<std::size_t>(r)][static_cast<std::size_t>(y)];
      if (fed.size() != out.size()) {
        fail(fmt::format("input \"{}\" was not fed on replica {}", graph_.tensor(y).name, r));
      }
      out = fed;
      break;
    }
    case OpKind::Constant: {
      const std::vector<float>& data = graph_.tensor(y).data;
      out.assign(data.begin(), data.end());
      break;
    }
    case OpKind::Variable: return;  // its state lives in storage
    case OpKind::MatMul: {
      // [.., M, K] x [K, N]: every leading index is a separate matrix.
      const Values& a = in(0);
      const Values& b = in(1);
      const auto k = static_cast<std::size_t>(inShape(1)[0]);
      const auto n = static_cast<std::size_t>(inShape(1)[1]);
      const std::size_t rows = k == 0 ? out.size() / std::max<std::size_t>(n, 1) : a.size() / k;
      for (std::size_t row = 0; row < rows; ++row)
        for (std::size_t j = 0; j < n; ++j) {
          double sum = 0.0;
          for (std::size_t q = 0; q < k; ++q) sum += a[row * k + q] * b[q * n + j];
          out[row * n + j] = sum;
        }
      break;
    }
    case OpKind::Add: binary([](double a, double b) { return a + b; }); break;
    case OpKind::Sub: binary([](double a, double b) { return a - b; }); break;
    case OpKind::Mul: binary([](double a, double b) { return a * b; }); break;
    case OpKind::Div: binary([](double a, double b) { return a / b; }); break;
    case OpKind::Neg: unary([](double x) { return -x; }); break;
    case OpKind::Relu: unary([](double x) { return x > 0.0 ? x : 0.0; }); break;
    case OpKind::Gelu: unary(geluOf); break;
    case OpKind::Tanh: unary([](double x) { return std::tanh(x); }); break;
    case OpKind::Sigmoid: unary([](double x) { return 1.0 / (1.0 + std::exp(-x)); }); break;
    case OpKind::Exp: unary([](double x) { return std::exp(x); }); break;
    case OpKind::Log: unary([](double x) { return std::log(x); }); break;
    case OpKind::Sqrt: unary([](double x) { return std::sqrt(x); }); break;
    case OpKind::Softmax: out = softmaxRows(in(0), static_cast<std::size_t>(inShape(0).back())); break;
    case OpKind::LogSoftmax: {
      out = softmaxRows(in(0), static_cast<std::size_t>(inShape(0).back()));
      for (double& v : out) v = std::log(v);
      break;
    }
    case OpKind::SoftmaxCrossEntropy:
    case OpKind::SoftmaxCrossEntropyGrad: {
      // loss = -sum_n log softmax(logits)[n, label_n] (divided by N for Mean);
      // its gradient is (softmax - onehot(label)) * dloss (divided by N for Mean).
      const bool grad = op.kind == OpKind::SoftmaxCrossEntropyGrad;
      const std::size_t base = grad ? 1 : 0;
      const Values& logits = in(base);
      const Values& labels = in(base + 1);
      const auto rows = static_cast<std::size_t>(inShape(base)[0]);
      const auto classes = static_cast<std::size_t>(inShape(base)[1]);
      const Values p = softmaxRows(logits, classes);
      const double scale =
          at.reduction == ReductionType::Mean && rows > 0 ? 1.0 / static_cast<double>(rows) : 1.0;
      double loss = 0.0;
      if (grad) out = p;
      for (std::size_t n = 0; n < rows; ++n) {
        const double label = labels[n];
        if (label < 0 || label >= static_cast<double>(classes)) {
          fail(fmt::format("label {} of row {} is outside [0, {})", label, n, classes));
        }
        const std::size_t cell = n * classes + static_cast<std::size_t>(label);
        loss -= std::log(p[cell]);
        if (grad) out[cell] -= 1.0;
      }
      if (grad) {
        const double dloss = in(0)[0];
        for (double& v : out) v *= dloss * scale;
      } else {
        out[0] = loss * scale;
      }
      break;
    }
    case OpKind::ReduceSum:
    case OpKind::ReduceMean: {
      // Input element i adds into the output element with the reduced axes
      // set to 0 (keepDims and not keepDims share one flat layout).
      const Shape& xShape = inShape(0);
      Shape kept = xShape;
      for (std::size_t d = 0; d < kept.size(); ++d)
        if (at.axes.empty() ||
            std::find(at.axes.begin(), at.axes.end(), static_cast<int64_t>(d)) != at.axes.end())
          kept[d] = 1;
      const Values& x = in(0);
      for (std::size_t i = 0; i < x.size(); ++i) out[broadcastSource(i, xShape, kept)] += x[i];
      if (op.kind == OpKind::ReduceMean && !out.empty() && !x.empty()) {
        const double per = static_cast<double>(x.size()) / static_cast<double>(out.size());
        for (double& v : out) v /= per;
      }
      break;
    }
    case OpKind::Reshape:
    case OpKind::Copy: out = in(0); break;
    case OpKind::Transpose: {
      // Output axis k is input axis perm[k].
      const std::vector<std::size_t> inStrides = stridesOf(inShape(0));
      for (std::size_t i = 0; i < out.size(); ++i) {
        const std::vector<int64_t> index = unravel(i, outShape);
        std::size_t src = 0;
        for (std::size_t k = 0; k < index.size(); ++k)
          src += static_cast<std::size_t>(index[k]) * inStrides[static_cast<std::size_t>(at.axes[k])];
        out[i] = in(0)[src];
      }
      break;
    }
    case OpKind::Slice:
    case OpKind::SlicePad: {
      // The slice's element j sits at j + starts in the full tensor.
      const bool pad = op.kind == OpKind::SlicePad;
      const Shape& full = pad ? outShape : inShape(0);
      const Shape& part = pad ? inShape(0) : outShape;
      const std::vector<std::size_t> fullStrides = stridesOf(full);
      for (std::size_t j = 0; j < count(part); ++j) {
        const std::vector<int64_t> index = unravel(j, part);
        std::size_t f = 0;
        for (std::size_t d = 0; d < index.size(); ++d)
          f += static_cast<std::size_t>(index[d] + at.starts[d]) * fullStrides[d];
        if (pad) {
          out[f] = in(0)[j];
        } else {
          out[j] = in(0)[f];
        }
      }
      break;
    }
    case OpKind::Concat: {
      const auto axis = static_cast<std::size_t>(at.axis);
      const std::vector<std::size_t> outStrides = stridesOf(outShape);
      int64_t offset = 0;
      for (std::size_t t = 0; t < op.inputs.size(); ++t) {
        for (std::size_t j = 0; j < in(t).size(); ++j) {
          std::vector<int64_t> index = unravel(j, inShape(t));
          index[axis] += offset;
          std::size_t f = 0;
          for (std::size_t d = 0; d < index.size(); ++d)
            f += static_cast<std::size_t>(index[d]) * outStrides[d];
          out[f] = in(t)[j];
        }
        offset += inShape(t)[axis];
      }
      break;
    }
    case OpKind::BroadcastTo:
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = in(0)[broadcastSource(i, outShape, inShape(0))];
      break;
    case OpKind::ReduceToShape:
      for (std::size_t i = 0; i < in(0).size(); ++i)
        out[broadcastSource(i, inShape(0), outShape)] += in(0)[i];
      break;
    case OpKind::ScaledAddInplace: {
      // Writes x's storage, which the output shares.
      const Values& x = in(0);
      const Values& b = in(1);
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = at.a * x[i] + at.b * b[broadcastSource(i, outShape, inShape(1))];
      break;
    }
    case OpKind::CopyInplace: out = in(1); break;
    case OpKind::ArgMax: {
      const auto c = static_cast<std::size_t>(inShape(0).back());
      for (std::size_t row = 0; row < out.size(); ++row) {
        std::size_t best = 0;
        for (std::size_t j = 1; j < c; ++j)
          if (in(0)[row * c + j] > in(0)[row * c + best]) best = j;
        out[row] = static_cast<double>(best);
      }
      break;
    }
    case OpKind::ReluGrad: binary([](double dy, double x) { return x > 0.0 ? dy : 0.0; }); break;
    case OpKind::GeluGrad: binary([](double dy, double x) { return dy * geluDerivative(x); }); break;
    case OpKind::RemoteLoad: out = buffer(at.remoteBuffer, at.entry, r); break;
    case OpKind::RemoteStore:
      buffers_[static_cast<std::size_t>(r)][static_cast<std::size_t>(at.remoteBuffer)]
              [static_cast<std::size_t>(at.entry)] = in(0);
      return;
    case OpKind::ReplicatedAllReduce:
    case OpKind::ReplicatedReduceScatter:
    case OpKind::ReplicatedAllGather:
    case OpKind::ReplicaShardedSlice:
    case OpKind::ReplicaShardedPad: fail("collectives run over all replicas at once");
  }
  slot(y, r) = std::move(out);
}

}  // namespace tessera::test
