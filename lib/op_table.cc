// The op table and the pieces every family shares.
#include <algorithm>
#include <mutex>
#include <string_view>

#include <fmt/format.h>

#include "op_def.hpp"
#include "tessera/lib/shard_layout.hpp"

namespace tessera {
namespace {

std::size_t indexOf(OpKind kind) { return static_cast<std::size_t>(kind); }

// Built once, on first use, from the families in a fixed order; registerOp
// adds to it later.
OpTable& opTable() {
  static OpTable instance = [] {
    OpTable t;
    addSourceOps(t);
    addElementwiseOps(t);
    addMatMulOps(t);
    addReductionOps(t);
    addShapeOps(t);
    addSoftmaxOps(t);
    addGatherOps(t);
    addConvOps(t);
    addPoolingOps(t);
    addRecurrenceOps(t);
    addNormalizationOps(t);
    addMaskOps(t);
    addCollectiveOps(t);
    addRemoteOps(t);
    return t;
  }();
  return instance;
}

}  // namespace

void OpTable::add(OpDef def) {
  const std::size_t i = indexOf(def.kind);
  if (i < present_.size() && present_[i]) {
    throw InternalError(ErrorCode::Internal, "op table",
                        fmt::format("{} (kind {}) is registered twice", opName(def.kind), i));
  }
  if (def.name.empty()) def.name = toString(def.kind);
  if (def.name == "<invalid>") {
    throw InternalError(ErrorCode::Internal, "op table",
                        fmt::format("kind {} is not a built-in kind and has no name", i));
  }
  if (def.shape == nullptr && def.family != OpFamily::Source) {
    throw InternalError(ErrorCode::Internal, "op table", fmt::format("{} has no shape rule", def.name));
  }
  if (i >= defs_.size()) {
    defs_.resize(i + 1);
    present_.resize(i + 1, 0);
  }
  defs_[i] = def;
  present_[i] = 1;
}

namespace {

// Sets `flag` on the registered `kinds`; a kind not registered yet is a bug
// of the table's construction.
void markRegistered(std::vector<OpDef>& defs, const std::vector<char>& present,
                    std::initializer_list<OpKind> kinds, bool OpDef::*flag, std::string_view what) {
  for (const OpKind kind : kinds) {
    const std::size_t i = indexOf(kind);
    if (i >= present.size() || !present[i]) {
      throw InternalError(ErrorCode::Internal, "op table",
                          fmt::format("{} is marked as {} before it is registered", opName(kind), what));
    }
    defs[i].*flag = true;
  }
}

}  // namespace

void OpTable::keepsHalves(std::initializer_list<OpKind> kinds) {
  markRegistered(defs_, present_, kinds, &OpDef::keepsHalves, "keeping halves");
}

void OpTable::float64(std::initializer_list<OpKind> kinds) {
  markRegistered(defs_, present_, kinds, &OpDef::float64, "taking float64");
}

const OpDef* OpTable::find(OpKind kind) const noexcept {
  const std::size_t i = indexOf(kind);
  return i < present_.size() && present_[i] ? &defs_[i] : nullptr;
}

const OpDef& opDef(OpKind kind) {
  const OpDef* def = opTable().find(kind);
  if (def == nullptr) {
    throw InternalError(ErrorCode::Internal, "op table",
                        fmt::format("op kind {} is not in the op table", static_cast<unsigned>(kind)));
  }
  return *def;
}

std::string_view opName(OpKind kind) noexcept {
  try {
    const OpDef* def = opTable().find(kind);
    return def != nullptr ? def->name : std::string_view{"<invalid>"};
  } catch (...) {
    return "<invalid>";
  }
}

void registerOp(OpDef def) { opTable().add(def); }

bool isInplace(OpKind kind) { return opDef(kind).inplace; }
bool isElementwise(OpKind kind) { return opDef(kind).elementwise; }
bool isCollective(OpKind kind) { return opDef(kind).collective; }

std::vector<OutputSpec> inferOutputs(const Graph& graph, OpKind kind, std::span<const TensorId> inputs,
                                     OpAttributes& attributes, std::string_view opName) {
  const OpChecker c(graph, kind, inputs, opName);
  const OpDef* def = opTable().find(kind);
  if (def == nullptr) c.fail(ErrorCode::InvalidOperand, "unknown op kind");
  if (def->shape == nullptr) c.fail(ErrorCode::InvalidOperand, "sources are added with Graph::addSource");
  if (!def->float64) {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (c.in(i).dtype != DType::Float64) continue;
      c.fail(ErrorCode::InvalidOperand,
             fmt::format("input {} {} is float64, which this op does not take; float64 runs through the "
                         "elementwise ops, Where, the casts and the shape ops (cast to float32 with ops::cast)",
                         i, c.desc(i)));
    }
  }
  return def->shape(c, attributes);
}

bool hasGradient(OpKind kind) { return opDef(kind).gradient != nullptr; }

std::vector<TensorId> gradientOf(Graph& graph, OpId opId, std::span<const TensorId> outputGradients,
                                 std::span<const char> wanted) {
  const OpNode& op = graph.op(opId);
  if (outputGradients.empty() || outputGradients[0] == kNoTensor) {
    return std::vector<TensorId>(op.inputs.size(), kNoTensor);
  }
  const OpDef& def = opDef(op.kind);
  if (def.family == OpFamily::Source) return {};
  if (def.gradient == nullptr) {
    throw AutodiffError(ErrorCode::NoGradient, op.name,
                        fmt::format("op \"{}\" ({}) has no gradient rule", op.name, op.kind));
  }
  const GradientContext context{graph, op, Tensor{&graph, outputGradients[0]}, wanted};
  std::vector<TensorId> ids;
  for (const Tensor& t : def.gradient(context)) ids.push_back(t.valid() ? t.id() : kNoTensor);
  return ids;
}

// OpChecker

void OpChecker::fail(ErrorCode code, std::string_view message) const {
  throw GraphError(code, std::string(opName_), fmt::format("{}: {}", kind_, message));
}

std::string OpChecker::desc(std::size_t i) const { return describeTensor(graph_, inputs_[i]); }

void OpChecker::arity(std::size_t expected) const {
  if (inputs_.size() != expected) {
    fail(ErrorCode::InvalidOperand, fmt::format("takes {} input(s), found {}", expected, inputs_.size()));
  }
}

void OpChecker::dtype(std::size_t i, DType expected) const {
  if (in(i).dtype != expected) {
    fail(ErrorCode::InvalidOperand, fmt::format("input {} {} must be {}", i, desc(i), expected));
  }
}

DType OpChecker::floating(std::initializer_list<std::size_t> indices) const {
  std::optional<std::size_t> first;
  for (const std::size_t i : indices) {
    if (!isFloating(in(i).dtype)) {
      fail(ErrorCode::InvalidOperand, fmt::format("input {} {} must be float32, float16 or float64", i, desc(i)));
    }
    if (!first) {
      first = i;
    } else {
      sameDType(*first, i);
    }
  }
  return first ? in(*first).dtype : DType::Float32;
}

void OpChecker::sameDType(std::size_t i, std::size_t j) const {
  const DType a = in(i).dtype;
  const DType b = in(j).dtype;
  if (a == b) return;
  if (isFloating(a) && isFloating(b)) {
    fail(ErrorCode::DTypeMismatch,
         fmt::format("input {} {} and input {} {} mix {} and {}; an op's float operands share one dtype: cast "
                     "one of them to the other's dtype with ops::cast",
                     i, desc(i), j, desc(j), a, b));
  }
  fail(ErrorCode::InvalidOperand, fmt::format("input {} {} must be {} like input {} {}", j, desc(j), a, i, desc(i)));
}

void OpChecker::minRank(std::size_t i, int64_t r) const {
  if (rank(i) < r) {
    fail(ErrorCode::ShapeMismatch, fmt::format("input {} {} must have rank >= {}", i, desc(i), r));
  }
}

void OpChecker::sameShape(std::size_t i, std::size_t j) const {
  if (shape(i) != shape(j)) {
    fail(ErrorCode::ShapeMismatch,
         fmt::format("inputs {} and {} must have the same shape, found {} and {}", i, j, desc(i), desc(j)));
  }
}

int64_t OpChecker::axis(int64_t axis, int64_t r) const {
  const int64_t normal = axis < 0 ? axis + r : axis;
  if (normal < 0 || normal >= r) {
    fail(ErrorCode::InvalidAxis,
         fmt::format("axis {} is out of range for rank {}; allowed are {}..{}", axis, r, -r, r - 1));
  }
  return normal;
}

ReplicaGrouping OpChecker::grouping(OpAttributes& attributes) const {
  const int64_t replicas = graph_.replicationFactor();
  if (!attributes.grouping) attributes.grouping = ReplicaGrouping(replicas);
  if (attributes.grouping->numReplicas() != replicas) {
    fail(ErrorCode::InvalidCollective,
         fmt::format("the grouping {} is over {} replicas but the graph's replication factor is {}; make the "
                     "grouping with numReplicas {}",
                     attributes.grouping->str(), attributes.grouping->numReplicas(), replicas, replicas));
  }
  return *attributes.grouping;
}

void OpChecker::shardFits(const Shape& full, int64_t groupSize) const {
  const int64_t expected = ceilDiv(numElements(full), groupSize);
  if (rank(0) != 1 || shape(0)[0] != expected) {
    fail(ErrorCode::InvalidCollective,
         fmt::format("input {} is not a shard of {} over a group of {}: a shard has shape [{}] (ceil({}/{}))",
                     desc(0), shapeStr(full), groupSize, expected, numElements(full), groupSize));
  }
}

Tensor GradientContext::make(OpKind kind, std::vector<TensorId> inputs, OpAttributes attributes) const {
  return Tensor{&graph, graph.op(graph.addOp(kind, std::move(inputs), std::move(attributes))).outputs[0]};
}

void ReferenceOp::fail(std::string_view message) const {
  throw InternalError(ErrorCode::Internal, op_.name, fmt::format("reference of {}: {}", op_.kind, message));
}

// Shared helpers

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

bool broadcastsTo(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const std::size_t offset = to.size() - from.size();
  for (std::size_t i = 0; i < from.size(); ++i)
    if (from[i] != 1 && from[i] != to[offset + i]) return false;
  return true;
}

std::string describeTensor(const Graph& graph, TensorId t) {
  const TensorNode& node = graph.tensor(t);
  return fmt::format("\"{}\" {} {}", node.name, shapeStr(node.shape), node.dtype);
}

Tensor reduceTo(Tensor dy, Shape shape) {
  if (dy.shape() == shape) return dy;
  Graph& graph = dy.graph();
  OpAttributes attributes;
  attributes.shape = std::move(shape);
  return {&graph, graph.op(graph.addOp(OpKind::ReduceToShape, {dy.id()}, attributes)).outputs[0]};
}

Tensor scaled(Tensor t, double factor) {
  if (factor == 1.0) return t;
  return ops::mul(t, ops::scalar(t.graph(), factor, t.dtype()));
}

double elementsOf(const Graph& graph, TensorId t) {
  return static_cast<double>(numElements(graph.tensor(t).shape));
}

double bytesOf(const Graph& graph, TensorId t) {
  return static_cast<double>(dtypeBytes(graph.tensor(t).dtype)) * elementsOf(graph, t);
}

namespace reference {

std::size_t count(const Shape& shape) { return static_cast<std::size_t>(numElements(shape)); }

std::vector<std::size_t> stridesOf(const Shape& shape) {
  std::vector<std::size_t> strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;)
    strides[d - 1] = strides[d] * static_cast<std::size_t>(shape[d]);
  return strides;
}

std::vector<int64_t> unravel(std::size_t i, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    const auto dim = static_cast<std::size_t>(shape[d]);
    index[d] = static_cast<int64_t>(i % dim);
    i /= dim;
  }
  return index;
}

std::size_t broadcastSource(std::size_t i, const Shape& big, const Shape& small) {
  const std::vector<int64_t> index = unravel(i, big);
  const std::vector<std::size_t> strides = stridesOf(small);
  const std::size_t offset = big.size() - small.size();
  std::size_t flat = 0;
  for (std::size_t d = 0; d < small.size(); ++d)
    if (small[d] != 1) flat += static_cast<std::size_t>(index[offset + d]) * strides[d];
  return flat;
}

std::vector<double> shardOf(const std::vector<double>& host, int64_t shards, int64_t shard) {
  const ShardLayout layout(static_cast<int64_t>(host.size()), shards);
  std::vector<double> out(static_cast<std::size_t>(layout.shardElements()), 0.0);
  const auto begin = static_cast<std::size_t>(layout.hostOffset(shard));
  for (std::size_t j = 0; j < static_cast<std::size_t>(layout.realElements(shard)); ++j)
    out[j] = host[begin + j];
  return out;
}

}  // namespace reference
}  // namespace tessera
