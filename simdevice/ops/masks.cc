// The mask family's kernels (lib/ops/masks.cc defines the ops): comparisons
// and logic write 0 or 1, Where selects; all run over broadcast loops and in
// fused chains.
#include "kernel_table.hpp"

namespace tessera::sim {
namespace {

struct EqualF {
  float operator()(float a, float b) const { return a == b ? 1.0f : 0.0f; }
};
struct LessF {
  float operator()(float a, float b) const { return a < b ? 1.0f : 0.0f; }
};
struct GreaterF {
  float operator()(float a, float b) const { return a > b ? 1.0f : 0.0f; }
};
struct AndF {
  float operator()(float a, float b) const { return a != 0.0f && b != 0.0f ? 1.0f : 0.0f; }
};
struct OrF {
  float operator()(float a, float b) const { return a != 0.0f || b != 0.0f ? 1.0f : 0.0f; }
};
struct NotF {
  float operator()(float x) const { return x == 0.0f ? 1.0f : 0.0f; }
};

template <Kernel kKernel>
void planLoops(StepPlanner& planner, Step& step) {
  planBroadcastLoops(planner, step);
  step.kernel = kKernel;
  planner.emit(std::move(step));
}

template <class F>
KernelDef binaryMaskKernels(OpKind kind) {
  return {.kind = kind, .plan = planLoops<binaryKernel<F>>, .tile = binaryTile<F>};
}

void whereKernel(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* c = inOf(s, run, 0);
    const float* x = inOf(s, run, 1);
    const float* y = inOf(s, run, 2);
    forEach3(run.loop,
             [&](int64_t io, int64_t ic, int64_t ix, int64_t iy) { o[io] = c[ic] != 0.0f ? x[ix] : y[iy]; });
  }
}

void whereTile(const Step& s, const TileOperands& t, int64_t n) {
  const int64_t sc = s.tileStride[0];
  const int64_t sx = s.tileStride[1];
  const int64_t sy = s.tileStride[2];
  for (int64_t i = 0; i < n; ++i) t.out[i] = t.in[0][i * sc] != 0.0f ? t.in[1][i * sx] : t.in[2][i * sy];
}

}  // namespace

void addMaskKernels(KernelTable& table) {
  table.add(binaryMaskKernels<EqualF>(OpKind::Equal));
  table.add(binaryMaskKernels<LessF>(OpKind::Less));
  table.add(binaryMaskKernels<GreaterF>(OpKind::Greater));
  table.add(binaryMaskKernels<AndF>(OpKind::And));
  table.add(binaryMaskKernels<OrF>(OpKind::Or));
  table.add(unaryKernels<NotF>(OpKind::Not));
  table.add({.kind = OpKind::Where, .plan = planLoops<whereKernel>, .tile = whereTile});
}

}  // namespace tessera::sim
