// The sources' kernels (lib/ops/sources.cc defines the ops): an Input copies
// the host's feed into its buffer; Variables and Constants are buffers
// initialised at load time, with no step.
#include "kernel_table.hpp"

namespace tessera::sim {

namespace {

// The feed holds the step's floats (a float64 input's doubles two floats
// each), copied as they are; a float16 input's are rounded to halves in the
// copy.
void planInput(StepPlanner& planner, Step& step) {
  planner.takeInputSlot();
  step.kernel = inputKernel();
  step.halfOutput = planner.halfOutput();
  planner.emit(std::move(step));
}

}  // namespace

void addSourceKernels(KernelTable& table) {
  table.add({.kind = OpKind::Input, .plan = planInput, .planFloat64 = planInput});
  table.add({.kind = OpKind::Variable});
  table.add({.kind = OpKind::Constant});
}

}  // namespace tessera::sim
