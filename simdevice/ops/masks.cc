// The mask family's kernels (lib/ops/masks.cc defines the ops): comparisons
// and logic write 0 or 1, Where selects; all run over broadcast loops and in
// fused chains.
#include "ops/masks.hpp"
#include <cmath>

#include "half.hpp"
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
struct HalfOfDoubleF {
  float operator()(double x) const { return roundDoubleToHalf(x); }
};
struct TruncF {
  template <class T>
  T operator()(T x) const {
    return std::trunc(x);
  }
};
struct NotF {
  float operator()(float x) const { return x == 0.0f ? 1.0f : 0.0f; }
};

// Where over x and y read as T (floats, or float64 doubles); the condition
// is a float 0/1 mask.
template <class T = float>
void whereKernel(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* c = inOf(s, run, 0);
    const float* x = inOf(s, run, 1);
    const float* y = inOf(s, run, 2);
    forLoopParts(s, run.loop, [&](const StridedLoop& loop, const std::array<int64_t, kMaxOperands>& at) {
      forEach3(loop, [&](int64_t io, int64_t ic, int64_t ix, int64_t iy) {
        // Both values loaded, so the choice compiles to a blend.
        const T a = loadSlots<T>(x + at[2] + ix);
        const T b = loadSlots<T>(y + at[3] + iy);
        storeSlots(o + at[0] + io, c[ic + at[1]] != 0.0f ? a : b);
      });
    });
  }
}

void whereTile(const Step& s, const TileOperands& t, int64_t n) {
  const int64_t sc = s.tileStride[0];
  const int64_t sx = s.tileStride[1];
  const int64_t sy = s.tileStride[2];
  for (int64_t i = 0; i < n; ++i) t.out[i] = t.in[0][i * sc] != 0.0f ? t.in[1][i * sx] : t.in[2][i * sy];
}

// Per output group g: table[g] the global replica whose value the group
// holds (its first replica: a value that replicas share has one mask);
// cols the threshold of the draws, scale 1 / (1 - ratio), groupSize the seed.
void dropoutKernel(const Step& s) {
  const auto seed = static_cast<uint64_t>(s.groupSize);
  const auto threshold = static_cast<uint64_t>(s.cols);
  const float scale = s.scale;
  for (const Run& run : s.runs) {
    const int64_t firstGroup = (run.out) / s.outElements;
    for (int64_t g = 0; g < run.count; ++g) {
      const float* x = inOf(s, run, 0) + (run.advance[0] ? g * s.inElements[0] : 0);
      const auto step = static_cast<uint64_t>(*inOf(s, run, 1));
      float* out = outOf(s, run) + g * s.outElements;
      const auto base =
          static_cast<uint64_t>(s.table[static_cast<std::size_t>(firstGroup + g)] * s.outElements);
      for (int64_t i = 0; i < s.outElements; ++i)
        out[i] = dropoutKeeps(seed, step, base + static_cast<uint64_t>(i), threshold) ? x[i] * scale : 0.0f;
    }
  }
}

void planDropout(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}});
  const ReplicaGrouping& layout = planner.layout(op.outputs[0]);
  for (int64_t g = 0; g < layout.numGroups(); ++g)
    step.table.push_back(planner.topology().replicaOffset + layout.replicaAt(g, 0));
  step.cols = static_cast<int64_t>(dropoutThreshold(op.attributes.a));
  step.scale = static_cast<float>(1.0 / (1.0 - op.attributes.a));
  step.groupSize = static_cast<int64_t>(op.attributes.b);
  step.kernel = dropoutKernel;
  planner.emit(std::move(step));
}

}  // namespace

void addMaskKernels(KernelTable& table) {
  table.add(binaryKernels<EqualF>(OpKind::Equal));
  table.add(binaryKernels<LessF>(OpKind::Less));
  table.add(binaryKernels<GreaterF>(OpKind::Greater));
  table.add(binaryKernels<AndF>(OpKind::And));
  table.add(binaryKernels<OrF>(OpKind::Or));
  table.add(unaryKernels<NotF>(OpKind::Not));
  table.add({.kind = OpKind::Where,
             .plan = planSplitBroadcast<whereKernel<float>>,
             .tile = whereTile,
             .planFloat64 = planSplitBroadcast<whereKernel<double>>});
  table.add({.kind = OpKind::Dropout, .plan = planDropout});
  // Casts to and from float64 (IdentityF and TruncF reading one type and
  // storing the other): int32, float32 and float16 values are exact
  // doubles; a double becomes the nearest float32, or an int32 truncated.
  KernelDef toInt32 = unaryKernels<TruncF>(OpKind::CastToInt32);
  toInt32.planFloat64 = planSplitBroadcast<unaryKernel<TruncF, double, float>>;
  table.add(toInt32);
  KernelDef toFloat32 = unaryKernels<IdentityF>(OpKind::CastToFloat32);
  toFloat32.tile = copyTile;
  toFloat32.planFloat64 = planSplitBroadcast<unaryKernel<IdentityF, double, float>>;
  table.add(toFloat32);
  table.add({.kind = OpKind::CastToFloat64,
             .planFloat64 = planSplitBroadcast<unaryKernel<IdentityF, float, double>>});
  // To float16: a float rounded by the rounding kernels, a double rounded
  // once to the nearest half (not through float32).
  table.add({.kind = OpKind::CastToFloat16,
             .plan = planBroadcast<roundToHalfKernel>,
             .tile = roundToHalfTile,
             .planFloat64 = planSplitBroadcast<unaryKernel<HalfOfDoubleF, double, float>>});
}

}  // namespace tessera::sim
