// The PopXL-style builder API: tensor handles and one free function per op.
//
//   Graph g(4);
//   Tensor x = ops::input(g, "x", {8, 784});
//   auto [W0var, W0shard] = ops::replicaShardedVariable(g, "W0", w0Data, {784, 16});
//   Tensor W0 = ops::replicatedAllGather(W0shard);
//   Tensor h = ops::relu(ops::matmul(x, W0));
//
// Every function checks its operands and throws GraphError with a stable code
// (ShapeMismatch, InvalidOperand, InvalidAxis, UnknownTensor,
// DuplicateTensorName, HostShapeMismatch, InvalidCollective,
// InvalidRemoteBuffer) whose subject is the op or tensor name and whose
// message names the tensors, their shapes and what is allowed.
//
// Host data of a variable is given in host shape: [numGroups, ...shape] when
// its grouping has more than one group, else `shape` (PopXL's shape_on_host).
// Int32 values are held exactly as floats.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/lib/graph.hpp"

namespace tessera {

// A light handle: the graph and a tensor id. Copying it copies the reference.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Graph* graph, TensorId id) noexcept : graph_(graph), id_(id) {}

  bool valid() const noexcept { return graph_ != nullptr && id_ != kNoTensor; }
  Graph& graph() const noexcept { return *graph_; }
  TensorId id() const noexcept { return id_; }
  const TensorNode& node() const { return graph_->tensor(id_); }
  const Shape& shape() const { return node().shape; }
  DType dtype() const { return node().dtype; }
  const std::string& name() const { return node().name; }
  // The unsharded shape of a shard, empty otherwise.
  const Shape& metaShape() const { return node().metaShape; }
  bool operator==(const Tensor&) const = default;

 private:
  Graph* graph_ = nullptr;
  TensorId id_ = kNoTensor;
};

// A remote (streaming memory) buffer of `entries` slots of one shape, one
// copy per replica.
class RemoteBuffer {
 public:
  RemoteBuffer() = default;
  RemoteBuffer(Graph* graph, int64_t id) noexcept : graph_(graph), id_(id) {}

  Graph* graph() const noexcept { return graph_; }
  int64_t id() const noexcept { return id_; }
  const RemoteBufferInfo& info() const { return graph_->remoteBuffer(id_); }
  bool operator==(const RemoteBuffer&) const = default;

 private:
  Graph* graph_ = nullptr;
  int64_t id_ = -1;
};

// The result of replicaShardedVariable. The variable's per-replica value IS
// its shard (1-D, ceil(n/shardOver) elements, metaShape = the full shape), so
// both handles name the same tensor: `variable` is the one the host reads and
// writes (reassembled through its ShardLayout), `shard` the one the program
// computes with (and updates in place).
struct ShardedVariable {
  Tensor variable;
  Tensor shard;
};

// PopXL's in_sequence: ops created while an InSequence is alive run in
// creation order.
class InSequence {
 public:
  explicit InSequence(Graph& graph) : graph_(graph) { graph_.beginSequence(); }
  ~InSequence() { graph_.endSequence(); }
  InSequence(const InSequence&) = delete;
  InSequence& operator=(const InSequence&) = delete;

 private:
  Graph& graph_;
};

namespace ops {

// --- Sources ---
Tensor input(Graph& graph, std::string name, Shape shape, DType dtype = DType::Float32);
// PopART's addInputTensor(info, InputSettings): the stream's tile set and
// exchange strategy (tessera/lib/input_settings.hpp).
Tensor input(Graph& graph, std::string name, Shape shape, DType dtype, InputSettings settings);
// A persistent tensor initialised from `hostData` (see the host shape rule
// above): a vector of values, or values made on demand (InitialValues).
// `category` lets optimizers create OptimizerState / Accumulator state.
Tensor variable(Graph& graph, std::string name, InitialValues hostData, Shape shape,
                std::optional<ReplicaGrouping> grouping = std::nullopt,
                RetrievalMode retrievalMode = RetrievalMode::OnePerGroup,
                TensorCategory category = TensorCategory::Weight, DType dtype = DType::Float32);
Tensor constant(Graph& graph, std::string name, std::vector<float> data, Shape shape,
                DType dtype = DType::Float32);
// A constant holding one value, shape [] (broadcasts against anything), in
// `dtype` (a float16 scalar holds the value rounded to half).
Tensor scalar(Graph& graph, double value, DType dtype = DType::Float32);
// A float64 constant holding `data` exactly (TensorNode::data keeps each
// double's bytes in two floats). HostShapeMismatch when the sizes differ.
Tensor constantFloat64(Graph& graph, std::string name, const std::vector<double>& data, Shape shape);

// --- Dense math (float32 or float16; an op's float operands share one dtype) ---
Tensor matmul(Tensor a, Tensor b);  // [.., M, K] x [K, N] -> [.., M, N]
// [B.., M, K] x [B.., K, N] -> [B.., M, N] with the same batch dimensions B..
// (rank >= 3): one product per batch index, as attention's scores.
Tensor batchMatmul(Tensor a, Tensor b);
Tensor add(Tensor a, Tensor b);  // numpy broadcasting for add, sub, mul, div
Tensor sub(Tensor a, Tensor b);
Tensor mul(Tensor a, Tensor b);
Tensor div(Tensor a, Tensor b);
Tensor neg(Tensor x);
Tensor relu(Tensor x);
// The tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as
// PopART's Gelu; its gradient is the exact derivative of this formula.
Tensor gelu(Tensor x);
Tensor tanh(Tensor x);
Tensor sigmoid(Tensor x);
Tensor exp(Tensor x);
Tensor log(Tensor x);
Tensor sqrt(Tensor x);
Tensor abs(Tensor x);
Tensor sign(Tensor x);  // -1, 0 or 1; its gradient is zero
Tensor erf(Tensor x);
Tensor reciprocal(Tensor x);
Tensor softplus(Tensor x);  // log(1 + exp(x)), computed without overflow
// x for x > 0, else alpha x (ONNX's LeakyRelu).
Tensor leakyRelu(Tensor x, double alpha = 0.01);
// x for x > 0, else alpha (exp(x) - 1) (ONNX's Elu).
Tensor elu(Tensor x, double alpha = 1.0);
// gamma elu(x, alpha), ONNX's Selu with its defaults.
Tensor selu(Tensor x, double alpha = 1.67326319217681884765625, double gamma = 1.05070102214355468750);
// min(max(x, lo), hi); the gradient passes where lo <= x <= hi (as torch.clamp). Needs lo <= hi.
Tensor clip(Tensor x, double lo, double hi);
// a ^ b with numpy broadcasting (the exponent's gradient needs a > 0).
Tensor pow(Tensor a, Tensor b);
// Slices of `data` along `axis` picked by `indices` (ONNX Gather): data
// [A..., V, D...] with `axis` = rank(A) (negative counts from the end),
// indices int32 [I...], each in [-V, V) (negative counts from the end) ->
// [A..., I..., D...]. On axis 0 the rows of a table, an embedding lookup. The
// gradient adds dy's slices into the slices the indices name.
Tensor gather(Tensor data, Tensor indices, int64_t axis = 0);
// ONNX GatherElements (torch.gather): indices int32 of data's rank, each
// extent at most data's (any on `axis`) -> indices' shape, out[i] = data[i
// with its `axis` coordinate replaced by indices[i]], each index in [-V, V).
// The gradient is a scatterElements (add) of dy into zeros.
Tensor gatherElements(Tensor data, Tensor indices, int64_t axis = 0);
// ONNX ScatterElements (torch.scatter, scatter_add): data with each update
// written (accumulate false: ONNX's reduction none; a repeated index keeps the
// last in index order) or added (accumulate true: reduction add) at the
// position gatherElements would read with the same indices. The gradients:
// data gets dy with the written positions zeroed (accumulate: dy), the
// updates the gatherElements of dy.
Tensor scatterElements(Tensor data, Tensor indices, Tensor updates, int64_t axis = 0,
                       bool accumulate = false);
// --- Convolution and pooling over NC[D]HW tensors (1 to 3 spatial axes) ---
// Each vector has one value per spatial axis (pads: every axis's begin, then
// every axis's end); empty means the default (strides and dilations 1, pads 0).
struct ConvParams {
  std::vector<int64_t> strides{};
  std::vector<int64_t> pads{};
  std::vector<int64_t> dilations{};
  int64_t group = 1;
  std::vector<int64_t> outputPadding{};  // convTranspose: added at the end of each axis, below the stride
};
struct PoolParams {
  std::vector<int64_t> kernel{};  // the window (required)
  std::vector<int64_t> strides{};
  std::vector<int64_t> pads{};  // each below the window's extent
  std::vector<int64_t> dilations{};
  bool ceilMode = false;  // a last partial window counts (if it starts inside the input or its begin pad)
  bool countIncludePad = false;  // averagePool: pads count in the divisor
};
// x [N, C, D..] * w [M, C/group, K..] -> [N, M, O..], O = (D + pads - dilation (K - 1) - 1) / stride + 1.
Tensor conv(Tensor x, Tensor w, const ConvParams& params = {});
// Conv's transpose (its gradient with respect to its input): x [N, C, D..], w [C, M/group, K..] ->
// [N, M, O..], O = (D - 1) stride - pads + dilation (K - 1) + 1 + outputPadding.
Tensor convTranspose(Tensor x, Tensor w, const ConvParams& params = {});
// The maximum of each window (pads never win); the gradient goes to the first maximum in scan order.
Tensor maxPool(Tensor x, const PoolParams& params);
// The mean of each window over its taps inside the input (and the pads with countIncludePad).
Tensor averagePool(Tensor x, const PoolParams& params);
// Over all spatial axes, keeping them as 1s: [N, C, D..] -> [N, C, 1..] (a ReduceMean, a MaxPool).
Tensor globalAveragePool(Tensor x);
Tensor globalMaxPool(Tensor x);
// --- Recurrences: ONNX's RNN, GRU and LSTM (layout 0, the default activations) ---
struct RecurrenceParams {
  RecurrenceDirection direction = RecurrenceDirection::Forward;  // Bidirectional: D = 2
  bool linearBeforeReset = false;  // gru: r multiplies (R_h h + Rb_h), as PyTorch's GRU (and its export) does
};
// Y [S, D, B, H], Y_h [D, B, H] (each direction's last state) and, for Lstm, Y_c [D, B, H]; `states`
// is the recurrence op's output [S+1, D, B, K*H] they are sliced from (ops Rnn, Gru, Lstm in graph.hpp).
struct RecurrenceOutputs {
  Tensor y;
  Tensor yH;
  Tensor yC;  // Lstm only
  Tensor states;
};
// `cell` Rnn, Gru or Lstm over x [S, B, I] with ONNX's W [D, G*H, I], R [D, G*H, H], B [D, 2*G*H]
// (input biases, then recurrent ones) in ONNX's gate orders (Gru z, r, h; Lstm i, o, f, c; G = 1, 3,
// 4), the initial state h0 [D, B, H] and, for Lstm, c0 [D, B, H]; an empty b, h0 or c0 is zeros.
// InvalidRecurrence when the weights or states do not fit the cell, the direction and x.
RecurrenceOutputs recurrence(OpKind cell, Tensor x, Tensor w, Tensor r, Tensor b = {}, Tensor h0 = {},
                             Tensor c0 = {}, const RecurrenceParams& params = {});
// Batch normalisation in training mode over x [N, C, ...] with scale and bias [C] (ops BatchNormStats
// and BatchNorm in graph.hpp): y = (x - mean) / sqrt(variance + epsilon) * scale + bias with each
// channel's mean and population variance over N and the spatial axes, which are returned too ([C]).
struct BatchNormOutputs {
  Tensor y;
  Tensor mean;
  Tensor variance;
};
BatchNormOutputs batchNormTraining(Tensor x, Tensor scale, Tensor bias, double epsilon = 1e-5);
// Masks are float32 0/1 tensors (1 = true; any non-zero input counts as
// true). Comparisons take two float32 or two int32 values; all broadcast
// (numpy rules) and have no gradient.
Tensor equal(Tensor a, Tensor b);
Tensor less(Tensor a, Tensor b);
Tensor greater(Tensor a, Tensor b);
Tensor logicalNot(Tensor x);
Tensor logicalAnd(Tensor a, Tensor b);
Tensor logicalOr(Tensor a, Tensor b);
// cond != 0 ? x : y per element, the three broadcast (numpy rules); a select,
// so a -inf in the value not taken never turns into NaN. The gradient goes
// to x where cond holds and to y elsewhere.
Tensor where(Tensor cond, Tensor x, Tensor y);
// x * mask / (1 - ratio): element i of replica r's x (element r * n + i of
// the global batch) is kept when a hash of (seed, step, r * n + i) drawn
// uniform in [0, 1) is >= ratio, so the masks do not depend on the replica
// count. `step` is an int32 scalar (a counter the caller advances). The
// gradient is dy through the same mask.
Tensor dropout(Tensor x, Tensor step, double ratio, uint64_t seed = 0);
// x in `dtype`: float32 -> float16 rounds to nearest even (beyond +-65504 to
// +-inf, NaN stays NaN), float16 -> float32 is exact, float -> int32
// truncates toward zero (float32 values beyond 2^24 are not held exactly),
// int32 -> float32 is the same value (int32 -> float16 goes through float32:
// cast twice). Casts between float32 and float16 have a gradient (the cast
// back); casts from or to int32 have none. Any of int32, float32 and
// float16 -> float64 is exact; float64 -> float32 rounds to nearest even,
// float64 -> int32 truncates; casts between float64 and float32 or float16
// have a gradient. x itself when it has `dtype`. InvalidOperand for int32 ->
// float16 and float64 -> float16 (cast to float32 first).
Tensor cast(Tensor x, DType dtype);
// float32 or float16 -> int32 (CastToInt32), and int32 or float16 -> float32
// (CastToFloat32).
Tensor castToInt32(Tensor x);
Tensor castToFloat32(Tensor x);
Tensor softmax(Tensor x);     // along the last axis
Tensor logSoftmax(Tensor x);  // along the last axis
// logits [N, C], labels [N] int32 -> scalar: -sum_n log softmax(logits)[n, label_n],
// divided by N for Mean.
Tensor softmaxCrossEntropy(Tensor logits, Tensor labels, ReductionType reduction = ReductionType::Mean);
// Over `axes` (negative counts from the end; all axes when empty).
Tensor reduceSum(Tensor x, std::vector<int64_t> axes = {}, bool keepDims = false);
Tensor reduceMean(Tensor x, std::vector<int64_t> axes = {}, bool keepDims = false);
Tensor reshape(Tensor x, Shape shape);  // one dimension may be -1
// `perm[i]` is the input axis that becomes output axis i; empty reverses.
Tensor transpose(Tensor x, std::vector<int64_t> perm = {});
// [starts[i], ends[i]) on every axis i.
Tensor slice(Tensor x, std::vector<int64_t> starts, std::vector<int64_t> ends);
Tensor concat(const std::vector<Tensor>& tensors, int64_t axis);
Tensor broadcastTo(Tensor x, Shape shape);
// x = a*x + b*y in place (y broadcasts to x); returns the modified x.
Tensor scaledAddInplace(Tensor x, Tensor y, double a = 1.0, double b = 1.0);
Tensor copy(Tensor x);
// dst = src in place; returns the modified dst.
Tensor copyInplace(Tensor dst, Tensor src);
Tensor argmax(Tensor x);  // along the last axis, int32

// --- Collectives. `grouping` nullopt means all replicas; a grouping must be
// over the graph's replication factor. Shards use ShardLayout(n, groupSize). ---
Tensor replicatedAllReduce(Tensor t, ReductionType reduction = ReductionType::Sum,
                           std::optional<ReplicaGrouping> grouping = std::nullopt);
// Reduce over the group, keep this replica's shard (index in group): 1-D
// ceil(n/g) elements with metaShape = t's shape.
Tensor replicatedReduceScatter(Tensor t, ReductionType reduction = ReductionType::Sum,
                               std::optional<ReplicaGrouping> grouping = std::nullopt);
// The group's shards reassembled: `outputShape` if given, else t's metaShape,
// else [g * s] (concatenation).
Tensor replicatedAllGather(Tensor t, std::optional<ReplicaGrouping> grouping = std::nullopt,
                           Shape outputShape = {});
// This replica's shard of its own value, no reduction.
Tensor replicaShardedSlice(Tensor t, std::optional<ReplicaGrouping> grouping = std::nullopt);

// --- Streaming memory ---
// Throws GraphError(InvalidRemoteBuffer) for entries < 1.
RemoteBuffer remoteBuffer(Graph& graph, Shape shape, DType dtype = DType::Float32, int64_t entries = 1);
Tensor remoteLoad(Graph& graph, RemoteBuffer buffer, int64_t entry = 0);
void remoteStore(Graph& graph, RemoteBuffer buffer, int64_t entry, Tensor t);
// A variable kept in buffer[entry] (shape and dtype of the buffer); the host
// data has the group dimension when the grouping has more than one group.
Tensor remoteVariable(Graph& graph, std::string name, InitialValues hostData, RemoteBuffer buffer,
                      int64_t entry = 0, std::optional<ReplicaGrouping> grouping = std::nullopt,
                      RetrievalMode retrievalMode = RetrievalMode::OnePerGroup);
// A variable of `shape` sharded over `shardOver` members (default: the group
// size) of each group of `grouping`: member m holds shard m mod shardOver.
// Throws GraphError(InvalidCollective) when shardOver does not divide the
// group size.
ShardedVariable replicaShardedVariable(Graph& graph, std::string name, InitialValues hostData, Shape shape,
                                       std::optional<ReplicaGrouping> grouping = std::nullopt,
                                       std::optional<int64_t> shardOver = std::nullopt,
                                       TensorCategory category = TensorCategory::Weight,
                                       DType dtype = DType::Float32);
// A variable of `shape` sharded over all replicas and kept in buffer[entry];
// the buffer must have shape [ceil(n/R)] (its metaShape is set to `shape`).
// Needs a replication factor > 1 (GraphError(InvalidCollective)).
Tensor remoteReplicaShardedVariable(Graph& graph, std::string name, InitialValues hostData, Shape shape,
                                    RemoteBuffer buffer, int64_t entry = 0);

// --- Recomputation (PopART's Builder::recomputeOutputInBackwardPass) ---
// Marks the op that produces `t`: Recompute clones it into the backward pass
// (its outputs are not kept), Checkpoint keeps its outputs whatever
// SessionOptions::autoRecomputation chooses, Undefined leaves the choice to
// it. Throws GraphError(InvalidRecompute) for Recompute on an op that cannot
// be recomputed (Graph::setRecompute).
void recomputeOutputInBackwardPass(Tensor t, RecomputeType type = RecomputeType::Recompute);

// --- Virtual graphs (PopART's Builder::virtualGraph) ---
// Places the op that produces `t` on IPU `ipu` of its replica
// (OpNode::virtualGraph), read when SessionOptions::virtualGraphMode is
// Manual. Throws GraphError(InvalidVirtualGraph) for a negative `ipu`; an
// IPU at or above DeviceSpec::ipusPerReplica is refused by the session
// (ConfigError(VirtualGraphOutOfRange)).
void virtualGraph(Tensor t, int64_t ipu);

// --- Pipelining (PopART's Builder::pipelineStage) ---
// Puts the op that produces `t` in pipeline stage `stage`
// (OpNode::pipelineStage), read when SessionOptions::enablePipelining. Throws
// GraphError(InvalidPipelineStage) for a negative `stage`; the session
// checks the stages against the ops' IPUs (sessions/transforms/pipeline.hpp).
void pipelineStage(Tensor t, int64_t stage);

// --- Phased execution (PopART's Builder::executionPhase) ---
// Puts the op that produces `t` in execution phase `phase`
// (OpNode::executionPhase), read when SessionOptions::virtualGraphMode is
// ExecutionPhases. Throws GraphError(InvalidExecutionPhase) for a negative
// `phase`; the session checks it against executionPhaseSettings.phases
// (sessions/transforms/execution_phases.hpp).
void executionPhase(Tensor t, int64_t phase);

}  // namespace ops
}  // namespace tessera
