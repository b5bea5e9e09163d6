// The shape family's kernels (lib/ops/shape_ops.cc defines the ops): strided
// copies. On float64 operands the same plans copy whole doubles.
#include "kernel_table.hpp"

namespace tessera::sim {
namespace {

// Makes the step a strided copy: of floats, split over the threads
// (Step::splitsLoop); of whole doubles, on one thread.
template <bool kDouble>
void stridedCopy(Step& step) {
  step.kernel = kDouble ? copyDoublesKernel() : copyKernel();
  step.splitsLoop = !kDouble;
}

void planReshape(StepPlanner& planner, Step& step) { planFlatCopy(planner, step, planner.op().inputs[0]); }

// BroadcastTo: a strided copy over the broadcast loops, in which a
// broadcast dimension reads the same element again (stride 0).
void planBroadcastCopy(StepPlanner& planner, Step& step) {
  planBroadcastLoops(planner, step);
  stridedCopy<false>(step);
  planner.emit(std::move(step));
}

template <bool kDouble>
void planTranspose(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  planner.runsOver(step, {{op.inputs[0], 0}});
  const std::vector<int64_t> inStrides = contiguousStrides(planner.shape(op.inputs[0]));
  std::vector<int64_t> strides;
  for (int64_t axis : op.attributes.axes) strides.push_back(inStrides[static_cast<std::size_t>(axis)]);
  const Shape& out = planner.shape(op.outputs[0]);
  makeLoops(step, out, {contiguousStrides(out), strides});
  stridedCopy<kDouble>(step);
  planner.emit(std::move(step));
}

template <bool kDouble>
void planSlice(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  const std::vector<int64_t> inStrides = contiguousStrides(planner.shape(op.inputs[0]));
  int64_t begin = 0;
  for (std::size_t d = 0; d < inStrides.size(); ++d) begin += op.attributes.starts[d] * inStrides[d];
  planner.runsOver(step, {{op.inputs[0], begin}});
  const Shape& out = planner.shape(op.outputs[0]);
  makeLoops(step, out, {contiguousStrides(out), inStrides});
  stridedCopy<kDouble>(step);
  planner.emit(std::move(step));
}

void planSlicePad(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  const std::vector<int64_t> outStrides = contiguousStrides(planner.shape(op.outputs[0]));
  int64_t begin = 0;
  for (std::size_t d = 0; d < outStrides.size(); ++d) begin += op.attributes.starts[d] * outStrides[d];
  planner.runsOver(step, {{op.inputs[0], 0}});
  // Each run clears its groups, then fills the slice.
  step.zeroFirst = true;
  step.outLoopOffset = begin;
  const Shape& in = planner.shape(op.inputs[0]);
  makeLoops(step, in, {outStrides, contiguousStrides(in)});
  stridedCopy<false>(step);
  planner.emit(std::move(step));
}

// One strided copy per input into its part of the output.
template <bool kDouble>
void planConcat(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  const std::vector<int64_t> outStrides = contiguousStrides(planner.shape(op.outputs[0]));
  const auto axis = static_cast<std::size_t>(op.attributes.axis);
  int64_t along = 0;
  for (TensorId t : op.inputs) {
    Step part = step;
    planner.runsOver(part, {{t, 0}}, along * outStrides[axis]);
    makeLoops(part, planner.shape(t), {outStrides, contiguousStrides(planner.shape(t))});
    stridedCopy<kDouble>(part);
    planner.emit(std::move(part));
    along += planner.shape(t)[axis];
  }
}

}  // namespace

void addShapeKernels(KernelTable& table) {
  table.add({.kind = OpKind::Reshape, .plan = planReshape, .tile = copyTile, .planFloat64 = planReshape});
  KernelDef broadcast = unaryKernelsWithDouble<IdentityF>(OpKind::BroadcastTo);
  broadcast.plan = planBroadcastCopy;
  broadcast.tile = copyTile;
  table.add(broadcast);
  table.add({.kind = OpKind::Transpose, .plan = planTranspose<false>, .planFloat64 = planTranspose<true>});
  table.add({.kind = OpKind::Slice, .plan = planSlice<false>, .planFloat64 = planSlice<true>});
  table.add({.kind = OpKind::SlicePad, .plan = planSlicePad});
  table.add({.kind = OpKind::Concat, .plan = planConcat<false>, .planFloat64 = planConcat<true>});
}

}  // namespace tessera::sim
