// The reduction family's kernels (lib/ops/reductions.cc defines the ops).
#include <algorithm>

#include "kernel_table.hpp"

namespace tessera::sim {
namespace {

// ReduceSum, ReduceMean, ReduceToShape: the output has stride 0 along the
// reduced dimensions, so every input element adds into its output element.
void reduceKernel(const Step& s) {
  for (const Run& run : s.runs) {
    zeroRun(s, run);
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    forEach(run.loop, [&](int64_t io, int64_t ix, int64_t) { o[io] += x[ix]; });
    if (s.scale != 1.0f) {
      for (int64_t i = 0; i < run.count * s.outElements; ++i) o[i] *= s.scale;
    }
  }
}

// The output has stride 0 along the reduced axes of the input's loop.
void planReduce(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  const Shape& in = planner.shape(op.inputs[0]);
  std::vector<int64_t> outStrides;
  if (op.kind == OpKind::ReduceToShape) {
    outStrides = broadcastStrides(op.attributes.shape, in);
  } else {
    Shape kept = in;
    for (std::size_t d = 0; d < kept.size(); ++d) {
      const bool reduced =
          op.attributes.axes.empty() || std::find(op.attributes.axes.begin(), op.attributes.axes.end(),
                                                  static_cast<int64_t>(d)) != op.attributes.axes.end();
      if (reduced) kept[d] = 1;
    }
    outStrides = broadcastStrides(kept, in);
  }
  planner.runsOver(step, {{op.inputs[0], 0}});
  makeLoops(step, in, {outStrides, contiguousStrides(in)});
  if (op.kind == OpKind::ReduceMean && step.outElements > 0 && planner.elements(op.inputs[0]) > 0) {
    step.scale = static_cast<float>(static_cast<double>(step.outElements) /
                                    static_cast<double>(planner.elements(op.inputs[0])));
  }
  step.kernel = reduceKernel;
  planner.emit(std::move(step));
}

}  // namespace

void addReductionKernels(KernelTable& table) {
  for (OpKind kind : {OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceToShape}) {
    table.add({.kind = kind, .plan = planReduce});
  }
}

}  // namespace tessera::sim
