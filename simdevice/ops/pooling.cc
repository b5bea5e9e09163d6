// The pooling family's kernels (lib/ops/pooling.cc defines the ops): each
// window's taps from a table built at load time (lib/ops/window.hpp), laid
// out window by window. The gradients scatter in a fixed order (planes,
// then windows, then taps), so repeated taps add up the same way on every
// run.
#include <algorithm>
#include <array>
#include <limits>

#include "cpu_features.hpp"
#include "kernel_table.hpp"
#include "ops/window.hpp"
#include "x86_simd.hpp"

namespace tessera::sim {
namespace {

// Step sizes: `groups` planes (sample, channel) per group, `cols` input
// positions and `rows` windows per plane, `depth` taps per window. table:
// the input position of tap k of window p at p * depth + k, or -1; table2:
// each window's divisor (AveragePool), or the same positions tap by tap, at
// k * rows + p (MaxPool, MaxPoolGrad: 8 windows a vector).

// Planes per part of a group split over threads: each part is at least
// this many input positions, since handing a part to another thread costs
// about a microsecond.
constexpr int64_t kMinPartPositions = int64_t{1} << 14;

// f(out, in0, in1, first, last) for every group, over planes [first, last)
// of the group. Planes are independent (a window reads and a gradient
// writes one plane), so the parts run on the step's threads; each plane is
// computed the same way whichever part holds it.
template <class F>
void forPlanes(const Step& s, F&& f) {
  const int64_t positions = std::max<int64_t>(s.groups * std::max(s.cols, s.rows), 1);
  const int parts = s.pool == nullptr
                        ? 1
                        : static_cast<int>(std::clamp<int64_t>(
                              std::min(positions / kMinPartPositions, s.groups), 1, s.pool->threads()));
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      float* out = outOf(s, run) + g * s.outElements;
      const float* in0 = inOf(s, run, 0) + (run.advance[0] ? g * s.inElements[0] : 0);
      const float* in1 =
          s.in[1] == nullptr ? nullptr : inOf(s, run, 1) + (run.advance[1] ? g * s.inElements[1] : 0);
      if (parts == 1) {
        f(out, in0, in1, int64_t{0}, s.groups);
        continue;
      }
      s.pool->run(parts, [&](int part, int) {
        f(out, in0, in1, s.groups * part / parts, s.groups * (part + 1) / parts);
      });
    }
  }
}

// The input position of window p's first maximum in `x`, or -1 (a window
// of pads only). kPadded: some taps are -1. The choices are selects, not
// branches: which tap wins depends on the data and would mispredict.
template <bool kPadded>
int64_t argmaxOf(const int64_t* taps, int64_t depth, const float* x) {
  int64_t k = 0;
  if constexpr (kPadded) {
    while (k < depth && taps[k] < 0) ++k;
    if (k == depth) return -1;
  }
  int64_t best = taps[k];
  float value = x[best];
  for (++k; k < depth; ++k) {
    const int64_t at = taps[k];
    if (kPadded && at < 0) continue;
    const float v = x[at];
    const bool greater = v > value;
    best = greater ? at : best;
    value = greater ? v : value;
  }
  return best;
}

#ifdef TESSERA_X86_SIMD
// argmaxOf() of the windows [p, p + 8) of a plane (those below `rows`),
// tap by tap across the windows: `byTap` is Step::table2 of a max pool.
// Each lane makes argmaxOf's choices (a tap replaces the maximum when it is
// greater, the first tap that is not a pad when none was before), so the
// values and positions are the same. Returns the maximum (-inf for a
// window of pads only) and sets at[i] to window p + i's position (-1).
__attribute__((target("avx512f,avx512vl"))) __m256 argmax8(const int64_t* byTap, int64_t rows, int64_t depth,
                                                           int64_t p, const float* x, int64_t (&at)[8]) {
  const __mmask8 lanes = firstLanes8(rows - p);
  __mmask8 found = 0;
  __m256 value = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m512i best = _mm512_set1_epi64(-1);
  for (int64_t k = 0; k < depth; ++k) {
    const __m512i taps = _mm512_maskz_loadu_epi64(lanes, byTap + k * rows + p);
    const __mmask8 real = _mm512_mask_cmpge_epi64_mask(lanes, taps, _mm512_setzero_si512());
    const __m256 v = _mm512_mask_i64gather_ps(_mm256_setzero_ps(), real, taps, x, 4);
    const __mmask8 take = real & static_cast<__mmask8>(~found | _mm256_cmp_ps_mask(v, value, _CMP_GT_OQ));
    value = _mm256_mask_mov_ps(value, take, v);
    best = _mm512_mask_mov_epi64(best, take, taps);
    found |= real;
  }
  _mm512_storeu_si512(at, best);
  return value;
}

// maxPool and maxPoolGrad over planes [first, last), 8 windows a vector.
__attribute__((target("avx512f,avx512vl"))) void maxPoolAvx512(const Step& s, float* y, const float* x,
                                                               int64_t first, int64_t last) {
  int64_t at[8];
  for (int64_t plane = first; plane < last; ++plane) {
    const float* xp = x + plane * s.cols;
    float* yp = y + plane * s.rows;
    for (int64_t p = 0; p < s.rows; p += 8) {
      const __m256 value = argmax8(s.table2.data(), s.rows, s.depth, p, xp, at);
      _mm256_mask_storeu_ps(yp + p, firstLanes8(s.rows - p), value);
    }
  }
}

// The positions of 8 windows at a time, then the gradient added window by
// window as maxPoolGrad adds it.
__attribute__((target("avx512f,avx512vl"))) void maxPoolGradAvx512(const Step& s, float* dx, const float* dy,
                                                                   const float* x, int64_t first,
                                                                   int64_t last) {
  int64_t at[8];
  for (int64_t plane = first; plane < last; ++plane) {
    const float* xp = x + plane * s.cols;
    const float* dyp = dy + plane * s.rows;
    float* dxp = dx + plane * s.cols;
    for (int64_t p = 0; p < s.rows; p += 8) {
      argmax8(s.table2.data(), s.rows, s.depth, p, xp, at);
      const int64_t n = std::min<int64_t>(8, s.rows - p);
      for (int64_t i = 0; i < n; ++i)
        if (at[i] >= 0) dxp[at[i]] += dyp[p + i];
    }
  }
}
#endif

template <bool kPadded>
void maxPool(const Step& s) {
  forPlanes(s, [&](float* y, const float* x, const float*, int64_t first, int64_t last) {
#ifdef TESSERA_X86_SIMD
    if (cpuHasAvx512()) return maxPoolAvx512(s, y, x, first, last);
#endif
    for (int64_t plane = first; plane < last; ++plane) {
      const float* xp = x + plane * s.cols;
      float* yp = y + plane * s.rows;
      for (int64_t p = 0; p < s.rows; ++p) {
        const int64_t at = argmaxOf<kPadded>(s.table.data() + p * s.depth, s.depth, xp);
        yp[p] = at < 0 ? -std::numeric_limits<float>::infinity() : xp[at];
      }
    }
  });
}

// Operand 0 dy, 1 x.
template <bool kPadded>
void maxPoolGrad(const Step& s) {
  forPlanes(s, [&](float* dx, const float* dy, const float* x, int64_t first, int64_t last) {
    std::fill(dx + first * s.cols, dx + last * s.cols, 0.0f);
#ifdef TESSERA_X86_SIMD
    if (cpuHasAvx512()) return maxPoolGradAvx512(s, dx, dy, x, first, last);
#endif
    for (int64_t plane = first; plane < last; ++plane) {
      const float* xp = x + plane * s.cols;
      const float* dyp = dy + plane * s.rows;
      float* dxp = dx + plane * s.cols;
      for (int64_t p = 0; p < s.rows; ++p) {
        const int64_t at = argmaxOf<kPadded>(s.table.data() + p * s.depth, s.depth, xp);
        if (at >= 0) dxp[at] += dyp[p];
      }
    }
  });
}

void averagePool(const Step& s) {
  forPlanes(s, [&](float* y, const float* x, const float*, int64_t first, int64_t last) {
    for (int64_t plane = first; plane < last; ++plane) {
      const float* xp = x + plane * s.cols;
      float* yp = y + plane * s.rows;
      for (int64_t p = 0; p < s.rows; ++p) {
        const int64_t* taps = s.table.data() + p * s.depth;
        float sum = 0.0f;
        for (int64_t k = 0; k < s.depth; ++k)
          if (taps[k] >= 0) sum += xp[taps[k]];
        yp[p] = sum / static_cast<float>(s.table2[static_cast<std::size_t>(p)]);
      }
    }
  });
}

// Operand 0 dy.
void averagePoolGrad(const Step& s) {
  forPlanes(s, [&](float* dx, const float* dy, const float*, int64_t first, int64_t last) {
    std::fill(dx + first * s.cols, dx + last * s.cols, 0.0f);
    for (int64_t plane = first; plane < last; ++plane) {
      const float* dyp = dy + plane * s.rows;
      float* dxp = dx + plane * s.cols;
      for (int64_t p = 0; p < s.rows; ++p) {
        const int64_t* taps = s.table.data() + p * s.depth;
        const float share = dyp[p] / static_cast<float>(s.table2[static_cast<std::size_t>(p)]);
        for (int64_t k = 0; k < s.depth; ++k)
          if (taps[k] >= 0) dxp[taps[k]] += share;
      }
    }
  });
}

// `pooledInput` is the tensor the windows slide over, `pooled` the tensor
// of windows.
// `kernels`: the kernel for windows without pads, then the one for windows
// with some.
void planPool(StepPlanner& planner, Step& step, TensorId pooledInput, TensorId pooled,
              std::array<Kernel, 2> kernels, bool divisors) {
  const OpNode& op = planner.op();
  const Shape& x = planner.shape(pooledInput);
  const Shape& y = planner.shape(pooled);
  const WindowGeometry window = windowOf(spatialOf(x), op.attributes.kernel, spatialOf(y), op.attributes);
  const std::vector<int64_t> byTap = windowTaps(window);
  step.groups = x[0] * x[1];
  step.cols = window.inPositions();
  step.rows = window.outPositions();
  step.depth = window.taps();
  step.table.resize(byTap.size());
  for (int64_t p = 0; p < step.rows; ++p) {
    for (int64_t k = 0; k < step.depth; ++k)
      step.table[static_cast<std::size_t>(p * step.depth + k)] =
          byTap[static_cast<std::size_t>(k * step.rows + p)];
  }
  if (divisors) {
    step.table2 = windowDivisors(window, op.attributes.countIncludePad);
    for (int64_t& d : step.table2) d = std::max<int64_t>(d, 1);
  } else {
    step.table2 = byTap;
  }
  if (op.inputs.size() == 2) {
    planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}});
  } else {
    planner.runsOver(step, {{op.inputs[0], 0}});
  }
  const bool padded = std::any_of(step.table.begin(), step.table.end(), [](int64_t at) { return at < 0; });
  step.kernel = kernels[padded ? 1 : 0];
  planner.emit(std::move(step));
}

}  // namespace

void addPoolingKernels(KernelTable& table) {
  table.add({.kind = OpKind::MaxPool, .plan = [](StepPlanner& planner, Step& step) {
               planPool(planner, step, planner.op().inputs[0], planner.op().outputs[0],
                        {maxPool<false>, maxPool<true>}, false);
             }});
  table.add({.kind = OpKind::MaxPoolGrad, .plan = [](StepPlanner& planner, Step& step) {
               planPool(planner, step, planner.op().inputs[1], planner.op().inputs[0],
                        {maxPoolGrad<false>, maxPoolGrad<true>}, false);
             }});
  table.add({.kind = OpKind::AveragePool, .plan = [](StepPlanner& planner, Step& step) {
               planPool(planner, step, planner.op().inputs[0], planner.op().outputs[0],
                        {averagePool, averagePool}, true);
             }});
  table.add({.kind = OpKind::AveragePoolGrad, .plan = [](StepPlanner& planner, Step& step) {
               planPool(planner, step, planner.op().outputs[0], planner.op().inputs[0],
                        {averagePoolGrad, averagePoolGrad}, true);
             }});
}

}  // namespace tessera::sim
