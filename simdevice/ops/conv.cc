// The convolution family's kernels (lib/ops/conv.cc defines the ops): GEMMs
// of gemm.hpp on columns of the windows' taps (im2col), in the convolution's
// terms of lib/ops/conv.cc (conv input [N, Ci, I..], conv output
// [N, Co, P..], weight [Co, Ci/group, K..]); per sample and channel group:
//   Conv            out = W · cols(in)                    [Co/g, P]
//   ConvTranspose   cols = W^T · out, scattered to in     (col2im)
//   ConvGradWeight  W = out · cols(in)^T over all samples [Co/g, Ci/g K]
// The tap table (lib/ops/window.hpp) is built at load time. Every sum runs
// in an order fixed by the shapes, so results do not depend on how many
// replicas a run stacks.
#include <algorithm>
#include <cstring>

#include "half.hpp"
#include "kernel_table.hpp"
#include "ops/window.hpp"

namespace tessera::sim {
namespace {

// The weight gradient's columns of several samples go to scratch at once,
// up to this many floats: few enough that they are still in cache when
// the GEMM reads them.
constexpr int64_t kWeightColumnsFloats = int64_t{1} << 16;
// Multiply-adds of a weight gradient (all samples) from which its two
// halves run on two threads (convBackwardWeight).
constexpr int64_t kMinWeightHalvesWork = int64_t{1} << 18;
// A weight gradient with fewer output channels per group than this (the
// floats of an AVX-512 vector) computes dy · columns^T as it stands.
constexpr int64_t kDyFirstBelow = 16;

// Step::table2 holds the convolution's sizes: `width` output positions per
// row of the last spatial axis, `step` input positions between two of them;
// `dyFirst` (ConvGradWeight): the product is dy · columns^T as it stands
// (see convBackwardWeight).
// Step::table holds, for each tap k and output row, the row's positions
// that read the input: [lo, hi) of the row, from input position `at` on.
struct ConvSizes {
  int64_t batch, cIn, cOut, group, inPositions, taps, outPositions, chunk, direct, width, step, dyFirst;

  int64_t cInGroup() const { return cIn / group; }
  int64_t cOutGroup() const { return cOut / group; }
  int64_t columnRows() const { return cInGroup() * taps; }
};

ConvSizes sizesOf(const Step& s) {
  const int64_t* t = s.table2.data();
  return {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11]};
}

// Work (multiply-adds) per part of a convolution split over threads by
// samples: below about a microsecond of work, handing a part to another
// thread costs more than it saves.
constexpr int64_t kMinPartWork = int64_t{1} << 16;

// Thread t's workspace (GemmScratch::product).
float* workspace(const Step& s, int thread) { return s.scratch->product + thread * s.scratch->productStride; }

// f(first, last, thread) over samples [first, last) of `batch`, split over
// the step's threads when each part has at least kMinPartWork of
// `perSample` work. Samples are independent and each is computed the same
// way in any part on any thread.
template <class F>
void forSamples(const Step& s, int64_t batch, int64_t perSample, F&& f) {
  const int64_t parts64 =
      s.pool == nullptr
          ? 1
          : std::clamp<int64_t>(std::min(batch * perSample / kMinPartWork, batch), 1, s.pool->threads());
  const int parts = static_cast<int>(parts64);
  if (parts == 1) return f(int64_t{0}, batch, callerThread(s));
  s.pool->run(parts,
              [&](int part, int thread) { f(batch * part / parts, batch * (part + 1) / parts, thread); });
}

// The segments of each tap's column row (Step::table) from the tap table
// (lib/ops/window.hpp): along a row of the last axis the taps inside the
// input are consecutive and `step` apart. After them, per tap, whether its
// column row is a shifted copy of the input plane (kShift* below).
std::vector<int64_t> segmentsOf(const std::vector<int64_t>& taps, int64_t kernelTaps, int64_t positions,
                                int64_t width, int64_t step) {
  std::vector<int64_t> segments;
  const int64_t rows = width == 0 ? 0 : positions / width;
  for (int64_t k = 0; k < kernelTaps; ++k) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t* tap = taps.data() + k * positions + r * width;
      int64_t lo = 0;
      while (lo < width && tap[lo] < 0) ++lo;
      int64_t hi = lo;
      while (hi < width && tap[hi] >= 0) ++hi;
      segments.insert(segments.end(), {lo, hi, lo < hi ? tap[lo] : 0});
    }
  }
  // A tap whose every position p inside the input reads input position
  // base + p (stride 1 and rows as wide as the input's, e.g. a "same"
  // convolution): its column row is one copy of the plane from base on,
  // with the pads cleared after.
  for (int64_t k = 0; k < kernelTaps; ++k) {
    const int64_t* segment = segments.data() + k * rows * 3;
    int64_t base = 0;
    int64_t first = -1;
    int64_t last = 0;
    bool shifted = step == 1;
    for (int64_t r = 0; shifted && r < rows; ++r, segment += 3) {
      if (segment[0] >= segment[1]) continue;
      const int64_t at = segment[2] - (r * width + segment[0]);
      if (first < 0) base = at, first = r * width + segment[0];
      shifted = at == base;
      last = r * width + segment[1];
    }
    shifted = shifted && first >= 0;
    segments.insert(segments.end(), {shifted ? 1 : 0, base, shifted ? first : 0, shifted ? last : 0});
  }
  return segments;
}

// The per-tap entries after the segments: shifted copy (0 or 1), base,
// first and last position of the copy.
constexpr int64_t kShiftFields = 4;

// Copies and clears of a few floats, inline: a segment is a row of a
// window, where a library call costs more than the copy.
void copyShort(const float* from, int64_t n, float* to) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) std::memcpy(to + i, from + i, 8 * sizeof(float));
  if (n - i >= 4) std::memcpy(to + i, from + i, 4 * sizeof(float)), i += 4;
  if (n - i >= 2) std::memcpy(to + i, from + i, 2 * sizeof(float)), i += 2;
  if (n - i >= 1) to[i] = from[i];
}

void zeroShort(float* to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) to[i] = 0.0f;
}

// cols[(c K + k) stride + p] = in[c, tap k of window p] (0 in the pads) for
// the Ci/g channels at `in`.
void im2col(const ConvSizes& z, const int64_t* segments, const float* in, float* cols, int64_t stride) {
  const int64_t rows = z.width == 0 ? 0 : z.outPositions / z.width;
  const int64_t* shifts = segments + z.taps * rows * 3;
  for (int64_t c = 0; c < z.cInGroup(); ++c) {
    const float* plane = in + c * z.inPositions;
    for (int64_t k = 0; k < z.taps; ++k) {
      float* row = cols + (c * z.taps + k) * stride;
      const int64_t* segment = segments + k * rows * 3;
      const int64_t* shift = shifts + k * kShiftFields;
      if (shift[0] != 0) {
        const int64_t first = shift[2];
        const int64_t last = shift[3];
        std::fill(row, row + first, 0.0f);
        std::copy_n(plane + (shift[1] + first), last - first, row + first);
        std::fill(row + last, row + z.outPositions, 0.0f);
        for (int64_t r = 0; r < rows; ++r, segment += 3, row += z.width) {
          const int64_t lo = segment[0] < segment[1] ? segment[0] : z.width;
          for (int64_t p = 0; p < lo; ++p) row[p] = 0.0f;
          for (int64_t p = segment[1]; p < z.width; ++p) row[p] = 0.0f;
        }
        continue;
      }
      for (int64_t r = 0; r < rows; ++r, segment += 3, row += z.width) {
        const int64_t lo = segment[0];
        const int64_t hi = segment[1];
        const float* from = plane + segment[2];
        zeroShort(row, lo);
        if (z.step == 1) {
          copyShort(from, hi - lo, row + lo);
        } else {
          for (int64_t p = lo; p < hi; ++p) row[p] = from[(p - lo) * z.step];
        }
        zeroShort(row + hi, z.width - hi);
      }
    }
  }
}

// in[c, tap k of window p] += cols[(c K + k) P + p], in that order.
void col2im(const ConvSizes& z, const int64_t* segments, const float* cols, float* in) {
  const int64_t rows = z.width == 0 ? 0 : z.outPositions / z.width;
  std::fill_n(in, z.cInGroup() * z.inPositions, 0.0f);
  for (int64_t c = 0; c < z.cInGroup(); ++c) {
    float* plane = in + c * z.inPositions;
    for (int64_t k = 0; k < z.taps; ++k) {
      const float* row = cols + (c * z.taps + k) * z.outPositions;
      const int64_t* segment = segments + k * rows * 3;
      for (int64_t r = 0; r < rows; ++r, segment += 3, row += z.width) {
        float* to = plane + segment[2];
        const int64_t lo = segment[0];
        const int64_t hi = segment[1];
        if (z.step == 1) {
          for (int64_t p = lo; p < hi; ++p) to[p - lo] += row[p];
        } else {
          for (int64_t p = lo; p < hi; ++p) to[(p - lo) * z.step] += row[p];
        }
      }
    }
  }
}

// Operands of group g of a run.
const float* operand(const Step& s, const Run& run, std::size_t i, int64_t g) {
  return inOf(s, run, i) + (run.advance[i] ? g * s.inElements[i] : 0);
}

// Conv: operand 0 the conv input, 1 the weight; the output the conv output.
// Samples in parallel, each thread with its own columns.
void convForward(const Step& s) {
  const ConvSizes z = sizesOf(s);
  const int64_t rows = z.columnRows();
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      const float* x = operand(s, run, 0, g);
      const float* w = operand(s, run, 1, g);
      float* y = outOf(s, run) + g * s.outElements;
      forSamples(s, z.batch, z.cOut * rows * z.outPositions, [&](int64_t first, int64_t last, int thread) {
        float* cols = workspace(s, thread);
        for (int64_t n = first; n < last; ++n) {
          for (int64_t gi = 0; gi < z.group; ++gi) {
            const float* in = x + (n * z.cIn + gi * z.cInGroup()) * z.inPositions;
            if (z.direct == 0) im2col(z, s.table.data(), in, cols, z.outPositions);
            runGemmOn(s, thread, {z.cOutGroup(), z.outPositions, rows, false, false, s.halfOutput},
                      w + gi * z.cOutGroup() * rows, z.direct != 0 ? in : cols,
                      y + (n * z.cOut + gi * z.cOutGroup()) * z.outPositions, 1.0f);
          }
        }
      });
    }
  }
}

// ConvTranspose: operand 0 the conv output, 1 the weight; the output the
// conv input. Samples in parallel, each thread with its own columns.
void convBackwardData(const Step& s) {
  const ConvSizes z = sizesOf(s);
  const int64_t rows = z.columnRows();
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      const float* dy = operand(s, run, 0, g);
      const float* w = operand(s, run, 1, g);
      float* dx = outOf(s, run) + g * s.outElements;
      forSamples(s, z.batch, z.cOut * rows * z.outPositions, [&](int64_t first, int64_t last, int thread) {
        float* cols = workspace(s, thread);
        for (int64_t n = first; n < last; ++n) {
          for (int64_t gi = 0; gi < z.group; ++gi) {
            float* in = dx + (n * z.cIn + gi * z.cInGroup()) * z.inPositions;
            runGemmOn(s, thread,
                      {rows, z.outPositions, z.cOutGroup(), true, false, s.halfOutput && z.direct != 0},
                      w + gi * z.cOutGroup() * rows, dy + (n * z.cOut + gi * z.cOutGroup()) * z.outPositions,
                      z.direct != 0 ? in : cols, 1.0f);
            if (z.direct == 0) {
              col2im(z, s.table.data(), cols, in);
              // Each sum is whole once its sample's columns are in.
              if (s.halfOutput) roundToHalves(in, static_cast<std::size_t>(z.cInGroup() * z.inPositions));
            }
          }
        }
      });
    }
  }
}

// ConvGradWeight: operand 0 the conv output's gradient, 1 the conv input;
// the output the weight's gradient. Per channel group, the samples go in
// chunks of `chunk`: dy packed [Co/g, chunk P], columns [Ci/g K, chunk P].
// One GEMM per chunk computes the transposed gradient [Ci/g K, Co/g] =
// columns · dy^T: the GEMM packs (transposes) dy, which has fewer rows than
// the columns. When Co/g is narrower than a vector (`dyFirst`), most of
// each of that product's tiles would be empty, so it computes dy ·
// columns^T [Co/g, Ci/g K] as it stands instead. Each element is the same
// sum in the same order either way (each product of two values, added in
// the order of the long sum).
//
// The chunks go in two halves (the first ceil(chunks / 2) and the others),
// at any thread count: each half's first chunk's product is that half's
// sum, its later chunks add theirs, and the gradient is the first half's
// sum plus the second's. On two threads or more, each half runs on a thread
// of its own, with its own columns and GEMMs: the samples a thread reads
// are the ones the steps before wrote on it (they split the batch the same
// way), and the threads meet once.
void convBackwardWeight(const Step& s) {
  const ConvSizes z = sizesOf(s);
  const int64_t rows = z.columnRows();
  const int64_t width = z.chunk * z.outPositions;
  const int64_t co = z.cOutGroup();
  const int64_t chunks = z.batch == 0 ? 0 : (z.batch + z.chunk - 1) / z.chunk;
  const int64_t firstHalf = (chunks + 1) / 2;
  const int halves = chunks >= 2 ? 2 : 1;
  const int parts = s.pool != nullptr && s.pool->threads() >= 2 &&
                            z.batch * rows * co * z.outPositions >= kMinWeightHalvesWork
                        ? halves
                        : 1;
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      const float* dy = operand(s, run, 0, g);
      const float* x = operand(s, run, 1, g);
      float* dw = outOf(s, run) + g * s.outElements;
      for (int64_t gi = 0; gi < z.group; ++gi) {
        float* dwGroup = dw + gi * co * rows;
        float* second = nullptr;  // the second half's sum [Co/g, Ci/g K]
        // Half h's sum into `to` ([Co/g, Ci/g K], rows of Ci/g K) on `thread`.
        const auto half = [&](int h, int thread) {
          float* cols = workspace(s, thread);
          float* packed = cols + rows * width;
          float* partial = packed + co * width;
          float* to = h == 0 ? dwGroup : partial + co * rows;
          if (h == 1) second = to;
          const int64_t c0 = h == 0 ? 0 : firstHalf;
          const int64_t c1 = h == 0 && halves == 2 ? firstHalf : chunks;
          for (int64_t chunk = c0; chunk < c1; ++chunk) {
            const int64_t n0 = chunk * z.chunk;
            const int64_t count = std::min(z.chunk, z.batch - n0);
            const int64_t depth = count * z.outPositions;
            for (int64_t j = 0; j < count; ++j) {
              const int64_t n = n0 + j;
              im2col(z, s.table.data(), x + (n * z.cIn + gi * z.cInGroup()) * z.inPositions,
                     cols + j * z.outPositions, depth);
              for (int64_t m = 0; m < co; ++m) {
                std::copy_n(dy + (n * z.cOut + gi * co + m) * z.outPositions, z.outPositions,
                            packed + m * depth + j * z.outPositions);
              }
            }
            if (z.dyFirst != 0) {
              runGemmOn(s, thread, {co, rows, depth, false, true}, packed, cols, partial, 1.0f);
            } else {
              runGemmOn(s, thread, {rows, co, depth, false, true}, cols, packed, partial, 1.0f);
            }
            for (int64_t m = 0; m < co; ++m) {
              float* sum = to + m * rows;
              // Element (m, r) of the product.
              const float* from = z.dyFirst != 0 ? partial + m * rows : partial + m;
              const int64_t stride = z.dyFirst != 0 ? 1 : co;
              if (chunk == c0) {
                for (int64_t r = 0; r < rows; ++r) sum[r] = from[r * stride];
              } else {
                for (int64_t r = 0; r < rows; ++r) sum[r] += from[r * stride];
              }
            }
          }
        };
        if (parts == 1) {
          for (int h = 0; h < halves; ++h) half(h, callerThread(s));
        } else {
          s.pool->run(parts, [&](int h, int thread) { half(h, thread); });
        }
        if (second != nullptr) {
          for (int64_t i = 0; i < co * rows; ++i) dwGroup[i] += second[i];
        }
        if (s.halfOutput) roundToHalves(dwGroup, static_cast<std::size_t>(co * rows));
      }
    }
  }
}

enum class Way { Forward, BackwardData, BackwardWeight };

// The tensors of the op in the convolution's terms: conv input, conv
// output, weight.
template <Way kWay>
void planConv(StepPlanner& planner, Step& step) {
  const OpNode& op = planner.op();
  const TensorId y = op.outputs[0];
  const TensorId a = op.inputs[0];
  const TensorId b = op.inputs[1];
  const Shape& convIn = planner.shape(kWay == Way::Forward ? a : kWay == Way::BackwardData ? y : b);
  const Shape& convOut = planner.shape(kWay == Way::Forward ? y : a);
  const Shape& weight = planner.shape(kWay == Way::BackwardWeight ? y : b);
  const WindowGeometry window =
      windowOf(spatialOf(convIn), spatialOf(weight), spatialOf(convOut), op.attributes);
  const std::vector<int64_t> taps = windowTaps(window);
  ConvSizes z{convIn[0],
              convIn[1],
              convOut[1],
              op.attributes.group,
              window.inPositions(),
              window.taps(),
              window.outPositions(),
              1,
              0,
              window.out.back(),
              window.strides.back(),
              0};
  step.table = segmentsOf(taps, z.taps, z.outPositions, z.width, z.step);
  // A window that reads each input position once, in order (1x1, stride 1,
  // no pads): the input is its own column matrix.
  bool identity = z.taps == 1 && z.inPositions == z.outPositions;
  for (int64_t p = 0; identity && p < z.outPositions; ++p) identity = taps[static_cast<std::size_t>(p)] == p;
  z.direct = identity && kWay != Way::BackwardWeight ? 1 : 0;
  const int64_t rows = z.columnRows();
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  if constexpr (kWay == Way::Forward) {
    m = z.cOutGroup(), n = z.outPositions, k = rows;
    step.workFloats = z.direct != 0 ? 0 : rows * z.outPositions;
    step.kernel = convForward;
  } else if constexpr (kWay == Way::BackwardData) {
    m = rows, n = z.outPositions, k = z.cOutGroup();
    step.workFloats = z.direct != 0 ? 0 : rows * z.outPositions;
    step.kernel = convBackwardData;
  } else {
    const int64_t perSample = std::max<int64_t>((rows + z.cOutGroup()) * z.outPositions, 1);
    z.chunk = std::clamp<int64_t>(kWeightColumnsFloats / perSample, 1, std::max<int64_t>(z.batch, 1));
    // The transposed product, or dy · columns^T when Co/g is narrower than
    // the widest vector of floats (see convBackwardWeight).
    z.dyFirst = z.cOutGroup() < kDyFirstBelow && rows > z.cOutGroup() ? 1 : 0;
    m = rows, n = z.cOutGroup(), k = z.chunk * z.outPositions;
    if (z.dyFirst != 0) std::swap(m, n);
    // Columns, dy and a product per thread, and the second half's sum.
    step.workFloats = (rows + z.cOutGroup()) * k + 2 * z.cOutGroup() * rows;
    step.kernel = convBackwardWeight;
  }
  step.table2 = {z.batch,        z.cIn,   z.cOut,   z.group, z.inPositions, z.taps,
                 z.outPositions, z.chunk, z.direct, z.width, z.step,        z.dyFirst};
  step.gemmPlan = sim::planGemm(bestGemmIsa(), m, n, k);
  // A float16 output is rounded in the kernel, each element once its sum
  // is whole and while it is in cache, not by a pass after the step.
  step.halfOutput = planner.halfOutput();
  planner.runsOver(step, {{a, 0}, {b, 0}});
  planner.emit(std::move(step));
}

}  // namespace

void addConvKernels(KernelTable& table) {
  table.add({.kind = OpKind::Conv, .plan = planConv<Way::Forward>});
  table.add({.kind = OpKind::ConvTranspose, .plan = planConv<Way::BackwardData>});
  table.add({.kind = OpKind::ConvGradWeight, .plan = planConv<Way::BackwardWeight>});
}

}  // namespace tessera::sim
