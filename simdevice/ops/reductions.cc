// The reduction family's kernels (lib/ops/reductions.cc defines the ops).
#include <algorithm>
#include <cstdlib>

#include "kernel_table.hpp"
#include "planes.hpp"

namespace tessera::sim {
namespace {

// Input elements per part of a reduction split over threads: below this,
// handing a part to another thread costs more than it saves.
constexpr int64_t kMinPartElements = int64_t{1} << 12;

// ReduceSum, ReduceMean, ReduceToShape: the output has stride 0 along the
// reduced dimensions, so every input element adds into its output element.
// The sums accumulate in double and are rounded to float once (a mean after
// its scaling): the error of a sum of n terms is then that of the terms, not
// n roundings (a BatchNormalization statistic over N x H x W values, a bias
// gradient over a batch). Over threads, the run's loop is split along its
// outermost dimension when that is kept (reduceParts): each part adds into
// its own output elements, and visits every element's terms in the loop's
// order (a row reduced into one output: rowSum's), so each sum is the same
// bits at any thread count.
void reduceKernel(const Step& s) {
  double* sums = s.scratch->sums + callerThread(s) * s.scratch->sumsStride;
  for (const Run& run : s.runs) {
    const int64_t n = run.count * s.outElements;
    std::fill_n(sums, n, 0.0);
    const float* x = inOf(s, run, 0);
    const int parts = reduceParts(run.loop, s.pool == nullptr ? 1 : s.pool->threads());
    forLoopParts(s, run.loop, parts,
                 [&](const StridedLoop& part, const std::array<int64_t, kMaxOperands>& at) {
                   sumStrided(part, sums + at[0], x + at[1]);
                 });
    float* o = outOf(s, run);
    const double scale = s.scale;
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(sums[i] * scale);
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
  int64_t count = 1;
  for (const Run& run : step.runs) count = std::max(count, run.count);
  step.sumDoubles = count * step.outElements;
  step.kernel = reduceKernel;
  planner.emit(std::move(step));
}

}  // namespace

int reduceParts(const StridedLoop& loop, int threads) {
  // Only along the loop's outermost dimension, as the steps that split
  // their loops are (forLoopParts): each thread then reads the rows it
  // wrote. Cut along an inner dimension, a reduction into one row (a bias
  // gradient) would read every row on every thread.
  const int d = outermostDimension(loop);
  const auto at = static_cast<std::size_t>(d);
  if (d == loop.rank || loop.stride[0][at] == 0) return 1;
  const int64_t most = std::min(loop.elements() / kMinPartElements, loop.size[at]);
  const auto parts = static_cast<int>(std::clamp<int64_t>(most, 1, threads));
  // Parts narrower than a cache line of the input would each read lines
  // that the other reads.
  constexpr int64_t kLineFloats = 16;
  return std::abs(loop.stride[1][at]) * (loop.size[at] / parts) < kLineFloats ? 1 : parts;
}

void addReductionKernels(KernelTable& table) {
  for (OpKind kind : {OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceToShape}) {
    table.add({.kind = kind, .plan = planReduce});
  }
}

}  // namespace tessera::sim
