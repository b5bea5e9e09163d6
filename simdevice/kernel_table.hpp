// The device's kernel table: how each OpKind becomes steps.
//
// Each op family's kernels live in one file of simdevice/ops/ (beside its
// definition in lib/ops/) and add one KernelDef per op: a plan function,
// which turns the op into precompiled steps at load time, and for flat
// elementwise ops a slice kernel that fused chains run. The executor plans
// every op through this table, so it lists no op kinds. The table is built
// in code on first use (kernelTable() lists the families); registerKernel()
// adds the kernels of an op added at run time (lib/op_def.hpp, registerOp).
#pragma once

#include <initializer_list>
#include <string_view>
#include <utility>

#include "kernels.hpp"
#include "layouts.hpp"
#include "tessera/lib/graph.hpp"

namespace tessera::sim {

class SimExecutable;
struct ExchangedTensor;

// The executor's view of the op being planned. Step data is laid out as
// kernels.hpp describes; the planner supplies buffers, layouts and runs.
class StepPlanner {
 public:
  StepPlanner(SimExecutable& executable, OpId op) : executable_(executable), op_(op) {}

  const Graph& graph() const;
  OpId opId() const noexcept { return op_; }
  const OpNode& op() const;
  // The tensor's storage in the arena, its floats per group (elements x
  // dtypeSlots: a float64 element takes two), shape and replica layout.
  float* buffer(TensorId t) const;
  int64_t elements(TensorId t) const;
  const Shape& shape(TensorId t) const;
  const ReplicaGrouping& layout(TensorId t) const;
  // Whether the op's (first) output is float16: a kernel that rounds its own
  // output sets Step::halfOutput from it.
  bool halfOutput() const;
  // Sets step.in[0..] to the given operands (tensor, extra offset into its
  // groups) and step.runs to the runs of groups over output 0's layout, the
  // output starting `outOffset` into each group.
  void runsOver(Step& step, std::initializer_list<std::pair<TensorId, int64_t>> inputs,
                int64_t outOffset = 0) const;
  // Adds a planned step to the program, after any step planned before.
  void emit(Step step);

  // Inputs: the slot of the host feed this Input op reads.
  void takeInputSlot();
  // MatMul: whether a Transpose (its producing op) is read in place by the
  // GEMMs instead of being materialised.
  bool foldedTranspose(OpId producer) const;
  // Collectives: the MatMul whose product this collective computes as one
  // fused GEMM per group, or kNoOp.
  OpId fusedMatMul() const;
  int64_t localReplicas() const;
  int64_t globalReplicas() const;
  const ReplicaTopology& topology() const;
  // Adds the step that gathers every replica's value of `t` from every
  // instance before this op; returns the gathered values.
  const ExchangedTensor& exchanged(TensorId t);
  // Remote buffers: entry `entry` of `buffer` (local replica 0), and which
  // replicas' entries hold equal values.
  float* remoteEntry(int64_t buffer, int64_t entry) const;
  const ReplicaGrouping& bufferLayout(int64_t buffer) const;

 private:
  SimExecutable& executable_;
  OpId op_;
};

struct KernelDef {
  OpKind kind = OpKind::Input;
  // Fills `step` (its kind, op, name, output buffer and outElements are set)
  // and emits it, or emits other steps, or none. Null: the op needs no step
  // (Variables and Constants are planned buffers).
  void (*plan)(StepPlanner& planner, Step& step) = nullptr;
  // Flat elementwise ops: the kernel of one slice of a fused chain, or null.
  TileKernel tile = nullptr;
  // The plan when the op reads or makes a float64 tensor: its steps compute
  // in double (Step::slots, loadDouble/storeDouble). Null: the device has no
  // float64 kernel for the op, and a program that needs one is refused at
  // load (tessera.device.402).
  void (*planFloat64)(StepPlanner& planner, Step& step) = nullptr;
};

class KernelTable {
 public:
  void add(KernelDef def);
  const KernelDef* find(OpKind kind) const noexcept;

 private:
  std::vector<KernelDef> defs_;  // indexed by the kind's value
  std::vector<char> present_;
};

// The kernels of `kind`; DeviceError(InvalidProgram) naming `opName` when
// this device has none.
const KernelDef& kernelDef(OpKind kind, std::string_view opName);
// The slice kernel of a kind, or null.
TileKernel tileKernel(OpKind kind);
// Adds the kernels of an op added at run time. InternalError when the kind
// has kernels already. Register before loading programs.
void registerKernel(KernelDef def);

// The families (one function per file of simdevice/ops/).
void addSourceKernels(KernelTable& table);
void addElementwiseKernels(KernelTable& table);
void addMatMulKernels(KernelTable& table);
void addReductionKernels(KernelTable& table);
void addShapeKernels(KernelTable& table);
void addSoftmaxKernels(KernelTable& table);
void addGatherKernels(KernelTable& table);
void addConvKernels(KernelTable& table);
void addPoolingKernels(KernelTable& table);
void addRecurrenceKernels(KernelTable& table);
void addNormalizationKernels(KernelTable& table);
void addMaskKernels(KernelTable& table);
void addCollectiveKernels(KernelTable& table);
void addRemoteKernels(KernelTable& table);

// Strides of a contiguous tensor of `shape`, and, in `big`'s index space,
// of a tensor of shape `small` that broadcasts to `big` (numpy rules).
std::vector<int64_t> contiguousStrides(const Shape& shape);
std::vector<int64_t> broadcastStrides(const Shape& small, const Shape& big);
// Fills every run's loop: the run's groups, then `size` with the given
// per-operand strides (output first, in elements) inside a group. Strides
// are scaled to floats by Step::slots (runsOver sets them).
void makeLoops(Step& step, const std::vector<int64_t>& size,
               const std::vector<std::vector<int64_t>>& strides);

// Plans shared by families: the runs and loops of an elementwise op over
// its inputs' broadcast strides (one, two or three inputs; the caller sets the
// kernel and emits), and a whole flat copy of input `source` into the output
// (Copy, Reshape, CopyInplace's source), emitted.
void planBroadcastLoops(StepPlanner& planner, Step& step);
void planFlatCopy(StepPlanner& planner, Step& step, TensorId source);

// The plan of an elementwise op whose kernel runs over its inputs' broadcast
// loops.
template <Kernel kKernel>
void planBroadcast(StepPlanner& planner, Step& step) {
  planBroadcastLoops(planner, step);
  step.kernel = kKernel;
  planner.emit(std::move(step));
}

// The same for a kernel that splits its loop over the threads
// (Step::splitsLoop, forLoopParts).
template <Kernel kKernel>
void planSplitBroadcast(StepPlanner& planner, Step& step) {
  step.splitsLoop = true;
  planBroadcast<kKernel>(planner, step);
}

// The kernels of a unary elementwise op computing F (float -> float).
template <class F>
KernelDef unaryKernels(OpKind kind) {
  return {.kind = kind, .plan = planSplitBroadcast<unaryKernel<F>>, .tile = unaryTile<F>};
}
// The kernels of a binary elementwise op computing F (float, float -> float).
template <class F>
KernelDef binaryKernels(OpKind kind) {
  return {.kind = kind, .plan = planSplitBroadcast<binaryKernel<F>>, .tile = binaryTile<F>};
}
// The unary kernels, computing F in double on float64 operands
// (KernelDef::planFloat64).
template <class F>
KernelDef unaryKernelsWithDouble(OpKind kind) {
  KernelDef def = unaryKernels<F>(kind);
  def.planFloat64 = planSplitBroadcast<unaryKernel<F, double>>;
  return def;
}

}  // namespace tessera::sim
