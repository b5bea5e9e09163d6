#include "tessera/lib/ops.hpp"

#include <utility>

#include <fmt/format.h>

#include "half.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/shard_layout.hpp"

namespace tessera::ops {
namespace {

Graph& graphOf(std::string_view op, std::initializer_list<Tensor> tensors) {
  Graph* graph = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.valid()) {
      throw GraphError(ErrorCode::InvalidOperand, std::string(op), "an operand is an empty Tensor handle");
    }
    if (graph != nullptr && graph != &t.graph()) {
      throw GraphError(
          ErrorCode::InvalidOperand, std::string(op),
          fmt::format("operand \"{}\" belongs to another graph; all operands must come from one graph",
                      t.name()));
    }
    graph = &t.graph();
  }
  return *graph;
}

Tensor single(Graph& graph, OpId op) { return {&graph, graph.op(op).outputs.at(0)}; }

Tensor unary(OpKind kind, Tensor x, OpAttributes attributes = {}) {
  Graph& graph = graphOf(opName(kind), {x});
  return single(graph, graph.addOp(kind, {x.id()}, std::move(attributes)));
}

Tensor binary(OpKind kind, Tensor a, Tensor b, OpAttributes attributes = {}) {
  Graph& graph = graphOf(opName(kind), {a, b});
  return single(graph, graph.addOp(kind, {a.id(), b.id()}, std::move(attributes)));
}

OpAttributes collective(ReductionType reduction, std::optional<ReplicaGrouping> grouping) {
  OpAttributes attributes;
  attributes.reduction = reduction;
  attributes.grouping = std::move(grouping);
  return attributes;
}

void checkBuffer(const Graph& graph, RemoteBuffer buffer, std::string_view who) {
  if (buffer.graph() != &graph) {
    throw GraphError(ErrorCode::InvalidRemoteBuffer, std::string(who),
                     fmt::format("remote buffer #{} belongs to another graph (or is empty)", buffer.id()));
  }
}

// The grouping of a variable, defaulting to all replicas, checked against
// the graph's replication factor.
ReplicaGrouping variableGrouping(const Graph& graph, const std::string& name,
                                 const std::optional<ReplicaGrouping>& grouping) {
  const ReplicaGrouping g = grouping.value_or(ReplicaGrouping(graph.replicationFactor()));
  if (g.numReplicas() != graph.replicationFactor()) {
    throw GraphError(
        ErrorCode::InvalidOperand, name,
        fmt::format("the grouping {} is over {} replicas but the graph's replication factor is {}", g.str(),
                    g.numReplicas(), graph.replicationFactor()));
  }
  return g;
}

// Checks host data against PopXL's shape_on_host: [numGroups, ...shape] for
// more than one group, else shape.
void checkHostData(const std::string& name, const InitialValues& data, const Shape& shape,
                   const ReplicaGrouping& grouping) {
  Shape host = shape;
  std::string derivation = fmt::format("the variable's shape {} (one group)", shapeStr(shape));
  if (grouping.numGroups() > 1) {
    host.insert(host.begin(), grouping.numGroups());
    derivation = fmt::format("[numGroups {}] + shape {} from {}", grouping.numGroups(), shapeStr(shape),
                             grouping.str());
  }
  const int64_t expected = numElements(host);
  if (data.elements() != expected) {
    throw GraphError(ErrorCode::HostShapeMismatch, name,
                     fmt::format("host data has {} elements; expected host shape {} ({} elements): {}",
                                 data.elements(), shapeStr(host), expected, derivation));
  }
}

}  // namespace

Tensor input(Graph& graph, std::string name, Shape shape, DType dtype) {
  return input(graph, std::move(name), std::move(shape), dtype, InputSettings{});
}

Tensor input(Graph& graph, std::string name, Shape shape, DType dtype, InputSettings settings) {
  TensorNode node;
  node.name = std::move(name);
  node.shape = std::move(shape);
  node.dtype = dtype;
  node.inputSettings = settings;
  return {&graph, graph.addSource(OpKind::Input, std::move(node))};
}

Tensor variable(Graph& graph, std::string name, InitialValues hostData, Shape shape,
                std::optional<ReplicaGrouping> grouping, RetrievalMode retrievalMode, TensorCategory category,
                DType dtype) {
  if (dtype == DType::Float64) {
    throw GraphError(ErrorCode::InvalidOperand, name,
                     fmt::format("variable \"{}\" {} is float64; variables are float32, float16 or int32 (float64 "
                                 "runs in inputs, constants and the ops computed from them)",
                                 name, shapeStr(shape)));
  }
  const ReplicaGrouping g = variableGrouping(graph, name, grouping);
  checkHostData(name, hostData, shape, g);
  TensorNode node;
  node.name = std::move(name);
  node.shape = std::move(shape);
  node.dtype = dtype;
  node.category = category;
  node.grouping = g;
  node.retrievalMode = retrievalMode;
  node.initial = std::move(hostData);
  return {&graph, graph.addSource(OpKind::Variable, std::move(node))};
}

namespace {

// A Constant of `elements` host values (checked against the shape) holding `data`.
Tensor addConstant(Graph& graph, std::string name, std::size_t elements, std::vector<float> data, Shape shape,
                   DType dtype) {
  const int64_t expected = numElements(shape);
  if (static_cast<int64_t>(elements) != expected) {
    throw GraphError(ErrorCode::HostShapeMismatch, name,
                     fmt::format("constant data has {} elements; shape {} needs {}", elements,
                                 shapeStr(shape), expected));
  }
  TensorNode node;
  node.name = std::move(name);
  node.shape = std::move(shape);
  node.dtype = dtype;
  node.data = std::move(data);
  // Float16 constants hold their values as half (rounded to nearest even).
  if (dtype == DType::Float16) roundToHalves(node.data.data(), node.data.size());
  return {&graph, graph.addSource(OpKind::Constant, std::move(node))};
}

}  // namespace

Tensor constant(Graph& graph, std::string name, std::vector<float> data, Shape shape, DType dtype) {
  if (dtype == DType::Float64)
    return constantFloat64(graph, std::move(name), std::vector<double>(data.begin(), data.end()),
                           std::move(shape));
  const std::size_t elements = data.size();
  return addConstant(graph, std::move(name), elements, std::move(data), std::move(shape), dtype);
}

// Float64 constants hold each double's bytes in two floats.
Tensor constantFloat64(Graph& graph, std::string name, const std::vector<double>& data, Shape shape) {
  return addConstant(graph, std::move(name), data.size(), packDoubles(data), std::move(shape),
                     DType::Float64);
}

Tensor scalar(Graph& graph, double value, DType dtype) {
  if (dtype == DType::Float64) return constantFloat64(graph, graph.uniqueName("scalar"), {value}, {});
  // A float16 scalar is the half nearest the double, rounded once.
  const float narrow = dtype == DType::Float16 ? roundDoubleToHalf(value) : static_cast<float>(value);
  return constant(graph, graph.uniqueName("scalar"), {narrow}, {}, dtype);
}

Tensor matmul(Tensor a, Tensor b) { return binary(OpKind::MatMul, a, b); }
Tensor add(Tensor a, Tensor b) { return binary(OpKind::Add, a, b); }
Tensor sub(Tensor a, Tensor b) { return binary(OpKind::Sub, a, b); }
Tensor mul(Tensor a, Tensor b) { return binary(OpKind::Mul, a, b); }
Tensor div(Tensor a, Tensor b) { return binary(OpKind::Div, a, b); }
Tensor neg(Tensor x) { return unary(OpKind::Neg, x); }
Tensor relu(Tensor x) { return unary(OpKind::Relu, x); }
Tensor gelu(Tensor x) { return unary(OpKind::Gelu, x); }
Tensor tanh(Tensor x) { return unary(OpKind::Tanh, x); }
Tensor sigmoid(Tensor x) { return unary(OpKind::Sigmoid, x); }
Tensor exp(Tensor x) { return unary(OpKind::Exp, x); }
Tensor log(Tensor x) { return unary(OpKind::Log, x); }
Tensor sqrt(Tensor x) { return unary(OpKind::Sqrt, x); }
Tensor abs(Tensor x) { return unary(OpKind::Abs, x); }
Tensor sign(Tensor x) { return unary(OpKind::Sign, x); }
Tensor erf(Tensor x) { return unary(OpKind::Erf, x); }
Tensor reciprocal(Tensor x) { return unary(OpKind::Reciprocal, x); }
Tensor softplus(Tensor x) { return unary(OpKind::Softplus, x); }

namespace {
OpAttributes scalars(double a, double b = 1.0) {
  OpAttributes attributes;
  attributes.a = a;
  attributes.b = b;
  return attributes;
}
}  // namespace

Tensor leakyRelu(Tensor x, double alpha) { return unary(OpKind::LeakyRelu, x, scalars(alpha)); }
Tensor elu(Tensor x, double alpha) { return unary(OpKind::Elu, x, scalars(alpha)); }
Tensor selu(Tensor x, double alpha, double gamma) { return unary(OpKind::Selu, x, scalars(alpha, gamma)); }
Tensor clip(Tensor x, double lo, double hi) { return unary(OpKind::Clip, x, scalars(lo, hi)); }
Tensor pow(Tensor a, Tensor b) { return binary(OpKind::Pow, a, b); }
Tensor batchMatmul(Tensor a, Tensor b) { return binary(OpKind::BatchMatMul, a, b); }
Tensor gather(Tensor data, Tensor indices, int64_t axis) {
  OpAttributes attributes;
  attributes.axis = axis;
  return binary(OpKind::Gather, data, indices, std::move(attributes));
}
Tensor gatherElements(Tensor data, Tensor indices, int64_t axis) {
  OpAttributes attributes;
  attributes.axis = axis;
  return binary(OpKind::GatherElements, data, indices, std::move(attributes));
}
Tensor scatterElements(Tensor data, Tensor indices, Tensor updates, int64_t axis, bool accumulate) {
  OpAttributes attributes;
  attributes.axis = axis;
  attributes.a = accumulate ? 1.0 : 0.0;
  Graph& graph = graphOf(opName(OpKind::ScatterElements), {data, indices, updates});
  return single(graph, graph.addOp(OpKind::ScatterElements, {data.id(), indices.id(), updates.id()},
                                   std::move(attributes)));
}
namespace {
OpAttributes convAttributes(const ConvParams& p) {
  OpAttributes attributes;
  attributes.strides = p.strides;
  attributes.pads = p.pads;
  attributes.dilations = p.dilations;
  attributes.group = p.group;
  attributes.outputPadding = p.outputPadding;
  return attributes;
}
OpAttributes poolAttributes(const PoolParams& p) {
  OpAttributes attributes;
  attributes.kernel = p.kernel;
  attributes.strides = p.strides;
  attributes.pads = p.pads;
  attributes.dilations = p.dilations;
  attributes.ceilMode = p.ceilMode;
  attributes.countIncludePad = p.countIncludePad;
  return attributes;
}
// The spatial axes of an NC[D]HW tensor: 2, 3, ...
std::vector<int64_t> spatialAxes(const Tensor& x, std::string_view op) {
  const auto rank = static_cast<int64_t>(x.shape().size());
  if (rank < 3) {
    throw GraphError(ErrorCode::ShapeMismatch, std::string(op),
                     fmt::format("{}: input \"{}\" {} must be [N, C, D..] with at least one spatial axis", op,
                                 x.name(), shapeStr(x.shape())));
  }
  std::vector<int64_t> axes;
  for (int64_t a = 2; a < rank; ++a) axes.push_back(a);
  return axes;
}
}  // namespace

Tensor conv(Tensor x, Tensor w, const ConvParams& params) {
  return binary(OpKind::Conv, x, w, convAttributes(params));
}
Tensor convTranspose(Tensor x, Tensor w, const ConvParams& params) {
  return binary(OpKind::ConvTranspose, x, w, convAttributes(params));
}
Tensor maxPool(Tensor x, const PoolParams& params) {
  return unary(OpKind::MaxPool, x, poolAttributes(params));
}
Tensor averagePool(Tensor x, const PoolParams& params) {
  return unary(OpKind::AveragePool, x, poolAttributes(params));
}
Tensor globalAveragePool(Tensor x) {
  graphOf("GlobalAveragePool", {x});
  return reduceMean(x, spatialAxes(x, "GlobalAveragePool"), true);
}
Tensor globalMaxPool(Tensor x) {
  graphOf("GlobalMaxPool", {x});
  spatialAxes(x, "GlobalMaxPool");
  PoolParams params;
  params.kernel.assign(x.shape().begin() + 2, x.shape().end());
  return maxPool(x, params);
}

RecurrenceOutputs recurrence(OpKind cell, Tensor x, Tensor w, Tensor r, Tensor b, Tensor h0, Tensor c0,
                             const RecurrenceParams& params) {
  const std::string_view who = opName(cell);
  Graph& graph = graphOf(who, {x, w, r});
  const bool lstm = cell == OpKind::Lstm;
  if (cell != OpKind::Rnn && cell != OpKind::Gru && !lstm)
    throw GraphError(ErrorCode::InvalidRecurrence, std::string(who),
                     fmt::format("{} is not a recurrence; the cell is Rnn, Gru or Lstm", cell));
  const int64_t dirs = params.direction == RecurrenceDirection::Bidirectional ? 2 : 1;
  const int64_t gates = cell == OpKind::Gru ? 3 : lstm ? 4 : 1;
  const Shape xs = x.shape();
  const Shape rs = r.shape();
  const auto refuse = [&](const std::string& what) {
    throw GraphError(ErrorCode::InvalidRecurrence, std::string(who),
                     fmt::format("{} {} over x {}: {}", params.direction, cell, shapeStr(xs), what));
  };
  if (xs.size() != 3) refuse("x must be [S, B, I]");
  if (rs.size() != 3 || rs[2] < 1 || rs[1] != gates * rs[2] || rs[0] != dirs) {
    refuse(fmt::format("R {} must be [D, G*H, H] with D = {} directions and G = {} gates", shapeStr(rs), dirs,
                       gates));
  }
  const int64_t hidden = rs[2];
  const int64_t gateRows = rs[1];
  const Shape state{dirs, xs[1], hidden};
  const auto check = [&](const Tensor& t, std::string_view name, const Shape& expected) {
    if (t.valid() && t.shape() != expected)
      refuse(fmt::format("{} {} must be {} (hidden size {} from R)", name, shapeStr(t.shape()),
                         shapeStr(expected), hidden));
  };
  check(w, "W", {dirs, gateRows, xs[2]});
  check(b, "B", {dirs, 2 * gateRows});
  check(h0, "h0", state);
  check(c0, "c0", state);
  if (!lstm && c0.valid()) refuse("only Lstm has a cell state c0");
  const DType dtype = x.dtype();
  const auto zeros = [&](Shape shape) {
    return ops::broadcastTo(ops::scalar(graph, 0.0, dtype), std::move(shape));
  };
  if (!b.valid()) b = zeros({dirs, 2 * gateRows});
  if (!h0.valid()) h0 = zeros(state);
  if (lstm && !c0.valid()) c0 = zeros(state);
  // Each gate row: its input weights, recurrent weights, input bias, recurrent bias.
  const Tensor biases = ops::transpose(ops::reshape(b, {dirs, 2, gateRows}), {0, 2, 1});
  const Tensor weights = ops::concat({w, r, biases}, 2);
  const Tensor initial = lstm ? ops::concat({h0, c0}, 2) : h0;
  OpAttributes attributes;
  attributes.direction = params.direction;
  attributes.linearBeforeReset = params.linearBeforeReset;
  RecurrenceOutputs out;
  out.states = single(graph, graph.addOp(cell, {x.id(), weights.id(), initial.id()}, std::move(attributes)));
  const int64_t steps = xs[0];
  const int64_t batch = xs[1];
  out.y = ops::slice(out.states, {0, 0, 0, 0}, {steps, dirs, batch, hidden});
  // Each direction's last state: step S-1 forward, step 0 in reverse.
  const auto last = [&](int64_t channel) {
    std::vector<Tensor> parts;
    for (int64_t d = 0; d < dirs; ++d) {
      const bool reversed = params.direction == RecurrenceDirection::Reverse || d == 1;
      const int64_t t = reversed ? 0 : steps - 1;
      parts.push_back(
          ops::slice(out.states, {t, d, 0, channel * hidden}, {t + 1, d + 1, batch, (channel + 1) * hidden}));
    }
    return ops::reshape(parts.size() == 1 ? parts.front() : ops::concat(parts, 1), state);
  };
  out.yH = last(0);
  if (lstm) out.yC = last(1);
  return out;
}

BatchNormOutputs batchNormTraining(Tensor x, Tensor scale, Tensor bias, double epsilon) {
  const std::string_view who = opName(OpKind::BatchNorm);
  Graph& graph = graphOf(who, {x, scale, bias});
  const Shape xs = x.shape();
  if (xs.size() < 2)
    throw GraphError(ErrorCode::InvalidOperand, std::string(who),
                     fmt::format("x {} must be [N, C, ...] with a channel axis", shapeStr(xs)));
  const int64_t channels = xs[1];
  for (const Tensor* t : {&scale, &bias})
    if (t->shape() != Shape{channels})
      throw GraphError(ErrorCode::InvalidOperand, std::string(who),
                       fmt::format("scale and bias must be [C] = [{}]; found {}", channels, shapeStr(t->shape())));
  const Tensor stats = single(graph, graph.addOp(OpKind::BatchNormStats, {x.id()}, {}));
  const Tensor affine = ops::concat({ops::reshape(scale, {1, channels}), ops::reshape(bias, {1, channels})}, 0);
  OpAttributes attributes;
  attributes.a = epsilon;
  BatchNormOutputs out;
  out.y = single(graph, graph.addOp(OpKind::BatchNorm, {x.id(), stats.id(), affine.id()}, std::move(attributes)));
  out.mean = ops::reshape(ops::slice(stats, {0, 0}, {1, channels}), {channels});
  out.variance = ops::reshape(ops::slice(stats, {1, 0}, {2, channels}), {channels});
  return out;
}

Tensor softmax(Tensor x) { return unary(OpKind::Softmax, x); }
Tensor equal(Tensor a, Tensor b) { return binary(OpKind::Equal, a, b); }
Tensor less(Tensor a, Tensor b) { return binary(OpKind::Less, a, b); }
Tensor greater(Tensor a, Tensor b) { return binary(OpKind::Greater, a, b); }
Tensor logicalNot(Tensor x) { return unary(OpKind::Not, x); }
Tensor logicalAnd(Tensor a, Tensor b) { return binary(OpKind::And, a, b); }
Tensor logicalOr(Tensor a, Tensor b) { return binary(OpKind::Or, a, b); }
Tensor dropout(Tensor x, Tensor step, double ratio, uint64_t seed) {
  OpAttributes attributes;
  attributes.a = ratio;
  attributes.b = static_cast<double>(seed);
  return binary(OpKind::Dropout, x, step, std::move(attributes));
}
Tensor castToInt32(Tensor x) { return unary(OpKind::CastToInt32, x); }
Tensor castToFloat32(Tensor x) { return unary(OpKind::CastToFloat32, x); }
Tensor cast(Tensor x, DType dtype) {
  graphOf("Cast", {x});
  if (x.dtype() == dtype) return x;
  switch (dtype) {
    case DType::Float32:
      return castToFloat32(x);
    case DType::Int32:
      return castToInt32(x);
    case DType::Float64:
      return unary(OpKind::CastToFloat64, x);
    case DType::Float16:
      if (x.dtype() != DType::Float32 && x.dtype() != DType::Float64) {
        throw GraphError(ErrorCode::InvalidOperand, x.name(),
                         fmt::format("Cast: \"{}\" {} {} cannot be cast to float16 directly; float32 and "
                                     "float64 cast to float16 (cast int32 to float32 first)",
                                     x.name(), shapeStr(x.shape()), x.dtype()));
      }
      return unary(OpKind::CastToFloat16, x);
  }
  throw GraphError(ErrorCode::InvalidOperand, x.name(), "Cast: unknown target dtype");
}
Tensor where(Tensor cond, Tensor x, Tensor y) {
  Graph& graph = graphOf(opName(OpKind::Where), {cond, x, y});
  return single(graph, graph.addOp(OpKind::Where, {cond.id(), x.id(), y.id()}));
}
Tensor logSoftmax(Tensor x) { return unary(OpKind::LogSoftmax, x); }

Tensor softmaxCrossEntropy(Tensor logits, Tensor labels, ReductionType reduction) {
  OpAttributes attributes;
  attributes.reduction = reduction;
  return binary(OpKind::SoftmaxCrossEntropy, logits, labels, std::move(attributes));
}

Tensor reduceSum(Tensor x, std::vector<int64_t> axes, bool keepDims) {
  OpAttributes attributes;
  attributes.axes = std::move(axes);
  attributes.keepDims = keepDims;
  return unary(OpKind::ReduceSum, x, std::move(attributes));
}

Tensor reduceMean(Tensor x, std::vector<int64_t> axes, bool keepDims) {
  OpAttributes attributes;
  attributes.axes = std::move(axes);
  attributes.keepDims = keepDims;
  return unary(OpKind::ReduceMean, x, std::move(attributes));
}

Tensor reshape(Tensor x, Shape shape) {
  OpAttributes attributes;
  attributes.shape = std::move(shape);
  return unary(OpKind::Reshape, x, std::move(attributes));
}

Tensor transpose(Tensor x, std::vector<int64_t> perm) {
  OpAttributes attributes;
  attributes.axes = std::move(perm);
  return unary(OpKind::Transpose, x, std::move(attributes));
}

Tensor slice(Tensor x, std::vector<int64_t> starts, std::vector<int64_t> ends) {
  OpAttributes attributes;
  attributes.starts = std::move(starts);
  attributes.ends = std::move(ends);
  return unary(OpKind::Slice, x, std::move(attributes));
}

Tensor concat(const std::vector<Tensor>& tensors, int64_t axis) {
  if (tensors.empty())
    throw GraphError(ErrorCode::InvalidOperand, "Concat", "Concat: needs at least one input");
  std::vector<TensorId> ids;
  for (const Tensor& t : tensors) {
    graphOf("Concat", {tensors.front(), t});
    ids.push_back(t.id());
  }
  OpAttributes attributes;
  attributes.axis = axis;
  Graph& graph = tensors.front().graph();
  return single(graph, graph.addOp(OpKind::Concat, std::move(ids), std::move(attributes)));
}

Tensor broadcastTo(Tensor x, Shape shape) {
  OpAttributes attributes;
  attributes.shape = std::move(shape);
  return unary(OpKind::BroadcastTo, x, std::move(attributes));
}

Tensor scaledAddInplace(Tensor x, Tensor y, double a, double b) {
  OpAttributes attributes;
  attributes.a = a;
  attributes.b = b;
  return binary(OpKind::ScaledAddInplace, x, y, std::move(attributes));
}

Tensor copy(Tensor x) { return unary(OpKind::Copy, x); }
Tensor copyInplace(Tensor dst, Tensor src) { return binary(OpKind::CopyInplace, dst, src); }
Tensor argmax(Tensor x) { return unary(OpKind::ArgMax, x); }

Tensor replicatedAllReduce(Tensor t, ReductionType reduction, std::optional<ReplicaGrouping> grouping) {
  return unary(OpKind::ReplicatedAllReduce, t, collective(reduction, std::move(grouping)));
}

Tensor replicatedReduceScatter(Tensor t, ReductionType reduction, std::optional<ReplicaGrouping> grouping) {
  return unary(OpKind::ReplicatedReduceScatter, t, collective(reduction, std::move(grouping)));
}

Tensor replicatedAllGather(Tensor t, std::optional<ReplicaGrouping> grouping, Shape outputShape) {
  OpAttributes attributes = collective(ReductionType::Sum, std::move(grouping));
  attributes.shape = std::move(outputShape);
  return unary(OpKind::ReplicatedAllGather, t, std::move(attributes));
}

Tensor replicaShardedSlice(Tensor t, std::optional<ReplicaGrouping> grouping) {
  return unary(OpKind::ReplicaShardedSlice, t, collective(ReductionType::Sum, std::move(grouping)));
}

RemoteBuffer remoteBuffer(Graph& graph, Shape shape, DType dtype, int64_t entries) {
  RemoteBufferInfo info;
  info.shape = std::move(shape);
  info.dtype = dtype;
  info.entries = entries;
  return {&graph, graph.addRemoteBuffer(std::move(info))};
}

Tensor remoteLoad(Graph& graph, RemoteBuffer buffer, int64_t entry) {
  checkBuffer(graph, buffer, "RemoteLoad");
  OpAttributes attributes;
  attributes.remoteBuffer = buffer.id();
  attributes.entry = entry;
  return single(graph, graph.addOp(OpKind::RemoteLoad, {}, std::move(attributes)));
}

void remoteStore(Graph& graph, RemoteBuffer buffer, int64_t entry, Tensor t) {
  checkBuffer(graph, buffer, "RemoteStore");
  if (&graphOf("RemoteStore", {t}) != &graph) {
    throw GraphError(ErrorCode::InvalidOperand, "RemoteStore",
                     fmt::format("tensor \"{}\" belongs to another graph", t.name()));
  }
  OpAttributes attributes;
  attributes.remoteBuffer = buffer.id();
  attributes.entry = entry;
  graph.addOp(OpKind::RemoteStore, {t.id()}, std::move(attributes));
}

Tensor remoteVariable(Graph& graph, std::string name, InitialValues hostData, RemoteBuffer buffer,
                      int64_t entry, std::optional<ReplicaGrouping> grouping, RetrievalMode retrievalMode) {
  checkBuffer(graph, buffer, name);
  const RemoteBufferInfo& info = buffer.info();
  if (entry < 0 || entry >= info.entries) {
    throw GraphError(ErrorCode::InvalidRemoteBuffer, name,
                     fmt::format("entry {} of remote buffer #{} is out of range; entries are 0..{}", entry,
                                 buffer.id(), info.entries - 1));
  }
  const Tensor v = variable(graph, std::move(name), std::move(hostData), info.shape, std::move(grouping),
                            retrievalMode, TensorCategory::Weight, info.dtype);
  TensorNode& node = graph.tensor(v.id());
  node.remoteBuffer = buffer.id();
  node.remoteEntry = entry;
  return v;
}

ShardedVariable replicaShardedVariable(Graph& graph, std::string name, InitialValues hostData, Shape shape,
                                       std::optional<ReplicaGrouping> grouping,
                                       std::optional<int64_t> shardOver, TensorCategory category,
                                       DType dtype) {
  const ReplicaGrouping g = variableGrouping(graph, name, grouping);
  const int64_t shards = shardOver.value_or(g.groupSize());
  if (shards < 1 || shards > g.groupSize() || g.groupSize() % shards != 0) {
    throw GraphError(ErrorCode::InvalidCollective, name,
                     fmt::format("shardOver is {}; it must be a positive divisor of the group size {} of {}",
                                 shards, g.groupSize(), g.str()));
  }
  checkHostData(name, hostData, shape, g);
  const ShardLayout layout(numElements(shape), shards);
  TensorNode node;
  node.name = std::move(name);
  node.shape = {layout.shardElements()};
  node.metaShape = std::move(shape);
  node.shardCount = shards;
  node.category = category;
  node.dtype = dtype;
  node.grouping = g;
  node.initial = std::move(hostData);
  const Tensor v{&graph, graph.addSource(OpKind::Variable, std::move(node))};
  return {v, v};
}

Tensor remoteReplicaShardedVariable(Graph& graph, std::string name, InitialValues hostData, Shape shape,
                                    RemoteBuffer buffer, int64_t entry) {
  checkBuffer(graph, buffer, name);
  const int64_t replicas = graph.replicationFactor();
  if (replicas < 2) {
    throw GraphError(
        ErrorCode::InvalidCollective, name,
        fmt::format("the graph's replication factor is {}; it must be greater than 1 to create a "
                    "replica sharded variable",
                    replicas));
  }
  const RemoteBufferInfo& info = buffer.info();
  const ShardLayout layout(numElements(shape), replicas);
  if (info.shape != Shape{layout.shardElements()} || !isFloating(info.dtype)) {
    throw GraphError(ErrorCode::InvalidRemoteBuffer, name,
                     fmt::format("remote buffer #{} has shape {} {}; a variable of shape {} sharded over {} "
                                 "replicas needs float32 or float16 [{}]",
                                 buffer.id(), shapeStr(info.shape), info.dtype, shapeStr(shape), replicas,
                                 layout.shardElements()));
  }
  if (!info.metaShape.empty() && info.metaShape != shape) {
    throw GraphError(
        ErrorCode::InvalidRemoteBuffer, name,
        fmt::format("remote buffer #{} holds shards of {}; it cannot hold a variable of shape {}",
                    buffer.id(), shapeStr(info.metaShape), shapeStr(shape)));
  }
  if (entry < 0 || entry >= info.entries) {
    throw GraphError(ErrorCode::InvalidRemoteBuffer, name,
                     fmt::format("entry {} of remote buffer #{} is out of range; entries are 0..{}", entry,
                                 buffer.id(), info.entries - 1));
  }
  ShardedVariable sharded = replicaShardedVariable(graph, std::move(name), std::move(hostData), shape,
                                                   std::nullopt, std::nullopt, TensorCategory::Weight, info.dtype);
  graph.setRemoteBufferMetaShape(buffer.id(), std::move(shape));
  TensorNode& node = graph.tensor(sharded.variable.id());
  node.remoteBuffer = buffer.id();
  node.remoteEntry = entry;
  return sharded.variable;
}

void recomputeOutputInBackwardPass(Tensor t, RecomputeType type) {
  t.graph().setRecompute(t.node().producer, type);
}

void virtualGraph(Tensor t, int64_t ipu) { t.graph().setVirtualGraph(t.node().producer, ipu); }

void pipelineStage(Tensor t, int64_t stage) { t.graph().setPipelineStage(t.node().producer, stage); }
void executionPhase(Tensor t, int64_t phase) { t.graph().setExecutionPhase(t.node().producer, phase); }

}  // namespace tessera::ops
