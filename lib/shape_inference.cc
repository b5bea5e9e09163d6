#include "shape_inference.hpp"

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/error.hpp"

namespace tessera {
namespace {

int64_t ceilDiv(int64_t a, int64_t b) { return a == 0 ? 0 : (a - 1) / b + 1; }

// The checks of one op, with the op's name as the subject of every error.
class Checker {
 public:
  Checker(const Graph& graph, OpKind kind, std::span<const TensorId> inputs, std::string_view opName)
      : graph_(graph), kind_(kind), inputs_(inputs), opName_(opName) {}

  [[noreturn]] void fail(ErrorCode code, std::string_view message) const {
    throw GraphError(code, std::string(opName_), fmt::format("{}: {}", kind_, message));
  }

  const TensorNode& in(std::size_t i) const { return graph_.tensor(inputs_[i]); }
  const Shape& shape(std::size_t i) const { return in(i).shape; }
  int64_t rank(std::size_t i) const { return static_cast<int64_t>(shape(i).size()); }
  std::string desc(std::size_t i) const { return describeTensor(graph_, inputs_[i]); }

  void arity(std::size_t expected) const {
    if (inputs_.size() != expected) {
      fail(ErrorCode::InvalidOperand, fmt::format("takes {} input(s), found {}", expected, inputs_.size()));
    }
  }
  void dtype(std::size_t i, DType expected) const {
    if (in(i).dtype != expected) {
      fail(ErrorCode::InvalidOperand, fmt::format("input {} {} must be {}", i, desc(i), expected));
    }
  }
  void minRank(std::size_t i, int64_t r) const {
    if (rank(i) < r) {
      fail(ErrorCode::ShapeMismatch, fmt::format("input {} {} must have rank >= {}", i, desc(i), r));
    }
  }
  void sameShape(std::size_t i, std::size_t j) const {
    if (shape(i) != shape(j)) {
      fail(ErrorCode::ShapeMismatch,
           fmt::format("inputs {} and {} must have the same shape, found {} and {}", i, j, desc(i), desc(j)));
    }
  }
  int64_t axis(int64_t axis, int64_t r) const {
    const int64_t normal = axis < 0 ? axis + r : axis;
    if (normal < 0 || normal >= r) {
      fail(ErrorCode::InvalidAxis,
           fmt::format("axis {} is out of range for rank {}; allowed are {}..{}", axis, r, -r, r - 1));
    }
    return normal;
  }
  ReplicaGrouping grouping(OpAttributes& attributes) const {
    const int64_t replicas = graph_.replicationFactor();
    if (!attributes.grouping) attributes.grouping = ReplicaGrouping(replicas);
    if (attributes.grouping->numReplicas() != replicas) {
      fail(ErrorCode::InvalidCollective,
           fmt::format(
               "the grouping {} is over {} replicas but the graph's replication factor is {}; make the "
               "grouping with numReplicas {}",
               attributes.grouping->str(), attributes.grouping->numReplicas(), replicas, replicas));
    }
    return *attributes.grouping;
  }
  // A 1-D shard [s] of a full shape over g shards must have s = ceil(n/g).
  void shardFits(const Shape& full, int64_t groupSize) const {
    const int64_t expected = ceilDiv(numElements(full), groupSize);
    if (rank(0) != 1 || shape(0)[0] != expected) {
      fail(ErrorCode::InvalidCollective,
           fmt::format(
               "input {} is not a shard of {} over a group of {}: a shard has shape [{}] (ceil({}/{}))",
               desc(0), shapeStr(full), groupSize, expected, numElements(full), groupSize));
    }
  }

 private:
  const Graph& graph_;
  OpKind kind_;
  std::span<const TensorId> inputs_;
  std::string_view opName_;
};

Shape reducedShape(const Shape& in, const std::vector<int64_t>& axes, bool keepDims) {
  Shape out;
  for (std::size_t d = 0; d < in.size(); ++d) {
    const bool reduced =
        axes.empty() || std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
    if (!reduced) {
      out.push_back(in[d]);
    } else if (keepDims) {
      out.push_back(1);
    }
  }
  return out;
}

// True when `from` broadcasts to exactly `to` (numpy rules).
bool broadcastsTo(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const std::size_t offset = to.size() - from.size();
  for (std::size_t i = 0; i < from.size(); ++i)
    if (from[i] != 1 && from[i] != to[offset + i]) return false;
  return true;
}

}  // namespace

std::optional<Shape> broadcastShapes(const Shape& a, const Shape& b) {
  const std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::string describeTensor(const Graph& graph, TensorId t) {
  const TensorNode& node = graph.tensor(t);
  return fmt::format("\"{}\" {} {}", node.name, shapeStr(node.shape), node.dtype);
}

std::vector<OutputSpec> inferOutputs(const Graph& graph, OpKind kind, std::span<const TensorId> inputs,
                                     OpAttributes& attributes, std::string_view opName) {
  const Checker c(graph, kind, inputs, opName);
  auto same = [&](std::size_t i) { return std::vector<OutputSpec>{{c.shape(i), c.in(i).dtype, {}}}; };
  switch (kind) {
    case OpKind::Input:
    case OpKind::Variable:
    case OpKind::Constant: c.fail(ErrorCode::InvalidOperand, "sources are added with Graph::addSource");

    case OpKind::MatMul: {
      c.arity(2);
      c.dtype(0, DType::Float32);
      c.dtype(1, DType::Float32);
      c.minRank(0, 2);
      if (c.rank(1) != 2 || c.shape(0).back() != c.shape(1)[0]) {
        c.fail(
            ErrorCode::ShapeMismatch,
            fmt::format("{} x {}: the right operand must be [K, N] with K equal to the left operand's last "
                        "dimension",
                        c.desc(0), c.desc(1)));
      }
      Shape out = c.shape(0);
      out.back() = c.shape(1)[1];
      return {{out, DType::Float32, {}}};
    }
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Div: {
      // Int32 arithmetic (counters, the seed's `v += 1`) is exact; Div stays float.
      c.arity(2);
      if (kind == OpKind::Div) c.dtype(0, DType::Float32);
      c.dtype(1, c.in(0).dtype);
      auto out = broadcastShapes(c.shape(0), c.shape(1));
      if (!out) {
        c.fail(ErrorCode::ShapeMismatch,
               fmt::format("{} and {} do not broadcast (numpy rules: aligned from the right, each pair of "
                           "dimensions equal or one of them 1)",
                           c.desc(0), c.desc(1)));
      }
      // A shard combined with a scalar (or another shard) is still a shard
      // of the same tensor.
      Shape meta = c.shape(0) == *out ? c.in(0).metaShape : Shape{};
      if (meta.empty() && c.shape(1) == *out) meta = c.in(1).metaShape;
      return {{*out, c.in(0).dtype, std::move(meta)}};
    }
    case OpKind::Neg:
    case OpKind::Relu:
    case OpKind::Gelu:
    case OpKind::Tanh:
    case OpKind::Sigmoid:
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Sqrt:
      c.arity(1);
      c.dtype(0, DType::Float32);
      return {{c.shape(0), DType::Float32, c.in(0).metaShape}};
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
      c.arity(1);
      c.dtype(0, DType::Float32);
      c.minRank(0, 1);
      return same(0);
    case OpKind::SoftmaxCrossEntropy: {
      c.arity(2);
      c.dtype(0, DType::Float32);
      c.dtype(1, DType::Int32);
      if (c.rank(0) != 2 || c.rank(1) != 1 || c.shape(1)[0] != c.shape(0)[0]) {
        c.fail(ErrorCode::ShapeMismatch,
               fmt::format("logits {} and labels {}: expected logits [N, C] and labels [N]", c.desc(0),
                           c.desc(1)));
      }
      return {{Shape{}, DType::Float32, {}}};
    }
    case OpKind::ReduceSum:
    case OpKind::ReduceMean: {
      c.arity(1);
      c.dtype(0, DType::Float32);
      std::vector<int64_t> axes;
      for (int64_t a : attributes.axes) {
        const int64_t normal = c.axis(a, c.rank(0));
        if (std::find(axes.begin(), axes.end(), normal) != axes.end()) {
          c.fail(ErrorCode::InvalidAxis, fmt::format("axis {} of {} is listed twice", a, c.desc(0)));
        }
        axes.push_back(normal);
      }
      std::sort(axes.begin(), axes.end());
      attributes.axes = axes;
      return {{reducedShape(c.shape(0), axes, attributes.keepDims), DType::Float32, {}}};
    }
    case OpKind::Reshape: {
      c.arity(1);
      Shape target = attributes.shape;
      int64_t known = 1;
      std::optional<std::size_t> inferred;
      for (std::size_t i = 0; i < target.size(); ++i) {
        if (target[i] == -1 && !inferred) {
          inferred = i;
        } else if (target[i] < 0) {
          c.fail(ErrorCode::ShapeMismatch,
                 fmt::format("target shape {} may hold one -1 and otherwise dimensions "
                             ">= 0",
                             shapeStr(target)));
        } else {
          known *= target[i];
        }
      }
      const int64_t n = numElements(c.shape(0));
      if (inferred && known > 0 && n % known == 0) target[*inferred] = n / known;
      if (std::any_of(target.begin(), target.end(), [](int64_t d) { return d < 0; }) ||
          numElements(target) != n) {
        c.fail(ErrorCode::ShapeMismatch, fmt::format("cannot reshape {} ({} elements) to {}", c.desc(0), n,
                                                     shapeStr(attributes.shape)));
      }
      attributes.shape = target;
      return {{target, c.in(0).dtype, {}}};
    }
    case OpKind::Transpose: {
      c.arity(1);
      const int64_t r = c.rank(0);
      if (attributes.axes.empty()) {
        for (int64_t i = r - 1; i >= 0; --i) attributes.axes.push_back(i);
      }
      std::vector<int64_t> perm;
      for (int64_t a : attributes.axes) perm.push_back(c.axis(a, r));
      std::vector<int64_t> sorted = perm;
      std::sort(sorted.begin(), sorted.end());
      bool isPermutation = static_cast<int64_t>(perm.size()) == r;
      for (int64_t i = 0; isPermutation && i < r; ++i)
        isPermutation = sorted[static_cast<std::size_t>(i)] == i;
      if (!isPermutation) {
        c.fail(ErrorCode::InvalidAxis, fmt::format("[{}] is not a permutation of the {} axes of {}",
                                                   fmt::join(attributes.axes, ", "), r, c.desc(0)));
      }
      attributes.axes = perm;
      Shape out;
      for (int64_t a : perm) out.push_back(c.shape(0)[static_cast<std::size_t>(a)]);
      return {{out, c.in(0).dtype, {}}};
    }
    case OpKind::Slice:
    case OpKind::SlicePad: {
      c.arity(1);
      const Shape full = kind == OpKind::Slice ? c.shape(0) : attributes.shape;
      const std::size_t r = full.size();
      if (attributes.starts.size() != r || attributes.ends.size() != r) {
        c.fail(ErrorCode::InvalidAxis, fmt::format("starts [{}] and ends [{}] need one entry per axis of {}",
                                                   fmt::join(attributes.starts, ", "),
                                                   fmt::join(attributes.ends, ", "), shapeStr(full)));
      }
      Shape part(r);
      for (std::size_t i = 0; i < r; ++i) {
        const int64_t s = attributes.starts[i];
        const int64_t e = attributes.ends[i];
        if (s < 0 || s > e || e > full[i]) {
          c.fail(ErrorCode::InvalidAxis, fmt::format("axis {}: [{}, {}) is not within [0, {}] of {}", i, s, e,
                                                     full[i], shapeStr(full)));
        }
        part[i] = e - s;
      }
      if (kind == OpKind::Slice) return {{part, c.in(0).dtype, {}}};
      if (c.shape(0) != part) {
        c.fail(ErrorCode::ShapeMismatch,
               fmt::format("input {} must have the slice's shape {}", c.desc(0), shapeStr(part)));
      }
      return {{full, c.in(0).dtype, {}}};
    }
    case OpKind::Concat: {
      if (inputs.empty()) c.fail(ErrorCode::InvalidOperand, "needs at least one input");
      const int64_t axis = c.axis(attributes.axis, c.rank(0));
      attributes.axis = axis;
      Shape out = c.shape(0);
      for (std::size_t i = 1; i < inputs.size(); ++i) {
        bool fits = c.rank(i) == c.rank(0) && c.in(i).dtype == c.in(0).dtype;
        for (std::size_t d = 0; fits && d < out.size(); ++d)
          fits = static_cast<int64_t>(d) == axis || c.shape(i)[d] == out[d];
        if (!fits) {
          c.fail(
              ErrorCode::ShapeMismatch,
              fmt::format("input {} {} does not match input 0 {}: all inputs need the same dtype, rank and "
                          "dimensions except axis {}",
                          i, c.desc(i), c.desc(0), axis));
        }
        out[static_cast<std::size_t>(axis)] += c.shape(i)[static_cast<std::size_t>(axis)];
      }
      return {{out, c.in(0).dtype, {}}};
    }
    case OpKind::BroadcastTo:
    case OpKind::ReduceToShape: {
      c.arity(1);
      c.dtype(0, DType::Float32);
      const bool ok = kind == OpKind::BroadcastTo ? broadcastsTo(c.shape(0), attributes.shape)
                                                  : broadcastsTo(attributes.shape, c.shape(0));
      if (!ok) {
        c.fail(ErrorCode::ShapeMismatch,
               kind == OpKind::BroadcastTo
                   ? fmt::format("{} does not broadcast to {}", c.desc(0), shapeStr(attributes.shape))
                   : fmt::format("{} is not a broadcast of {}", c.desc(0), shapeStr(attributes.shape)));
      }
      numElements(attributes.shape);
      return {{attributes.shape, DType::Float32, {}}};
    }
    case OpKind::ScaledAddInplace: {
      c.arity(2);
      c.dtype(1, c.in(0).dtype);
      if (!broadcastsTo(c.shape(1), c.shape(0))) {
        c.fail(ErrorCode::ShapeMismatch,
               fmt::format("y {} must broadcast to the shape of the modified x {}", c.desc(1), c.desc(0)));
      }
      return {{c.shape(0), c.in(0).dtype, c.in(0).metaShape}};
    }
    case OpKind::Copy: c.arity(1); return {{c.shape(0), c.in(0).dtype, c.in(0).metaShape}};
    case OpKind::CopyInplace:
      c.arity(2);
      c.sameShape(0, 1);
      c.dtype(1, c.in(0).dtype);
      return {{c.shape(0), c.in(0).dtype, c.in(0).metaShape}};
    case OpKind::ArgMax: {
      c.arity(1);
      c.dtype(0, DType::Float32);
      c.minRank(0, 1);
      Shape out = c.shape(0);
      out.pop_back();
      return {{out, DType::Int32, {}}};
    }
    case OpKind::ReluGrad:
    case OpKind::GeluGrad:
      c.arity(2);
      c.dtype(0, DType::Float32);
      c.dtype(1, DType::Float32);
      c.sameShape(0, 1);
      return same(0);
    case OpKind::SoftmaxCrossEntropyGrad: {
      c.arity(3);
      c.dtype(0, DType::Float32);
      c.dtype(1, DType::Float32);
      c.dtype(2, DType::Int32);
      if (c.rank(0) != 0 || c.rank(1) != 2 || c.rank(2) != 1 || c.shape(2)[0] != c.shape(1)[0]) {
        c.fail(ErrorCode::ShapeMismatch,
               fmt::format("expected (dloss [], logits [N, C], labels [N]), found ({}, "
                           "{}, {})",
                           c.desc(0), c.desc(1), c.desc(2)));
      }
      return same(1);
    }
    case OpKind::ReplicatedAllReduce:
      c.arity(1);
      c.dtype(0, DType::Float32);
      c.grouping(attributes);
      return {{c.shape(0), DType::Float32, c.in(0).metaShape}};
    case OpKind::ReplicatedReduceScatter:
    case OpKind::ReplicaShardedSlice: {
      c.arity(1);
      c.dtype(0, DType::Float32);
      const ReplicaGrouping g = c.grouping(attributes);
      return {{Shape{ceilDiv(numElements(c.shape(0)), g.groupSize())}, DType::Float32, c.shape(0)}};
    }
    case OpKind::ReplicatedAllGather: {
      c.arity(1);
      c.dtype(0, DType::Float32);
      const ReplicaGrouping g = c.grouping(attributes);
      if (c.rank(0) != 1) {
        c.fail(ErrorCode::InvalidCollective, fmt::format("input {} must be a 1-D shard", c.desc(0)));
      }
      Shape full = !attributes.shape.empty() ? attributes.shape : c.in(0).metaShape;
      if (full.empty()) full = {g.groupSize() * c.shape(0)[0]};
      c.shardFits(full, g.groupSize());
      attributes.shape = full;
      return {{full, DType::Float32, {}}};
    }
    case OpKind::ReplicaShardedPad: {
      c.arity(1);
      c.dtype(0, DType::Float32);
      const ReplicaGrouping g = c.grouping(attributes);
      const Shape full = !attributes.shape.empty() ? attributes.shape : c.in(0).metaShape;
      if (full.empty()) {
        c.fail(ErrorCode::InvalidCollective,
               fmt::format("input {} has no metaShape; give the full shape in the `shape` attribute",
                           c.desc(0)));
      }
      c.shardFits(full, g.groupSize());
      attributes.shape = full;
      return {{full, DType::Float32, {}}};
    }
    case OpKind::RemoteLoad:
    case OpKind::RemoteStore: {
      c.arity(kind == OpKind::RemoteLoad ? 0 : 1);
      if (attributes.remoteBuffer < 0 ||
          attributes.remoteBuffer >= static_cast<int64_t>(graph.remoteBuffers().size())) {
        c.fail(ErrorCode::InvalidRemoteBuffer,
               fmt::format("remote buffer #{} does not exist; the graph has {}", attributes.remoteBuffer,
                           graph.remoteBuffers().size()));
      }
      const RemoteBufferInfo& buffer = graph.remoteBuffer(attributes.remoteBuffer);
      if (attributes.entry < 0 || attributes.entry >= buffer.entries) {
        c.fail(ErrorCode::InvalidRemoteBuffer,
               fmt::format("entry {} of remote buffer #{} is out of range; "
                           "entries are 0..{}",
                           attributes.entry, attributes.remoteBuffer, buffer.entries - 1));
      }
      if (kind == OpKind::RemoteLoad) return {{buffer.shape, buffer.dtype, buffer.metaShape}};
      if (c.shape(0) != buffer.shape || c.in(0).dtype != buffer.dtype) {
        c.fail(ErrorCode::ShapeMismatch,
               fmt::format("{} does not fit remote buffer #{} of {} {}", c.desc(0), attributes.remoteBuffer,
                           shapeStr(buffer.shape), buffer.dtype));
      }
      return {};
    }
  }
  c.fail(ErrorCode::InvalidOperand, "unknown op kind");
}

}  // namespace tessera
