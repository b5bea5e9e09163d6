// The op table: what each OpKind is, in one record per op.
//
// An op is defined once, by its family (lib/ops/<family>.cc): its traits,
// its shape rule, its gradient rule, its double-precision reference and its
// cost. Shape inference (Graph::addOp), autodiff, the reference evaluator of
// the tests and the device's time model read the record instead of switching
// over every kind. The device's kernels live in the family's file of
// simdevice/ops/ and register in the device's own table (simdevice/
// kernel_table.hpp): the core never sees the device.
//
// The table is built in code, family by family, on first use (opTable()
// lists the families); nothing registers itself from a static initializer.
// registerOp() adds an op at run time: an embedder's own op, or a test's.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/lib/error.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/lib/ops.hpp"

namespace tessera {

enum class OpFamily {
  Source,
  Elementwise,
  MatMul,
  Reduction,
  ShapeOp,
  Softmax,
  Gather,
  Conv,
  Pooling,
  Recurrence,
  Normalization,
  Mask,
  Collective,
  Remote,
  Extension
};

// What an op's work is to the time model.
enum class OpWork {
  None,        // sources and views: no work of their own
  Compute,     // arithmetic on the tiles (OpCost::flops)
  Collective,  // data between replicas over the links (OpCost::linkBytes)
  Streaming,   // data between the tiles and streaming memory (OpCost::streamedBytes)
  InterIpu,    // data between the IPUs of one replica over the IPU-Links (OpCost::ipuLinkBytes)
};

struct OutputSpec {
  Shape shape;
  DType dtype = DType::Float32;
  Shape metaShape;
};

// The operand checks of one op, with the op's name as the subject of every
// error (GraphError naming the op, the tensors and their shapes, and what is
// allowed).
class OpChecker {
 public:
  OpChecker(const Graph& graph, OpKind kind, std::span<const TensorId> inputs, std::string_view opName)
      : graph_(graph), kind_(kind), inputs_(inputs), opName_(opName) {}

  [[noreturn]] void fail(ErrorCode code, std::string_view message) const;

  const Graph& graph() const noexcept { return graph_; }
  OpKind kind() const noexcept { return kind_; }
  std::size_t inputCount() const noexcept { return inputs_.size(); }
  const TensorNode& in(std::size_t i) const { return graph_.tensor(inputs_[i]); }
  const Shape& shape(std::size_t i) const { return in(i).shape; }
  int64_t rank(std::size_t i) const { return static_cast<int64_t>(shape(i).size()); }
  // "\"x\" [2, 3] float32"
  std::string desc(std::size_t i) const;

  void arity(std::size_t expected) const;
  void dtype(std::size_t i, DType expected) const;
  // The float operands `indices` (float32, float16 or float64) share one dtype, which
  // is returned: the dtype of the op's float outputs. InvalidOperand for an
  // operand that is not floating; DTypeMismatch for float16 beside float32
  // (naming both tensors: cast one with ops::cast).
  DType floating(std::initializer_list<std::size_t> indices) const;
  // Input j has input i's dtype: DTypeMismatch when both are floating but
  // differ, InvalidOperand otherwise.
  void sameDType(std::size_t i, std::size_t j) const;
  void minRank(std::size_t i, int64_t r) const;
  void sameShape(std::size_t i, std::size_t j) const;
  // `axis` made non-negative; InvalidAxis unless it is in [-r, r).
  int64_t axis(int64_t axis, int64_t r) const;
  // The collective's grouping, the default (all replicas) made explicit.
  ReplicaGrouping grouping(OpAttributes& attributes) const;
  // A 1-D shard [s] of a full shape over g shards must have s = ceil(n/g).
  void shardFits(const Shape& full, int64_t groupSize) const;

  // Output 0 with input i's shape and dtype (no metaShape).
  std::vector<OutputSpec> same(std::size_t i) const { return {{shape(i), in(i).dtype, {}}}; }

 private:
  const Graph& graph_;
  OpKind kind_;
  std::span<const TensorId> inputs_;
  std::string_view opName_;
};

// The gradient rule's view of one op. The op is a copy: rules add ops, which
// may reallocate the graph's op list.
struct GradientContext {
  Graph& graph;
  OpNode op;
  Tensor dy;                     // the gradient of output 0
  std::span<const char> wanted;  // per input; empty: every input

  Tensor in(std::size_t i) const { return {&graph, op.inputs[i]}; }
  Tensor out(std::size_t i) const { return {&graph, op.outputs[i]}; }
  const OpAttributes& attributes() const noexcept { return op.attributes; }
  bool isWanted(std::size_t i) const { return wanted.empty() || wanted[i] != 0; }
  // A new op's output 0 (for the kinds ops.hpp has no builder for).
  Tensor make(OpKind kind, std::vector<TensorId> inputs, OpAttributes attributes) const;
};

// The reference evaluator's view of one op (tests/support): every value is a
// vector of doubles in row-major order, per replica.
class ReferenceOp {
 public:
  ReferenceOp(const Graph& graph, const OpNode& op) : graph_(graph), op_(op) {}
  virtual ~ReferenceOp() = default;

  const Graph& graph() const noexcept { return graph_; }
  const OpNode& op() const noexcept { return op_; }
  const OpAttributes& attributes() const noexcept { return op_.attributes; }
  const Shape& inShape(std::size_t i) const { return graph_.tensor(op_.inputs[i]).shape; }
  const Shape& outShape() const { return graph_.tensor(op_.outputs[0]).shape; }

  virtual int64_t replicas() const = 0;
  // Input i's value on `replica`, and output 0's value there (sized by the
  // rule; an in-place op's output is its first input's storage).
  virtual const std::vector<double>& in(std::size_t i, int64_t replica) const = 0;
  virtual std::vector<double>& out(int64_t replica) = 0;
  // What the host fed this Input op on `replica`.
  virtual const std::vector<double>& feed(int64_t replica) const = 0;
  // A remote buffer entry of `replica`.
  virtual std::vector<double>& remote(int64_t buffer, int64_t entry, int64_t replica) = 0;
  // Throws InternalError naming the op.
  [[noreturn]] void fail(std::string_view message) const;

 private:
  const Graph& graph_;
  const OpNode& op_;
};

struct OpCost {
  double flops = 0.0;          // per replica
  double linkBytes = 0.0;      // sent or received per replica (collectives)
  double streamedBytes = 0.0;  // moved to or from streaming memory per replica
  double ipuLinkBytes = 0.0;   // moved between two IPUs of a replica, per replica
};

struct OpDef {
  OpKind kind = OpKind::Input;
  // Empty for built-in kinds: their EnumNames name is used. Ops added at
  // run time name themselves; the text must outlive the table (a literal).
  std::string_view name{};
  OpFamily family = OpFamily::Extension;
  OpWork work = OpWork::Compute;
  // Each output element from the same element of each input (one-element
  // inputs broadcast): the op can run on shards, and the device may fuse it
  // into chains.
  bool elementwise = false;
  // Output 0 aliases (modifies) input 0.
  bool inplace = false;
  // Reads other replicas' values (or this replica's shard of a group value).
  bool collective = false;

  // Checks operands and attributes and returns the outputs; may normalise
  // the attributes (negative axes made positive, -1 in a Reshape resolved,
  // the default grouping made explicit). Null for sources, which
  // Graph::addSource adds.
  std::vector<OutputSpec> (*shape)(const OpChecker& c, OpAttributes& attributes) = nullptr;
  // The gradient of each input (an invalid Tensor where there is none or it
  // is not wanted). Null: the op has no gradient (autodiff refuses to go
  // through it).
  std::vector<Tensor> (*gradient)(const GradientContext& g) = nullptr;
  // Evaluates the op on `replica` in double precision; across-replica ops
  // (acrossReplicas true) are called once with replica -1 and fill every
  // replica's output.
  void (*reference)(ReferenceOp& r, int64_t replica) = nullptr;
  bool acrossReplicas = false;
  // The op's cost on one replica (the table in tessera/simdevice/time_model.hpp).
  OpCost (*cost)(const Graph& graph, const OpNode& op) = nullptr;
  // Each output element is an input element, its negation or absolute
  // value, or zero (shape ops, copies, gathers, selects, max pools, data
  // moved between replicas or from streaming memory): a float16 output of
  // float16 operands is a half already, so the device does not round it.
  // Set with OpTable::keepsHalves.
  bool keepsHalves = false;
  // Takes float64 operands (computed in double). Any other op refuses a
  // float64 operand (InvalidOperand naming the op). Set with
  // OpTable::float64.
  bool float64 = false;
};

// The record of `kind`; InternalError for a kind nobody registered.
const OpDef& opDef(OpKind kind);
// The registered name of a kind (for built-ins, its EnumNames name).
std::string_view opName(OpKind kind) noexcept;
// Adds an op at run time. InternalError when the kind is registered already
// or the record has no shape rule. Not thread-safe against concurrent graph
// building: register before building graphs.
void registerOp(OpDef def);

// The table under construction: each family adds its records.
class OpTable {
 public:
  void add(OpDef def);
  const OpDef* find(OpKind kind) const noexcept;
  // Marks registered kinds as OpDef::keepsHalves.
  void keepsHalves(std::initializer_list<OpKind> kinds);
  // Marks registered kinds as OpDef::float64.
  void float64(std::initializer_list<OpKind> kinds);

 private:
  std::vector<OpDef> defs_;  // indexed by the kind's value
  std::vector<char> present_;
};

// Dispatch through the table.
// Checks the operands and attributes of an op of `kind` named `opName` and
// returns its outputs (OpDef::shape); GraphError for sources, which
// Graph::addSource adds.
std::vector<OutputSpec> inferOutputs(const Graph& graph, OpKind kind, std::span<const TensorId> inputs,
                                     OpAttributes& attributes, std::string_view opName);
// Whether autodiff can go through the kind.
bool hasGradient(OpKind kind);
// The gradients of op `op`'s inputs (kNoTensor where there is none or it is
// not wanted) from its outputs' gradients (kNoTensor: none flows back).
// AutodiffError(NoGradient) for a kind without a gradient rule.
std::vector<TensorId> gradientOf(Graph& graph, OpId op, std::span<const TensorId> outputGradients,
                                 std::span<const char> wanted = {});

// The families (one function per file of lib/ops/).
void addSourceOps(OpTable& table);
void addElementwiseOps(OpTable& table);
void addMatMulOps(OpTable& table);
void addReductionOps(OpTable& table);
void addShapeOps(OpTable& table);
void addSoftmaxOps(OpTable& table);
void addGatherOps(OpTable& table);
void addConvOps(OpTable& table);
void addPoolingOps(OpTable& table);
void addRecurrenceOps(OpTable& table);
void addNormalizationOps(OpTable& table);
void addMaskOps(OpTable& table);
void addCollectiveOps(OpTable& table);
void addRemoteOps(OpTable& table);

// Helpers shared by the families.
// numpy broadcasting of two shapes; nullopt when they do not broadcast.
std::optional<Shape> broadcastShapes(const Shape& a, const Shape& b);
// True when `from` broadcasts to exactly `to` (numpy rules).
bool broadcastsTo(const Shape& from, const Shape& to);
// "\"x\" [2, 3] float32", for error messages.
std::string describeTensor(const Graph& graph, TensorId t);
// Gradient helpers: dy summed back to `shape` when a broadcast made it
// larger (ReduceToShape); t times a constant factor (t itself for 1).
Tensor reduceTo(Tensor dy, Shape shape);
Tensor scaled(Tensor t, double factor);
// Elements of a tensor, as a double (for costs).
double elementsOf(const Graph& graph, TensorId t);
// Bytes of a tensor: dtypeBytes of its dtype an element (float16 2, else 4).
double bytesOf(const Graph& graph, TensorId t);
inline int64_t ceilDiv(int64_t a, int64_t b) { return a == 0 ? 0 : (a - 1) / b + 1; }

// Index arithmetic of the double-precision references (plain row-major loops).
namespace reference {
std::size_t count(const Shape& shape);
std::vector<std::size_t> stridesOf(const Shape& shape);
// The multi-index of flat index i in `shape`.
std::vector<int64_t> unravel(std::size_t i, const Shape& shape);
// Flat index in `small` of element i of `big`, when `small` broadcasts to
// `big` (numpy rules: aligned right, size-1 dimensions repeat).
std::size_t broadcastSource(std::size_t i, const Shape& big, const Shape& small);
// Shard `shard` of `host` in ShardLayout(host.size(), shards): its real
// elements, then zeros up to shardElements.
std::vector<double> shardOf(const std::vector<double>& host, int64_t shards, int64_t shard);
}  // namespace reference

}  // namespace tessera
