// The graph IR: a per-replica (SPMD) program of tensors and ops.
//
// A Graph describes what ONE replica computes; the graph knows the global
// replication factor so that sharded variables and collectives can size
// themselves. Shapes are per replica: an input of shape [B, 784] is fed by the
// host as [R, B, 784] for R local replicas. Ops are a closed set (OpKind), each
// with shape inference and a gradient rule (autodiff.hpp). Transforms
// (sessions/) rewrite graphs with the same public ops a user can write by
// hand, PopXL style (ops.hpp), which builds on the low-level methods here.
//
// Tensors and ops live in vectors addressed by integer ids. Sources (inputs,
// variables, constants) are ops without inputs, so every tensor has exactly
// one producer.
//
// Program order. An op runs after the producers of its inputs and after every
// op in its `after` list. Graph adds `after` edges itself so that state
// behaves in creation order, as a reader of the building code expects:
//  - an in-place op (ScaledAddInplace, CopyInplace) runs after every op
//    created before it that reads the same storage, and every op created
//    after it that reads that storage runs after it;
//  - RemoteLoad / RemoteStore on one buffer keep their creation order in the
//    same way (a store modifies the buffer, a load reads it).
// beginSequence()/endSequence() (PopXL's in_sequence) order every op created
// in between in creation order. addAfter() adds an arbitrary constraint.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/lib/enum_names.hpp"
#include "tessera/lib/input_settings.hpp"
#include "tessera/lib/replica_grouping.hpp"
#include "tessera/lib/reduction_type.hpp"
#include "tessera/lib/tensor_location.hpp"

namespace tessera {

// Element types. Float16 is IEEE half: stored as half, computed with float32
// arithmetic (GEMMs and reductions accumulate in float32) and rounded to
// nearest even when stored. Float64 is IEEE double: stored and computed as
// double by the ops that take it (OpDef::float64); other ops refuse it.
enum class DType { Float32, Int32, Float16, Float64 };

template <>
struct EnumNames<DType> {
  static constexpr std::string_view kTypeName = "DType";
  static constexpr std::array kNames = {std::pair{DType::Float32, std::string_view{"float32"}},
                                        std::pair{DType::Int32, std::string_view{"int32"}},
                                        std::pair{DType::Float16, std::string_view{"float16"}},
                                        std::pair{DType::Float64, std::string_view{"float64"}}};
};

// Bytes of one element on the device (and in checkpoints).
constexpr int64_t dtypeBytes(DType dtype) noexcept {
  return dtype == DType::Float16 ? 2 : dtype == DType::Float64 ? 8 : 4;
}
// Float slots one element takes in host and device float buffers: a float64
// element is its double's 8 bytes in two floats.
constexpr int64_t dtypeSlots(DType dtype) noexcept { return dtype == DType::Float64 ? 2 : 1; }
// Doubles as their bytes in two floats each (float64 constants, host and
// device buffers), and back.
inline std::vector<float> packDoubles(std::span<const double> values) {
  std::vector<float> packed(2 * values.size());
  if (!values.empty()) std::memcpy(packed.data(), values.data(), values.size() * sizeof(double));
  return packed;
}
inline std::vector<double> unpackDoubles(std::span<const float> packed) {
  std::vector<double> values(packed.size() / 2);
  if (!values.empty()) std::memcpy(values.data(), packed.data(), values.size() * sizeof(double));
  return values;
}
// float32, float16 or float64.
constexpr bool isFloating(DType dtype) noexcept { return dtype != DType::Int32; }

using Shape = std::vector<int64_t>;

// Product of the dimensions (1 for a scalar). Throws GraphError(ShapeMismatch)
// on a negative dimension or overflow.
int64_t numElements(const Shape& shape);
// "[2, 3]"
std::string shapeStr(const Shape& shape);

// How the host reads a grouped variable back (PopXL's retrieval modes).
enum class RetrievalMode {
  OnePerGroup,  // host shape [numGroups, ...] (the group dim omitted for one group)
  AllReplicas,  // host shape [R, ...]: every replica's copy
};

template <>
struct EnumNames<RetrievalMode> {
  static constexpr std::string_view kTypeName = "RetrievalMode";
  static constexpr std::array kNames = {
      std::pair{RetrievalMode::OnePerGroup, std::string_view{"OnePerGroup"}},
      std::pair{RetrievalMode::AllReplicas, std::string_view{"AllReplicas"}}};
};

// The built-in kinds. Ops added at run time (lib/op_def.hpp, registerOp) take
// values from kFirstExtensionOpKind on.
enum class OpKind : uint16_t {
  // Sources (no inputs, one output).
  Input,     // host-to-device stream, per replica data
  Variable,  // persistent state initialised from host data
  Constant,  // value baked into the program
  // Dense math.
  MatMul,       // [.., M, K] x [K, N] -> [.., M, N]; batched left operand allowed
  BatchMatMul,  // [B.., M, K] x [B.., K, N] -> [B.., M, N]: one product per batch index
  Add,          // numpy broadcasting for Add, Sub, Mul, Div
  Sub,
  Mul,
  Div,
  Neg,
  Relu,
  Gelu,  // tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  Tanh,
  Sigmoid,
  Exp,
  Log,
  Sqrt,
  Abs,
  Sign,  // -1, 0 or 1; zero gradient
  Erf,
  Reciprocal,           // 1 / x
  Softplus,             // log(1 + exp(x))
  LeakyRelu,            // x > 0 ? x : a x
  Elu,                  // x > 0 ? x : a (exp(x) - 1)
  Selu,                 // b (x > 0 ? x : a (exp(x) - 1))
  Clip,                 // min(max(x, a), b)
  Pow,                  // a ^ b, numpy broadcasting
  Softmax,              // along the last axis
  LogSoftmax,           // along the last axis
  SoftmaxCrossEntropy,  // logits [N, C] float, labels [N] int32 -> scalar (`reduction` Sum or Mean)
  ReduceSum,            // over `axes` (all when empty), `keepDims`
  ReduceMean,
  Reshape,           // to `shape`
  Transpose,         // permutation `axes`
  Slice,             // [starts, ends) on every axis
  Concat,            // along `axis`
  BroadcastTo,       // to `shape` (numpy rules)
  ScaledAddInplace,  // (x, y): x = a*x + b*y; the output aliases x
  Copy,              // y = x
  CopyInplace,       // (dst, src): dst = src; the output aliases dst
  ArgMax,            // along the last axis, int32 output, no gradient
  Gather,            // (data [V, D...], indices int32 [I...]) -> rows [I..., D...]
  // Convolution and pooling over NC[D]HW tensors (1-3 spatial axes): `strides`, `pads` (every axis's
  // begin, then every axis's end), `dilations`, `group`; pools take `kernel`.
  Conv,           // (x [N, C, D..], w [M, C/group, K..]) -> [N, M, O..]
  ConvTranspose,  // (x [N, C, D..], w [C, M/group, K..]) -> [N, M, O..], `outputPadding`
  MaxPool,        // x [N, C, D..] -> [N, C, O..], `ceilMode`
  AveragePool,    // x [N, C, D..] -> [N, C, O..], `ceilMode`, `countIncludePad`
  // Recurrences (ONNX RNN, GRU, LSTM with the default activations) over x [S, B, I], the packed
  // weights [D, G*H, I+H+2] (each gate row's input weights, recurrent weights, input bias and
  // recurrent bias; ONNX's gate order) and the initial state [D, B, H] ([D, B, 2H] for Lstm: h, c):
  // the states [S+1, D, B, K*H] (per step h, c and the gates the gradient reads; the initial state
  // at step S), `direction`; Gru also `linearBeforeReset`. ops::recurrence builds them.
  Rnn,   // tanh cell, G = 1, K = 1: h
  Gru,   // gates z, r, h: G = 3, K = 5: h, z, r, n, the reset input r multiplies
  Lstm,  // gates i, o, f, c: G = 4, K = 6: h, c, i, o, f, g
  // Masks: float32 tensors of 0 and 1 (1 = true); every input non-zero counts
  // as true. Comparisons and logic broadcast (numpy rules) and have no gradient.
  Equal,    // (a, b) -> a == b, of two float32 or two int32 values
  Less,     // a < b
  Greater,  // a > b
  Not,      // x == 0
  And,      // a != 0 && b != 0
  Or,       // a != 0 || b != 0
  Where,    // (cond, x, y) -> cond != 0 ? x : y, the three broadcast; a select, so -inf in y is kept
  Dropout,  // (x, step int32 []) -> x * mask / (1 - a), the mask drawn from (seed b, step, global element)
  CastToInt32,    // float32 or float16 -> int32, truncated toward zero; no gradient
  CastToFloat32,  // int32 -> float32 (the same value, no gradient) or float16 -> float32 (exact)
  CastToFloat16,  // float32 -> float16, round to nearest even; the gradient is the cast back
  CastToFloat64,  // int32, float32 or float16 -> float64 (exact); the gradient is the cast back
  // Gradient helpers, produced by autodiff (also usable directly).
  ReluGrad,                 // (dy, x) -> dy * (x > 0)
  GeluGrad,                 // (dy, x) -> dy * gelu'(x)
  LeakyReluGrad,            // (dy, x) -> dy * leakyRelu'(x), slope `a`
  EluGrad,                  // (dy, x) -> dy * elu'(x), `a`
  SeluGrad,                 // (dy, x) -> dy * selu'(x), `a`, `b`
  ClipGrad,                 // (dy, x) -> dy where a <= x <= b, else 0
  SoftmaxCrossEntropyGrad,  // (dloss, logits, labels) -> dlogits
  ReduceToShape,            // sum a broadcast value back to `shape`
  SlicePad,                 // zeros of `shape` with [starts, ends) filled from the input
  GatherGrad,               // (dy, indices) -> zeros of `shape` with dy's rows added at the indices
  ConvGradWeight,           // (dy [N, M, O..], x [N, C, D..]) -> the gradient of Conv's weight, `shape`
  MaxPoolGrad,              // (dy, x) -> dy routed to the first maximum of each window
  AveragePoolGrad,          // dy -> dx of `shape`: each window's dy spread over the window
  // A recurrence's gradient (`cell` names Rnn, Gru or Lstm): back through time, then the inputs'.
  RecurrenceGrad,        // (dstates, states, weights) -> [S+1, D, B, 2*G*H]: per step the gradients of
                         // the gates' input and recurrent pre-activations; the initial state's at step S
  RecurrenceWeightGrad,  // (dpre, states, x) -> the packed weights' gradient [D, G*H, I+H+2]
  RecurrenceInputGrad,   // (dpre, weights) -> x's gradient [S, B, I]
  // Collectives over a ReplicaGrouping of the replicas (`grouping`; nullopt =
  // all replicas). Sharded values use ShardLayout(n, groupSize).
  ReplicatedAllReduce,      // Sum or Mean over each group; same shape
  ReplicatedReduceScatter,  // reduce over the group, keep shard indexInGroup: [ceil(n/g)], metaShape = input
                            // shape
  ReplicatedAllGather,      // shards of the group -> `shape`, else the input's metaShape, else [g*s]
  ReplicaShardedSlice,      // this replica's shard of its own value (no reduction)
  ReplicaShardedPad,  // this replica's shard placed into zeros of `shape` (ReplicaShardedSlice's gradient)
  // Streaming memory: `remoteBuffer`, `entry`. Every replica has its own copy of a buffer.
  RemoteLoad,   // buffer[entry] -> tensor
  RemoteStore,  // tensor -> buffer[entry]; no output
  // Between the IPUs of one replica (virtual graphs).
  IpuCopy,  // y = x, moved from the IPU of x's producer to this op's (OpNode::virtualGraph)
  // Elements picked or written by index along `axis` (ONNX GatherElements, ScatterElements): indices
  // int32 of the data's rank, each extent at most the data's, each index in [-V, V).
  GatherElements,   // (data, indices) -> [indices' shape]: data with the axis coordinate replaced
  ScatterElements,  // (data, indices, updates [indices' shape]) -> data, out[index] = a*out[index] + update
                    // in index order (a = 0: ONNX's reduction none; a = 1: add)
  // Batch normalisation in training mode over x [N, C, ...] (statistics per channel C over N and the
  // spatial axes, M values a channel), epsilon `a`.
  BatchNormStats,      // x -> [2, C]: each channel's mean and (population) variance, summed in double
  BatchNorm,           // (x, stats = BatchNormStats(x), affine [2, C]: scale, bias) -> y, x's shape
  BatchNormGradStats,  // (dy, x, stats) -> [2, C]: sum(dy * xhat) and sum(dy), the affine's gradient
  BatchNormGrad,       // (dy, x, [6, C]: stats, BatchNormGradStats, affine) -> dx
};

template <>
struct EnumNames<OpKind> {
  static constexpr std::string_view kTypeName = "OpKind";
  static constexpr std::array kNames = {
      std::pair{OpKind::Input, std::string_view{"Input"}},
      std::pair{OpKind::Variable, std::string_view{"Variable"}},
      std::pair{OpKind::Constant, std::string_view{"Constant"}},
      std::pair{OpKind::MatMul, std::string_view{"MatMul"}},
      std::pair{OpKind::BatchMatMul, std::string_view{"BatchMatMul"}},
      std::pair{OpKind::Add, std::string_view{"Add"}},
      std::pair{OpKind::Sub, std::string_view{"Sub"}},
      std::pair{OpKind::Mul, std::string_view{"Mul"}},
      std::pair{OpKind::Div, std::string_view{"Div"}},
      std::pair{OpKind::Neg, std::string_view{"Neg"}},
      std::pair{OpKind::Relu, std::string_view{"Relu"}},
      std::pair{OpKind::Gelu, std::string_view{"Gelu"}},
      std::pair{OpKind::Tanh, std::string_view{"Tanh"}},
      std::pair{OpKind::Sigmoid, std::string_view{"Sigmoid"}},
      std::pair{OpKind::Exp, std::string_view{"Exp"}},
      std::pair{OpKind::Log, std::string_view{"Log"}},
      std::pair{OpKind::Sqrt, std::string_view{"Sqrt"}},
      std::pair{OpKind::Abs, std::string_view{"Abs"}},
      std::pair{OpKind::Sign, std::string_view{"Sign"}},
      std::pair{OpKind::Erf, std::string_view{"Erf"}},
      std::pair{OpKind::Reciprocal, std::string_view{"Reciprocal"}},
      std::pair{OpKind::Softplus, std::string_view{"Softplus"}},
      std::pair{OpKind::LeakyRelu, std::string_view{"LeakyRelu"}},
      std::pair{OpKind::Elu, std::string_view{"Elu"}},
      std::pair{OpKind::Selu, std::string_view{"Selu"}},
      std::pair{OpKind::Clip, std::string_view{"Clip"}},
      std::pair{OpKind::Pow, std::string_view{"Pow"}},
      std::pair{OpKind::Softmax, std::string_view{"Softmax"}},
      std::pair{OpKind::LogSoftmax, std::string_view{"LogSoftmax"}},
      std::pair{OpKind::SoftmaxCrossEntropy, std::string_view{"SoftmaxCrossEntropy"}},
      std::pair{OpKind::ReduceSum, std::string_view{"ReduceSum"}},
      std::pair{OpKind::ReduceMean, std::string_view{"ReduceMean"}},
      std::pair{OpKind::Reshape, std::string_view{"Reshape"}},
      std::pair{OpKind::Transpose, std::string_view{"Transpose"}},
      std::pair{OpKind::Slice, std::string_view{"Slice"}},
      std::pair{OpKind::Concat, std::string_view{"Concat"}},
      std::pair{OpKind::BroadcastTo, std::string_view{"BroadcastTo"}},
      std::pair{OpKind::ScaledAddInplace, std::string_view{"ScaledAddInplace"}},
      std::pair{OpKind::Copy, std::string_view{"Copy"}},
      std::pair{OpKind::CopyInplace, std::string_view{"CopyInplace"}},
      std::pair{OpKind::ArgMax, std::string_view{"ArgMax"}},
      std::pair{OpKind::Gather, std::string_view{"Gather"}},
      std::pair{OpKind::Conv, std::string_view{"Conv"}},
      std::pair{OpKind::ConvTranspose, std::string_view{"ConvTranspose"}},
      std::pair{OpKind::MaxPool, std::string_view{"MaxPool"}},
      std::pair{OpKind::AveragePool, std::string_view{"AveragePool"}},
      std::pair{OpKind::Rnn, std::string_view{"Rnn"}},
      std::pair{OpKind::Gru, std::string_view{"Gru"}},
      std::pair{OpKind::Lstm, std::string_view{"Lstm"}},
      std::pair{OpKind::Equal, std::string_view{"Equal"}},
      std::pair{OpKind::Less, std::string_view{"Less"}},
      std::pair{OpKind::Greater, std::string_view{"Greater"}},
      std::pair{OpKind::Not, std::string_view{"Not"}},
      std::pair{OpKind::And, std::string_view{"And"}},
      std::pair{OpKind::Or, std::string_view{"Or"}},
      std::pair{OpKind::Where, std::string_view{"Where"}},
      std::pair{OpKind::Dropout, std::string_view{"Dropout"}},
      std::pair{OpKind::CastToInt32, std::string_view{"CastToInt32"}},
      std::pair{OpKind::CastToFloat32, std::string_view{"CastToFloat32"}},
      std::pair{OpKind::CastToFloat16, std::string_view{"CastToFloat16"}},
      std::pair{OpKind::CastToFloat64, std::string_view{"CastToFloat64"}},
      std::pair{OpKind::ReluGrad, std::string_view{"ReluGrad"}},
      std::pair{OpKind::GeluGrad, std::string_view{"GeluGrad"}},
      std::pair{OpKind::LeakyReluGrad, std::string_view{"LeakyReluGrad"}},
      std::pair{OpKind::EluGrad, std::string_view{"EluGrad"}},
      std::pair{OpKind::SeluGrad, std::string_view{"SeluGrad"}},
      std::pair{OpKind::ClipGrad, std::string_view{"ClipGrad"}},
      std::pair{OpKind::SoftmaxCrossEntropyGrad, std::string_view{"SoftmaxCrossEntropyGrad"}},
      std::pair{OpKind::ReduceToShape, std::string_view{"ReduceToShape"}},
      std::pair{OpKind::SlicePad, std::string_view{"SlicePad"}},
      std::pair{OpKind::GatherGrad, std::string_view{"GatherGrad"}},
      std::pair{OpKind::ConvGradWeight, std::string_view{"ConvGradWeight"}},
      std::pair{OpKind::MaxPoolGrad, std::string_view{"MaxPoolGrad"}},
      std::pair{OpKind::AveragePoolGrad, std::string_view{"AveragePoolGrad"}},
      std::pair{OpKind::RecurrenceGrad, std::string_view{"RecurrenceGrad"}},
      std::pair{OpKind::RecurrenceWeightGrad, std::string_view{"RecurrenceWeightGrad"}},
      std::pair{OpKind::RecurrenceInputGrad, std::string_view{"RecurrenceInputGrad"}},
      std::pair{OpKind::ReplicatedAllReduce, std::string_view{"ReplicatedAllReduce"}},
      std::pair{OpKind::ReplicatedReduceScatter, std::string_view{"ReplicatedReduceScatter"}},
      std::pair{OpKind::ReplicatedAllGather, std::string_view{"ReplicatedAllGather"}},
      std::pair{OpKind::ReplicaShardedSlice, std::string_view{"ReplicaShardedSlice"}},
      std::pair{OpKind::ReplicaShardedPad, std::string_view{"ReplicaShardedPad"}},
      std::pair{OpKind::RemoteLoad, std::string_view{"RemoteLoad"}},
      std::pair{OpKind::RemoteStore, std::string_view{"RemoteStore"}},
      std::pair{OpKind::IpuCopy, std::string_view{"IpuCopy"}},
      std::pair{OpKind::GatherElements, std::string_view{"GatherElements"}},
      std::pair{OpKind::ScatterElements, std::string_view{"ScatterElements"}},
      std::pair{OpKind::BatchNormStats, std::string_view{"BatchNormStats"}},
      std::pair{OpKind::BatchNorm, std::string_view{"BatchNorm"}},
      std::pair{OpKind::BatchNormGradStats, std::string_view{"BatchNormGradStats"}},
      std::pair{OpKind::BatchNormGrad, std::string_view{"BatchNormGrad"}},
  };
};

inline constexpr uint16_t kFirstExtensionOpKind = 1024;

// Which way a recurrence runs over the sequence (ONNX's `direction`):
// Forward from step 0, Reverse from the last step, Bidirectional both (D = 2:
// direction 0 forward, 1 reverse).
enum class RecurrenceDirection { Forward, Reverse, Bidirectional };

template <>
struct EnumNames<RecurrenceDirection> {
  static constexpr std::string_view kTypeName = "RecurrenceDirection";
  static constexpr std::array kNames = {
      std::pair{RecurrenceDirection::Forward, std::string_view{"Forward"}},
      std::pair{RecurrenceDirection::Reverse, std::string_view{"Reverse"}},
      std::pair{RecurrenceDirection::Bidirectional, std::string_view{"Bidirectional"}}};
};

// The traits of a kind, from the op table (lib/op_def.hpp).
// True for the kinds whose output aliases (modifies) their first input.
bool isInplace(OpKind kind);
// True for the kinds that compute each output element from the same element
// of their inputs (one-element inputs broadcast): they can run on shards.
bool isElementwise(OpKind kind);
// True for the collectives (ops that read other replicas' values).
bool isCollective(OpKind kind);
// The kind's name: its enumerator's for the built-in kinds, the registered
// name for ops added at run time; "<invalid>" for an unknown kind.
std::string_view opName(OpKind kind) noexcept;

// Attributes of an op; each kind reads only the fields it needs.
struct OpAttributes {
  std::vector<int64_t> axes{};  // ReduceSum/Mean, Transpose (permutation)
  bool keepDims = false;        // ReduceSum/Mean
  Shape shape{};  // Reshape, BroadcastTo, ReduceToShape, SlicePad, ReplicaShardedPad, AllGather,
                  // GatherGrad (the table's)
  std::vector<int64_t> starts{};  // Slice, SlicePad
  std::vector<int64_t> ends{};    // Slice, SlicePad
  int64_t axis = 0;               // Concat, Gather, GatherGrad, GatherElements, ScatterElements
  double a = 1.0;                 // ScaledAddInplace: x = a*x + b*y; LeakyRelu, Elu, Selu: alpha; Clip: min;
                                  // ScatterElements: 0 replaces, 1 adds
  double b = 1.0;                 // Selu: gamma; Clip: max
  ReductionType reduction = ReductionType::Sum;  // collectives, SoftmaxCrossEntropy
  std::optional<ReplicaGrouping> grouping{};     // collectives: the groups; nullopt = all replicas
  int64_t remoteBuffer = -1;                     // RemoteLoad/Store: buffer id
  int64_t entry = 0;                             // RemoteLoad/Store: entry index
  // Convolutions and pools (one entry per spatial axis; the shape rule fills the defaults).
  std::vector<int64_t> kernel{};         // pools: the window
  std::vector<int64_t> strides{};        // default 1
  std::vector<int64_t> pads{};           // begin of every axis, then end of every axis; default 0
  std::vector<int64_t> dilations{};      // default 1
  std::vector<int64_t> outputPadding{};  // ConvTranspose: added at the end of each output axis; default 0
  int64_t group = 1;                     // Conv, ConvTranspose, ConvGradWeight: channel groups
  bool ceilMode = false;                 // pools: the last partial window counts
  bool countIncludePad = false;          // AveragePool: pads count in the divisor
  // Recurrences and their gradients.
  RecurrenceDirection direction = RecurrenceDirection::Forward;
  bool linearBeforeReset = false;  // Gru: r multiplies (R_h h + Rb_h) instead of h (PyTorch's GRU)
  OpKind cell = OpKind::Rnn;       // the gradients: the recurrence's kind (Rnn, Gru or Lstm)
  bool operator==(const OpAttributes&) const = default;
};

using TensorId = int32_t;
using OpId = int32_t;
inline constexpr TensorId kNoTensor = -1;
inline constexpr OpId kNoOp = -1;

// The initial host values of a Variable: explicit values (shared, so that
// copies of a graph share them), or values made on demand by a generator
// (zeros, a seeded distribution). Planning (validate, explain, the memory
// plan and its suggestions) reads only the count; a session makes the values
// when it loads the variable onto the device, so a model far larger than the
// host can be planned. Converts implicitly from a vector of values.
class InitialValues {
 public:
  using Generator = std::function<void(std::span<float>)>;

  InitialValues() = default;
  InitialValues(
      std::vector<float> values);  // NOLINT(google-explicit-constructor): values are the common case
  InitialValues(std::initializer_list<float> values) : InitialValues(std::vector<float>(values)) {}
  // `elements` copies of `value`.
  static InitialValues filled(int64_t elements, float value);
  // `elements` values written by `generate` (into a span of exactly that
  // size) each time they are needed; `identity` names the values (the
  // generator and its seed), for fingerprints.
  static InitialValues generated(int64_t elements, std::string identity, Generator generate);

  int64_t elements() const noexcept { return elements_; }
  // Every value, made now when generated.
  std::vector<float> values() const;
  // Writes every value into `out` (out.size() == elements()).
  void fill(std::span<float> out) const;
  // The explicit values, or null when they are generated.
  const std::vector<float>* explicitValues() const noexcept { return values_.get(); }
  // What generates them ("zeros", "normal(seed 7, stddev 0.05)"); empty for explicit values.
  const std::string& identity() const noexcept { return identity_; }

 private:
  std::shared_ptr<const std::vector<float>> values_;
  std::shared_ptr<const Generator> generate_;
  int64_t elements_ = 0;
  std::string identity_;
};

struct TensorNode {
  std::string name;
  DType dtype = DType::Float32;
  Shape shape;  // per replica
  TensorCategory category = TensorCategory::Activation;
  OpId producer = kNoOp;
  std::vector<OpId> consumers;
  // The tensor whose storage this one shares (the output of an in-place op
  // aliases its first input's storage); kNoTensor when it owns its storage.
  TensorId aliasOf = kNoTensor;
  // Variables: grouping over replicas (nullopt: one group of all replicas),
  // retrieval mode, and host initial values [numGroups, ...hostShape] (group
  // dim omitted for one group; hostShape is metaShape when sharded, else
  // shape), made on demand (InitialValues).
  std::optional<ReplicaGrouping> grouping;
  RetrievalMode retrievalMode = RetrievalMode::OnePerGroup;
  InitialValues initial;
  // Constants: their value. Int32 values are stored exactly as floats;
  // float64 values as their doubles' bytes, two floats per element
  // (dtypeSlots).
  std::vector<float> data;
  // Sharded tensors: the full (unsharded) shape; shape is then [ceil(n/k)].
  // Empty when not sharded. Collectives set it on their sharded outputs.
  Shape metaShape;
  // Sharded variables: the number of shards k; member m of a variable group
  // holds shard m mod k of ShardLayout(n, k), unless shardDomain is set:
  // then replica r holds shard shardDomain->indexInGroupAt(r) (a sharding
  // domain such as Orthogonal, whose groups are not runs of the variable's
  // group). See shardIndexAt().
  int64_t shardCount = 1;
  std::optional<ReplicaGrouping> shardDomain;
  // The tile set whose memory holds the tensor's on-chip bytes: IO for
  // tensors staged or kept on the IO tiles (SessionOptions::numIOTiles).
  TileSet tileSet = TileSet::Compute;
  // Inputs: how the host stream reaches the device (tessera/lib/input_settings.hpp).
  // Only the modelled time and memory depend on it, never the numbers.
  InputSettings inputSettings{};
  // Variables kept in a remote buffer (remoteVariable and friends): their
  // initial value is written to buffer[remoteEntry] on every replica.
  int64_t remoteBuffer = -1;
  int64_t remoteEntry = 0;
};

// The shard of a sharded variable that global replica `replica` holds.
int64_t shardIndexAt(const TensorNode& node, int64_t replicationFactor, int64_t replica);

// What becomes of an op's outputs in the backward pass (PopART's
// RecomputeType): kept (Checkpoint) or recomputed from the nearest kept
// values (Recompute). Undefined leaves the choice to
// SessionOptions::autoRecomputation; the recomputation transform marks its
// clones Recomputed.
enum class RecomputeType { Undefined, Checkpoint, Recompute, Recomputed };

template <>
struct EnumNames<RecomputeType> {
  static constexpr std::string_view kTypeName = "RecomputeType";
  static constexpr std::array kNames = {std::pair{RecomputeType::Undefined, std::string_view{"Undefined"}},
                                        std::pair{RecomputeType::Checkpoint, std::string_view{"Checkpoint"}},
                                        std::pair{RecomputeType::Recompute, std::string_view{"Recompute"}},
                                        std::pair{RecomputeType::Recomputed, std::string_view{"Recomputed"}}};
};

// OpNode::virtualGraph of an op that names no IPU.
inline constexpr int64_t kNoVirtualGraph = -1;
// OpNode::pipelineStage of an op that names no stage; OpNode::microBatch of
// an op that runs once per step.
inline constexpr int64_t kNoPipelineStage = -1;
inline constexpr int64_t kNoMicroBatch = -1;
// OpNode::executionPhase of an op that names no phase.
inline constexpr int64_t kNoExecutionPhase = -1;

struct OpNode {
  OpKind kind = OpKind::Input;
  std::vector<TensorId> inputs;
  std::vector<TensorId> outputs;
  OpAttributes attributes;
  std::string name;
  // Recomputation (set by ops::recomputeOutputInBackwardPass or an ONNX
  // node's __recompute_output_in_backward_pass attribute).
  RecomputeType recompute = RecomputeType::Undefined;
  // Part of a normalisation (layer, batch, group or instance norm): what
  // RecomputationType::NormOnly recomputes. Set by the builders that expand
  // a normalisation into ops (markNormalisation).
  bool normalisation = false;
  // The IPU of the replica this op runs on (PopART's virtual graph id):
  // kNoVirtualGraph until ops::virtualGraph, an ONNX node's __ipu_number or
  // the virtual graph transform sets it. Read only when the session's
  // virtualGraphMode is not Off; a program without it runs on IPU 0.
  int64_t virtualGraph = kNoVirtualGraph;
  // The pipeline stage (PopART's pipelineStage): kNoPipelineStage until
  // ops::pipelineStage or an ONNX node's __pipeline_stage sets it. Read only
  // when SessionOptions::enablePipelining; the pipelining transform then
  // numbers every op's stage as PopART does (sessions/transforms/pipeline.hpp).
  int64_t pipelineStage = kNoPipelineStage;
  // The execution phase (PopART's executionPhase): kNoExecutionPhase until
  // ops::executionPhase, an ONNX node's __execution_phase or the virtual
  // graph transform sets it. Read only when virtualGraphMode is
  // ExecutionPhases (sessions/transforms/virtual_graph.hpp).
  int64_t executionPhase = kNoExecutionPhase;
  // The micro-batch of the step this op computes (set by gradient
  // accumulation), kNoMicroBatch for an op that runs once per step.
  int64_t microBatch = kNoMicroBatch;
  // Ops that must run before this one although no data may flow between
  // them (see the program order rules at the top of this file).
  std::vector<OpId> after;
};

struct RemoteBufferInfo {
  Shape shape;  // per entry, per replica
  DType dtype = DType::Float32;
  int64_t entries = 1;
  Shape metaShape;  // the unsharded shape when the buffer holds shards
};

class Graph {
 public:
  // `replicationFactor` is the global number of replicas the program will
  // run on (PopXL's ir.replication_factor): sharded variables and
  // collectives without an explicit grouping use it. Throws
  // GraphError(InvalidOperand) when it is not positive.
  explicit Graph(int64_t replicationFactor = 1);
  Graph(const Graph&) = default;
  Graph& operator=(const Graph&) = default;
  Graph(Graph&&) noexcept = default;
  Graph& operator=(Graph&&) noexcept = default;

  int64_t replicationFactor() const noexcept { return replicationFactor_; }
  std::span<const TensorNode> tensors() const noexcept { return tensors_; }
  std::span<const OpNode> ops() const noexcept { return ops_; }
  std::span<const RemoteBufferInfo> remoteBuffers() const noexcept { return remoteBuffers_; }
  // Throw GraphError(UnknownTensor) / (InvalidOperand) for an id out of range.
  const TensorNode& tensor(TensorId id) const;
  TensorNode& tensor(TensorId id);
  const OpNode& op(OpId id) const;
  const RemoteBufferInfo& remoteBuffer(int64_t id) const;
  // Throws GraphError(UnknownTensor) naming the tensor.
  TensorId find(std::string_view name) const;
  std::optional<TensorId> tryFind(std::string_view name) const;
  // The tensor that owns t's storage (t itself unless t is an in-place output).
  TensorId storageOf(TensorId t) const;

  // Low-level construction used by ops.hpp and transforms.
  // addSource adds an Input, Variable or Constant op whose output is `node`
  // (its name must be unused: GraphError(DuplicateTensorName)).
  TensorId addSource(OpKind kind, TensorNode node);
  // addOp checks operands and attributes (GraphError naming the op, the
  // tensors and their shapes), infers the outputs, names them after the op,
  // and links producers, consumers and program order. `name` defaults to the
  // kind's name; it is made unique.
  OpId addOp(OpKind kind, std::vector<TensorId> inputs, OpAttributes attributes = {}, std::string name = {});
  // Throws GraphError(InvalidRemoteBuffer) for entries < 1 or a bad shape.
  int64_t addRemoteBuffer(RemoteBufferInfo info);
  // Sets a buffer's metaShape (the first sharded variable stored in it does).
  void setRemoteBufferMetaShape(int64_t id, Shape metaShape);
  // `base` when no tensor has that name, else the first free "base.1", "base.2", ...
  std::string uniqueName(std::string_view base);
  // Renames a tensor; throws GraphError(DuplicateTensorName) when taken.
  void rename(TensorId id, std::string name);

  // Sets an op's RecomputeType; Recompute on a source, an in-place, remote
  // or collective op, which cannot be recomputed, throws
  // GraphError(InvalidRecompute) naming the op. Recomputed is the
  // transform's own mark and is refused too.
  void setRecompute(OpId op, RecomputeType type);
  // Places an op on IPU `ipu` of its replica (OpNode::virtualGraph);
  // kNoVirtualGraph clears it. Throws GraphError(InvalidVirtualGraph) for
  // any other negative value, naming the op.
  void setVirtualGraph(OpId op, int64_t ipu);
  // Sets an op's pipeline stage (OpNode::pipelineStage); kNoPipelineStage
  // clears it. Throws GraphError(InvalidPipelineStage) for any other
  // negative value, naming the op.
  void setPipelineStage(OpId op, int64_t stage);
  // Sets an op's execution phase (OpNode::executionPhase);
  // kNoExecutionPhase clears it. Throws GraphError(InvalidExecutionPhase)
  // for any other negative value, naming the op.
  void setExecutionPhase(OpId op, int64_t phase);
  // Sets the micro-batch an op computes (OpNode::microBatch), unchecked.
  void setMicroBatch(OpId op, int64_t microBatch);
  // Marks the ops from `first` to the last op created as a normalisation.
  void markNormalisation(OpId first);
  // True for the ops the recomputation transform may clone.
  bool canRecompute(OpId op) const;
  // Gives op `to` the recompute and normalisation marks, the virtual
  // graph, the pipeline stage, the execution phase and the micro-batch of `from` (an op of another graph that `to` copies), unchecked:
  // transforms that copy ops.
  void copyRecomputeMarks(OpId to, const OpNode& from);

  // `op` runs after `before`. Throws GraphError(InvalidOperand) on bad ids;
  // a cycle is reported by schedule().
  void addAfter(OpId op, OpId before);
  // Explicit program order (PopXL's in_sequence): between beginSequence()
  // and endSequence(), every new op runs after the previous new op. Nests.
  void beginSequence();
  // Throws GraphError(InvalidProgramOrder) without a matching beginSequence().
  void endSequence();

  // Ops in an order that respects data flow and every `after` constraint;
  // among ready ops the earliest created runs first. O((ops + edges) log ops).
  // Throws GraphError(InvalidProgramOrder) on a cycle, naming an op on it.
  std::vector<OpId> schedule() const;

 private:
  // Per storage (or remote buffer): the last op that modified it and the
  // ops that read it since.
  struct StateOrder {
    OpId lastWriter = kNoOp;
    std::vector<OpId> readersSinceWrite;
  };
  void orderState(StateOrder& state, OpId op, bool writes);
  OpId pushOp(OpNode node);

  std::vector<TensorNode> tensors_;
  std::vector<OpNode> ops_;
  std::vector<RemoteBufferInfo> remoteBuffers_;
  std::unordered_map<std::string, TensorId> names_;
  std::unordered_map<std::string, int64_t> nextSuffix_;  // where uniqueName's search resumes
  std::unordered_map<TensorId, StateOrder> storageOrder_;
  std::unordered_map<int64_t, StateOrder> bufferOrder_;
  int64_t replicationFactor_ = 1;
  int sequenceDepth_ = 0;
  OpId lastInSequence_ = kNoOp;
};

}  // namespace tessera

// OpKinds print by opName, so that ops added at run time print their names.
template <>
struct fmt::formatter<tessera::OpKind> : fmt::formatter<std::string_view> {
  template <class Context>
  auto format(tessera::OpKind kind, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(tessera::opName(kind), ctx);
  }
};
