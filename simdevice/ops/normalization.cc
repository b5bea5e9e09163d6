// The normalization family's kernels (lib/ops/normalization.cc defines the
// ops): batch normalisation in training mode over x [N, C, spatial], one
// channel at a time. A channel's values are N strips of `spatial` floats;
// every sum runs over them in double, in eight lanes by the position in the
// strip (independent additions, which the compiler vectorises) added
// pairwise at the end, and the per-element arithmetic is in double, each
// output rounded to float once. The channels are split over the step's
// threads (normalizationParts), each computed whole by one part in a fixed
// order, so the bits are the same at any thread count.
#include <algorithm>
#include <bit>
#include <cmath>

#include "kernel_table.hpp"

namespace tessera::sim {
namespace {

// Values per part below which handing a part to another thread costs more
// than it saves.
constexpr int64_t kMinPartElements = int64_t{1} << 13;
constexpr int kLanes = 8;

struct Geometry {
  int64_t n = 0;
  int64_t channels = 0;
  int64_t spatial = 0;
  double epsilon = 0.0;
  double perChannel() const { return static_cast<double>(n * spatial); }
  int64_t sampleStride() const { return channels * spatial; }
};

// Step::table holds N, C and the spatial size; table2 epsilon's bits.
Geometry geometryOf(const Step& s) {
  return {s.table[0], s.table[1], s.table[2], std::bit_cast<double>(s.table2[0])};
}

double addLanes(const double (&lanes)[kLanes]) {
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// Sums f(k) over the k of one channel's strips (k the offset from the
// channel's first value), lane by position in the strip.
template <class F>
double sumChannel(const Geometry& g, F&& f) {
  double lanes[kLanes] = {};
  for (int64_t n = 0; n < g.n; ++n) {
    const int64_t base = n * g.sampleStride();
    int64_t s = 0;
    for (; s + kLanes <= g.spatial; s += kLanes)
      for (int j = 0; j < kLanes; ++j) lanes[j] += f(base + s + j);
    for (; s < g.spatial; ++s) lanes[s % kLanes] += f(base + s);
  }
  return addLanes(lanes);
}

// f(k) for every value of one channel (k as for sumChannel).
template <class F>
void forChannelValues(const Geometry& g, F&& f) {
  for (int64_t n = 0; n < g.n; ++n) {
    const int64_t base = n * g.sampleStride();
    for (int64_t s = 0; s < g.spatial; ++s) f(base + s);
  }
}

// f(channel) for every channel, the channels cut into normalizationParts
// parts.
template <class F>
void forChannels(const Step& s, const Geometry& g, F&& f) {
  const int parts = normalizationParts(s, s.pool == nullptr ? 1 : s.pool->threads());
  if (parts == 1) {
    for (int64_t c = 0; c < g.channels; ++c) f(c);
    return;
  }
  s.pool->run(parts, [&](int part, int) {
    for (int64_t c = g.channels * part / parts; c < g.channels * (part + 1) / parts; ++c) f(c);
  });
}

// f(inputs, output) for every group of every run.
template <class F>
void forGroups(const Step& s, std::size_t inputs, F&& f) {
  for (const Run& run : s.runs) {
    for (int64_t k = 0; k < run.count; ++k) {
      std::array<const float*, 3> in{};
      for (std::size_t i = 0; i < inputs; ++i)
        in[i] = inOf(s, run, i) + (run.advance[i] ? k * s.inElements[i] : 0);
      f(in, outOf(s, run) + k * s.outElements);
    }
  }
}

double invStdOf(double variance, double epsilon) { return 1.0 / std::sqrt(variance + epsilon); }

// x -> [2, C]: mean, then the variance of the centred values.
void statsKernel(const Step& s) {
  const Geometry g = geometryOf(s);
  forGroups(s, 1, [&](const std::array<const float*, 3>& in, float* out) {
    forChannels(s, g, [&](int64_t c) {
      const float* x = in[0] + c * g.spatial;
      const double mean =
          sumChannel(g, [&](int64_t k) { return static_cast<double>(x[k]); }) / g.perChannel();
      const double squares = sumChannel(g, [&](int64_t k) {
        const double d = static_cast<double>(x[k]) - mean;
        return d * d;
      });
      out[c] = static_cast<float>(mean);
      out[g.channels + c] = static_cast<float>(squares / g.perChannel());
    });
  });
}

// (x, stats, affine) -> y.
void normalizeKernel(const Step& s) {
  const Geometry g = geometryOf(s);
  forGroups(s, 3, [&](const std::array<const float*, 3>& in, float* out) {
    forChannels(s, g, [&](int64_t c) {
      const double mean = in[1][c];
      const double factor = static_cast<double>(in[2][c]) * invStdOf(in[1][g.channels + c], g.epsilon);
      const double bias = in[2][g.channels + c];
      const float* x = in[0] + c * g.spatial;
      float* y = out + c * g.spatial;
      forChannelValues(g, [&](int64_t k) {
        y[k] = static_cast<float>((static_cast<double>(x[k]) - mean) * factor + bias);
      });
    });
  });
}

// (dy, x, stats) -> [2, C]: sum(dy * xhat), sum(dy).
void gradStatsKernel(const Step& s) {
  const Geometry g = geometryOf(s);
  forGroups(s, 3, [&](const std::array<const float*, 3>& in, float* out) {
    forChannels(s, g, [&](int64_t c) {
      const float* dy = in[0] + c * g.spatial;
      const float* x = in[1] + c * g.spatial;
      const double mean = in[2][c];
      const double invStd = invStdOf(in[2][g.channels + c], g.epsilon);
      const double centred = sumChannel(
          g, [&](int64_t k) { return static_cast<double>(dy[k]) * (static_cast<double>(x[k]) - mean); });
      const double sum = sumChannel(g, [&](int64_t k) { return static_cast<double>(dy[k]); });
      out[c] = static_cast<float>(centred * invStd);
      out[g.channels + c] = static_cast<float>(sum);
    });
  });
}

// (dy, x, [6, C]: mean, variance, sum(dy * xhat), sum(dy), scale, bias) -> dx.
void gradKernel(const Step& s) {
  const Geometry g = geometryOf(s);
  forGroups(s, 3, [&](const std::array<const float*, 3>& in, float* out) {
    forChannels(s, g, [&](int64_t c) {
      const float* p = in[2];
      const int64_t C = g.channels;
      const double mean = p[c];
      const double invStd = invStdOf(p[C + c], g.epsilon);
      const double xhatFactor = static_cast<double>(p[2 * C + c]) / g.perChannel() * invStd;
      const double meanDy = static_cast<double>(p[3 * C + c]) / g.perChannel();
      const double factor = static_cast<double>(p[4 * C + c]) * invStd;
      const float* dy = in[0] + c * g.spatial;
      const float* x = in[1] + c * g.spatial;
      float* dx = out + c * g.spatial;
      forChannelValues(g, [&](int64_t k) {
        dx[k] = static_cast<float>(
            factor * (static_cast<double>(dy[k]) - meanDy - (static_cast<double>(x[k]) - mean) * xhatFactor));
      });
    });
  });
}

template <Kernel kKernel>
void planNormalization(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  // x is input 0 of the forward ops, input 1 of the gradients.
  const bool forward = op.kind == OpKind::BatchNormStats || op.kind == OpKind::BatchNorm;
  const Shape& x = planner.shape(op.inputs[forward ? 0 : 1]);
  int64_t spatial = 1;
  for (std::size_t i = 2; i < x.size(); ++i) spatial *= x[i];
  if (op.inputs.size() == 1)
    planner.runsOver(step, {{op.inputs[0], 0}});
  else
    planner.runsOver(step, {{op.inputs[0], 0}, {op.inputs[1], 0}, {op.inputs[2], 0}});
  step.table = {x[0], x[1], spatial};
  step.table2 = {std::bit_cast<int64_t>(op.attributes.a)};
  step.kernel = kKernel;
  planner.emit(std::move(step));
}

}  // namespace

int normalizationParts(const Step& step, int threads) {
  if (step.table.size() < 3) return 1;
  const int64_t values = step.table[0] * step.table[1] * step.table[2];
  return static_cast<int>(
      std::clamp<int64_t>(std::min(values / kMinPartElements, step.table[1]), 1, threads));
}

void addNormalizationKernels(KernelTable& table) {
  table.add({.kind = OpKind::BatchNormStats, .plan = planNormalization<statsKernel>});
  table.add({.kind = OpKind::BatchNorm, .plan = planNormalization<normalizeKernel>});
  table.add({.kind = OpKind::BatchNormGradStats, .plan = planNormalization<gradStatsKernel>});
  table.add({.kind = OpKind::BatchNormGrad, .plan = planNormalization<gradKernel>});
}

}  // namespace tessera::sim
