// The pooling family's kernels (lib/ops/pooling.cc defines the ops): each
// window's taps from a table built at load time (lib/ops/window.hpp), laid
// out window by window. The gradients scatter in a fixed order (planes,
// then windows, then taps), so repeated taps add up the same way on every
// run.
#include <algorithm>
#include <limits>

#include "kernel_table.hpp"
#include "ops/window.hpp"

namespace tessera::sim {
namespace {

// Step sizes: `groups` planes (sample, channel) per group, `cols` input
// positions and `rows` windows per plane, `depth` taps per window. table:
// the input position of tap k of window p at p * depth + k, or -1; table2
// (AveragePool): each window's divisor.
template <class F>
void forPlanes(const Step& s, F&& f) {
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      float* out = outOf(s, run) + g * s.outElements;
      const float* in0 = inOf(s, run, 0) + (run.advance[0] ? g * s.inElements[0] : 0);
      const float* in1 =
          s.in[1] == nullptr ? nullptr : inOf(s, run, 1) + (run.advance[1] ? g * s.inElements[1] : 0);
      f(out, in0, in1);
    }
  }
}

// The input position of window p's first maximum in `x`, or -1.
int64_t argmaxOf(const int64_t* taps, int64_t depth, const float* x) {
  int64_t best = -1;
  for (int64_t k = 0; k < depth; ++k) {
    const int64_t at = taps[k];
    if (at >= 0 && (best < 0 || x[at] > x[best])) best = at;
  }
  return best;
}

void maxPool(const Step& s) {
  forPlanes(s, [&](float* y, const float* x, const float*) {
    for (int64_t plane = 0; plane < s.groups; ++plane) {
      const float* xp = x + plane * s.cols;
      float* yp = y + plane * s.rows;
      for (int64_t p = 0; p < s.rows; ++p) {
        const int64_t at = argmaxOf(s.table.data() + p * s.depth, s.depth, xp);
        yp[p] = at < 0 ? -std::numeric_limits<float>::infinity() : xp[at];
      }
    }
  });
}

// Operand 0 dy, 1 x.
void maxPoolGrad(const Step& s) {
  forPlanes(s, [&](float* dx, const float* dy, const float* x) {
    std::fill_n(dx, s.outElements, 0.0f);
    for (int64_t plane = 0; plane < s.groups; ++plane) {
      const float* xp = x + plane * s.cols;
      const float* dyp = dy + plane * s.rows;
      float* dxp = dx + plane * s.cols;
      for (int64_t p = 0; p < s.rows; ++p) {
        const int64_t at = argmaxOf(s.table.data() + p * s.depth, s.depth, xp);
        if (at >= 0) dxp[at] += dyp[p];
      }
    }
  });
}

void averagePool(const Step& s) {
  forPlanes(s, [&](float* y, const float* x, const float*) {
    for (int64_t plane = 0; plane < s.groups; ++plane) {
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
  forPlanes(s, [&](float* dx, const float* dy, const float*) {
    std::fill_n(dx, s.outElements, 0.0f);
    for (int64_t plane = 0; plane < s.groups; ++plane) {
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
void planPool(StepPlanner& planner, Step& step, TensorId pooledInput, TensorId pooled, Kernel kernel,
              bool divisors) {
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
  }
  if (op.inputs.size() == 2) {
    planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}});
  } else {
    planner.runsOver(step, {{op.inputs[0], 0}});
  }
  step.kernel = kernel;
  planner.emit(std::move(step));
}

}  // namespace

void addPoolingKernels(KernelTable& table) {
  table.add({.kind = OpKind::MaxPool, .plan = [](StepPlanner& planner, Step& step) {
               planPool(planner, step, planner.op().inputs[0], planner.op().outputs[0], maxPool, false);
             }});
  table.add({.kind = OpKind::MaxPoolGrad, .plan = [](StepPlanner& planner, Step& step) {
               planPool(planner, step, planner.op().inputs[1], planner.op().inputs[0], maxPoolGrad, false);
             }});
  table.add({.kind = OpKind::AveragePool, .plan = [](StepPlanner& planner, Step& step) {
               planPool(planner, step, planner.op().inputs[0], planner.op().outputs[0], averagePool, true);
             }});
  table.add({.kind = OpKind::AveragePoolGrad, .plan = [](StepPlanner& planner, Step& step) {
               planPool(planner, step, planner.op().outputs[0], planner.op().inputs[0], averagePoolGrad,
                        true);
             }});
}

}  // namespace tessera::sim
