// The kernel table and the plans that several families share.
#include "kernel_table.hpp"

#include <fmt/format.h>

#include "tessera/lib/error.hpp"

namespace tessera::sim {
namespace {

std::size_t indexOf(OpKind kind) { return static_cast<std::size_t>(kind); }

// Built once, on first use, from the families; registerKernel adds to it.
KernelTable& kernelTable() {
  static KernelTable instance = [] {
    KernelTable t;
    addSourceKernels(t);
    addElementwiseKernels(t);
    addMatMulKernels(t);
    addReductionKernels(t);
    addShapeKernels(t);
    addSoftmaxKernels(t);
    addGatherKernels(t);
    addConvKernels(t);
    addPoolingKernels(t);
    addRecurrenceKernels(t);
    addNormalizationKernels(t);
    addMaskKernels(t);
    addCollectiveKernels(t);
    addRemoteKernels(t);
    return t;
  }();
  return instance;
}

}  // namespace

void KernelTable::add(KernelDef def) {
  const std::size_t i = indexOf(def.kind);
  if (i < present_.size() && present_[i]) {
    throw InternalError(ErrorCode::Internal, "kernel table", fmt::format("{} has kernels already", def.kind));
  }
  if (i >= defs_.size()) {
    defs_.resize(i + 1);
    present_.resize(i + 1, 0);
  }
  defs_[i] = def;
  present_[i] = 1;
}

const KernelDef* KernelTable::find(OpKind kind) const noexcept {
  const std::size_t i = indexOf(kind);
  return i < present_.size() && present_[i] ? &defs_[i] : nullptr;
}

const KernelDef& kernelDef(OpKind kind, std::string_view opName) {
  const KernelDef* def = kernelTable().find(kind);
  if (def == nullptr) {
    throw DeviceError(
        ErrorCode::InvalidProgram, std::string(opName),
        fmt::format("the simulated device has no kernel for {}; register one with registerKernel", kind));
  }
  return *def;
}

TileKernel tileKernel(OpKind kind) {
  const KernelDef* def = kernelTable().find(kind);
  return def != nullptr ? def->tile : nullptr;
}

void registerKernel(KernelDef def) { kernelTable().add(def); }

std::vector<int64_t> contiguousStrides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

std::vector<int64_t> broadcastStrides(const Shape& small, const Shape& big) {
  const std::vector<int64_t> own = contiguousStrides(small);
  std::vector<int64_t> strides(big.size(), 0);
  const std::size_t offset = big.size() - small.size();
  for (std::size_t d = 0; d < small.size(); ++d) strides[offset + d] = small[d] == 1 ? 0 : own[d];
  return strides;
}

void makeLoops(Step& step, const std::vector<int64_t>& size,
               const std::vector<std::vector<int64_t>>& strides) {
  for (Run& run : step.runs) {
    StridedLoop loop;
    std::array<int64_t, kMaxOperands> groupStrides{};
    groupStrides[0] = step.outElements;
    for (std::size_t i = 1; i < strides.size(); ++i) {
      groupStrides[i] = run.advance[i - 1] ? step.inElements[i - 1] : 0;
    }
    loop.push(run.count, groupStrides);
    for (std::size_t d = 0; d < size.size(); ++d) {
      std::array<int64_t, kMaxOperands> s{};
      for (std::size_t i = 0; i < strides.size(); ++i) s[i] = strides[i][d] * step.slots[i];
      loop.push(size[d], s);
    }
    loop.coalesce();
    run.loop = loop;
  }
}

void planBroadcastLoops(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  const Shape& out = planner.shape(op.outputs[0]);
  if (op.inputs.size() == 1) {
    planner.runsOver(step, {{op.inputs[0], 0}});
    makeLoops(step, out, {contiguousStrides(out), broadcastStrides(planner.shape(op.inputs[0]), out)});
  } else if (op.inputs.size() == 3) {
    planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}, {op.inputs[2], 0}});
    makeLoops(step, out,
              {contiguousStrides(out), broadcastStrides(planner.shape(op.inputs[0]), out),
               broadcastStrides(planner.shape(op.inputs[1]), out),
               broadcastStrides(planner.shape(op.inputs[2]), out)});
  } else {
    planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}});
    makeLoops(step, out,
              {contiguousStrides(out), broadcastStrides(planner.shape(op.inputs[0]), out),
               broadcastStrides(planner.shape(op.inputs[1]), out)});
  }
}

void planFlatCopy(StepPlanner& planner, Step& step, TensorId source) {
  planner.runsOver(step, {{source, 0}});
  // A whole copy moves floats whatever the element type (a float64 value's
  // two floats are copied as they are).
  step.slots.fill(1);
  makeLoops(step, {step.outElements}, {{1}, {1}});
  step.kernel = copyKernel();
  step.splitsLoop = true;
  planner.emit(std::move(step));
}

}  // namespace tessera::sim
