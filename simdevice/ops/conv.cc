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
#include <cmath>
#include <cstring>

#include "half.hpp"
#include "kernel_table.hpp"
#include "ops/window.hpp"
#include "x86_simd.hpp"

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
// (see convBackwardWeight); `mode` how the kernel runs (kPerSample,
// kSampleChunks or kDepthwise below), `chunk` the samples of a chunk.
// Step::table holds, for each tap k and output row, the row's positions
// that read the input: [lo, hi) of the row, from input position `at` on.
struct ConvSizes {
  int64_t batch, cIn, cOut, group, inPositions, taps, outPositions, chunk, direct, width, step, dyFirst, mode;
  int64_t fullTaps;  // the weight's taps; `taps` counts the live ones (see liveTaps)

  int64_t cInGroup() const { return cIn / group; }
  int64_t cOutGroup() const { return cOut / group; }
  int64_t columnRows() const { return cInGroup() * taps; }
};

// Conv and ConvTranspose: one product per sample and channel group.
constexpr int64_t kPerSample = 0;
// Conv and ConvTranspose: one product per chunk of `chunk` samples and
// channel group, the samples side by side in its columns: a conv output of
// few positions (the deep layers of a CNN) makes a product of a few columns
// per sample, which reads the whole weight for little work.
constexpr int64_t kSampleChunks = 1;
// Every kind: one input and one output channel per group (a depthwise
// convolution), computed directly, channel by channel, without products.
constexpr int64_t kDepthwise = 2;
// Floats of the columns (and packed conv outputs) of a chunk of samples
// (kSampleChunks) at most: still in the second-level cache.
constexpr int64_t kChunkColumnsFloats = int64_t{1} << 19;
// ConvGradWeight: the deepest sum (samples x positions) computed as one
// product of the whole batch; deeper ones go by chunks in two halves.
constexpr int64_t kWholeDepth = 2048;

ConvSizes sizesOf(const Step& s) {
  const int64_t* t = s.table2.data();
  return {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11], t[12], t[13]};
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

// Taps that read only pads (a 3 x 3 window with pads of 1 over a 1 x 1
// plane: all but the middle one) add nothing: the kernels leave them out of
// their columns and products. `taps` counts the live ones, `fullTaps` the
// weight's; the live taps' indices follow the shift entries of Step::table.
const int64_t* liveTaps(const Step& s, const ConvSizes& z) {
  const int64_t rows = z.width == 0 ? 0 : z.outPositions / z.width;
  return s.table.data() + z.taps * rows * 3 + z.taps * kShiftFields;
}

// The weight [Co, Ci/g, fullTaps] at `w` with the live taps only, to `to`
// [Co, Ci/g, taps]; nothing to do (w itself) when every tap is live.
const float* liveWeight(const Step& s, const ConvSizes& z, const float* w, float* to) {
  if (z.taps == z.fullTaps) return w;
  const int64_t* live = liveTaps(s, z);
  for (int64_t r = 0; r < z.cOut * z.cInGroup(); ++r) {
    for (int64_t k = 0; k < z.taps; ++k) to[r * z.taps + k] = w[r * z.fullTaps + live[k]];
  }
  return to;
}

// The weight gradient of the live taps [Co, Ci/g, taps] at `dw` spread in
// place to the weight's [Co, Ci/g, fullTaps], 0 for the other taps: from the
// last element back, each read before a write can reach it.
void spreadLiveTaps(const Step& s, const ConvSizes& z, float* dw) {
  if (z.taps == z.fullTaps) return;
  const int64_t* live = liveTaps(s, z);
  for (int64_t r = z.cOut * z.cInGroup() - 1; r >= 0; --r) {
    int64_t k = z.taps - 1;
    for (int64_t full = z.fullTaps - 1; full >= 0; --full) {
      if (k >= 0 && live[k] == full) {
        dw[r * z.fullTaps + full] = dw[r * z.taps + k];
        --k;
      } else {
        dw[r * z.fullTaps + full] = 0.0f;
      }
    }
  }
}

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

// The co planes of P positions of one sample ([co, P] from `planes`) to
// columns j P .. (j + 1) P of the [co, width] matrix `packed` (the samples of
// a chunk side by side), and back.
void packPlanes(const float* planes, int64_t co, int64_t positions, float* packed, int64_t width, int64_t j) {
  for (int64_t m = 0; m < co; ++m) {
    std::copy_n(planes + m * positions, positions, packed + m * width + j * positions);
  }
}

void unpackPlanes(const float* packed, int64_t width, int64_t j, int64_t co, int64_t positions,
                  float* planes) {
  for (int64_t m = 0; m < co; ++m) {
    std::copy_n(packed + m * width + j * positions, positions, planes + m * positions);
  }
}

// cols[(c K + k) stride + p] = in[c, tap k of window p] (0 in the pads) for
// the Ci/g channels at `in`.
void im2col(const ConvSizes& z, const int64_t* segments, const float* in, float* cols, int64_t stride) {
  if (z.direct != 0) {
    for (int64_t c = 0; c < z.cInGroup(); ++c) std::copy_n(in + c * z.inPositions, z.outPositions, cols + c * stride);
    return;
  }
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

// in[c, tap k of window p] = sum over (k, p) in that order of
// cols[(c K + k) stride + p] (a copy for a direct window).
void col2im(const ConvSizes& z, const int64_t* segments, const float* cols, float* in, int64_t stride) {
  if (z.direct != 0) {
    for (int64_t c = 0; c < z.cInGroup(); ++c) std::copy_n(cols + c * stride, z.inPositions, in + c * z.inPositions);
    return;
  }
  const int64_t rows = z.width == 0 ? 0 : z.outPositions / z.width;
  std::fill_n(in, z.cInGroup() * z.inPositions, 0.0f);
  for (int64_t c = 0; c < z.cInGroup(); ++c) {
    float* plane = in + c * z.inPositions;
    for (int64_t k = 0; k < z.taps; ++k) {
      const float* row = cols + (c * z.taps + k) * stride;
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
              col2im(z, s.table.data(), cols, in, z.outPositions);
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
              packPlanes(dy + (n * z.cOut + gi * co) * z.outPositions, co, z.outPositions, packed, depth, j);
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
      spreadLiveTaps(s, z, dw);
    }
  }
}

// f(first, last, thread) over samples [first, last) of `count`, split over
// the step's threads when there is more than one sample: the copies
// around a chunk's product (each sample's part is the same in any split).
template <class F>
void forChunkSamples(const Step& s, int64_t count, F&& f) {
  const int parts = s.pool == nullptr ? 1 : static_cast<int>(std::clamp<int64_t>(count, 1, s.pool->threads()));
  if (parts == 1) return f(int64_t{0}, count, callerThread(s));
  s.pool->run(parts,
              [&](int part, int thread) { f(count * part / parts, count * (part + 1) / parts, thread); });
}

// ConvGradWeight of the whole batch at once (kSampleChunks, when the
// columns and conv outputs of every sample fit kChunkColumnsFloats): per
// group, the columns of all samples side by side [Ci/g K, N P] and their
// conv outputs' gradients [Co/g, N P], then one product dy · columns^T
// [Co/g, Ci/g K] over the threads (runGemm), straight into the gradient.
void convBackwardWeightWhole(const Step& s) {
  const ConvSizes z = sizesOf(s);
  const int64_t rows = z.columnRows();
  const int64_t co = z.cOutGroup();
  const int64_t width = z.batch * z.outPositions;
  float* cols = workspace(s, callerThread(s));
  float* packed = cols + rows * width;
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      const float* dy = operand(s, run, 0, g);
      const float* x = operand(s, run, 1, g);
      float* dw = outOf(s, run) + g * s.outElements;
      for (int64_t gi = 0; gi < z.group; ++gi) {
        forChunkSamples(s, z.batch, [&](int64_t first, int64_t last, int) {
          for (int64_t n = first; n < last; ++n) {
            im2col(z, s.table.data(), x + (n * z.cIn + gi * z.cInGroup()) * z.inPositions,
                   cols + n * z.outPositions, width);
            packPlanes(dy + (n * z.cOut + gi * co) * z.outPositions, co, z.outPositions, packed, width, n);
          }
        });
        runGemm(s, {co, rows, width, false, true, s.halfOutput}, packed, cols, dw + gi * co * rows, 1.0f);
      }
      spreadLiveTaps(s, z, dw);
    }
  }
}

// Conv by chunks of samples (kSampleChunks): per chunk and group, the
// columns of its samples side by side [Ci/g K, chunk P], one product
// W · columns [Co/g, chunk P] over the threads (runGemm), and its columns
// copied to each sample's output. Each element is the same sum in the same
// order as one sample's product (the GEMM sums each element over k in an
// order that does not depend on the other dimensions).
void convForwardChunks(const Step& s) {
  const ConvSizes z = sizesOf(s);
  const int64_t rows = z.columnRows();
  const int64_t co = z.cOutGroup();
  float* cols = workspace(s, callerThread(s));
  float* weight = cols + z.chunk * (rows + co) * z.outPositions;
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      const float* x = operand(s, run, 0, g);
      const float* w = liveWeight(s, z, operand(s, run, 1, g), weight);
      float* y = outOf(s, run) + g * s.outElements;
      for (int64_t n0 = 0; n0 < z.batch; n0 += z.chunk) {
        const int64_t count = std::min(z.chunk, z.batch - n0);
        const int64_t width = count * z.outPositions;
        float* product = cols + rows * width;
        for (int64_t gi = 0; gi < z.group; ++gi) {
          forChunkSamples(s, count, [&](int64_t first, int64_t last, int) {
            for (int64_t j = first; j < last; ++j) {
              im2col(z, s.table.data(), x + ((n0 + j) * z.cIn + gi * z.cInGroup()) * z.inPositions,
                     cols + j * z.outPositions, width);
            }
          });
          runGemm(s, {co, width, rows, false, false, s.halfOutput}, w + gi * co * rows, cols, product, 1.0f);
          forChunkSamples(s, count, [&](int64_t first, int64_t last, int) {
            for (int64_t j = first; j < last; ++j) {
              unpackPlanes(product, width, j, co, z.outPositions,
                           y + ((n0 + j) * z.cOut + gi * co) * z.outPositions);
            }
          });
        }
      }
    }
  }
}

// ConvTranspose by chunks of samples (kSampleChunks): per chunk and group,
// the conv outputs of its samples side by side [Co/g, chunk P], one product
// W^T · them [Ci/g K, chunk P] over the threads, then col2im per sample.
void convBackwardDataChunks(const Step& s) {
  const ConvSizes z = sizesOf(s);
  const int64_t rows = z.columnRows();
  const int64_t co = z.cOutGroup();
  float* cols = workspace(s, callerThread(s));
  float* weight = cols + z.chunk * (rows + co) * z.outPositions;
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      const float* dy = operand(s, run, 0, g);
      const float* w = liveWeight(s, z, operand(s, run, 1, g), weight);
      float* dx = outOf(s, run) + g * s.outElements;
      for (int64_t n0 = 0; n0 < z.batch; n0 += z.chunk) {
        const int64_t count = std::min(z.chunk, z.batch - n0);
        const int64_t width = count * z.outPositions;
        float* packed = cols + rows * width;
        for (int64_t gi = 0; gi < z.group; ++gi) {
          forChunkSamples(s, count, [&](int64_t first, int64_t last, int) {
            for (int64_t j = first; j < last; ++j) {
              packPlanes(dy + ((n0 + j) * z.cOut + gi * co) * z.outPositions, co, z.outPositions, packed,
                         width, j);
            }
          });
          runGemm(s, {rows, width, co, true, false, s.halfOutput && z.direct != 0}, w + gi * co * rows, packed,
                  cols, 1.0f);
          forChunkSamples(s, count, [&](int64_t first, int64_t last, int) {
            for (int64_t j = first; j < last; ++j) {
              float* in = dx + ((n0 + j) * z.cIn + gi * z.cInGroup()) * z.inPositions;
              col2im(z, s.table.data(), cols + j * z.outPositions, in, width);
              if (s.halfOutput && z.direct == 0) {
                roundToHalves(in, static_cast<std::size_t>(z.cInGroup() * z.inPositions));
              }
            }
          });
        }
      }
    }
  }
}

// Depthwise convolutions (kDepthwise): one input and one output channel
// per group, so each output element is a sum over the K taps alone. The
// kernels below compute, per sample and channel, the K columns of the
// channel (im2col) and then, vectorised over the positions:
//   forward     y[p] = sum over k in order of w[k] cols[k][p]: one fused
//               multiply-add a tap from 0, the same sum as the product of
//               a 1 x K weight by the columns;
//   data        cols[k][p] = w[k] dy[p], added into the input by col2im;
//   weight      dw[k] = sum over samples and positions of dy cols[k]: 16
//               lanes (position p in lane p mod 16 of its sample's plane)
//               each summed in order of the samples and positions, then
//               the lanes in order.
// Channels are split over the threads; every sum is the same on any.

#if TESSERA_X86_SIMD
__attribute__((target("avx512f"))) void tapSumsAvx512(const float* w, const float* cols, int64_t taps,
                                                      int64_t positions, float* y) {
  for (int64_t p = 0; p < positions; p += 16) {
    const __mmask16 mask = firstLanes16(positions - p);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t k = 0; k < taps; ++k) {
      sum = _mm512_fmadd_ps(_mm512_set1_ps(w[k]), _mm512_maskz_loadu_ps(mask, cols + k * positions + p), sum);
    }
    _mm512_mask_storeu_ps(y + p, mask, sum);
  }
}

__attribute__((target("avx512f"))) void laneSumsAvx512(const float* dy, const float* cols, int64_t positions,
                                                       float* lanes) {
  __m512 sum = _mm512_loadu_ps(lanes);
  for (int64_t p = 0; p < positions; p += 16) {
    const __mmask16 mask = firstLanes16(positions - p);
    sum = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, dy + p), _mm512_maskz_loadu_ps(mask, cols + p), sum);
  }
  _mm512_storeu_ps(lanes, sum);
}

__attribute__((target("avx2,fma"))) void tapSumsAvx2(const float* w, const float* cols, int64_t taps,
                                                     int64_t positions, float* y) {
  int64_t p = 0;
  for (; p + 8 <= positions; p += 8) {
    __m256 sum = _mm256_setzero_ps();
    for (int64_t k = 0; k < taps; ++k) {
      sum = _mm256_fmadd_ps(_mm256_set1_ps(w[k]), _mm256_loadu_ps(cols + k * positions + p), sum);
    }
    _mm256_storeu_ps(y + p, sum);
  }
  for (; p < positions; ++p) {
    __m128 sum = _mm_setzero_ps();
    for (int64_t k = 0; k < taps; ++k) sum = _mm_fmadd_ss(_mm_set_ss(w[k]), _mm_set_ss(cols[k * positions + p]), sum);
    y[p] = _mm_cvtss_f32(sum);
  }
}

__attribute__((target("avx2,fma"))) void laneSumsAvx2(const float* dy, const float* cols, int64_t positions,
                                                     float* lanes) {
  for (int64_t p = 0; p < positions; ++p) {
    float& lane = lanes[p % 16];
    lane = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(dy[p]), _mm_set_ss(cols[p]), _mm_set_ss(lane)));
  }
}
#endif

void tapSums(const float* w, const float* cols, int64_t taps, int64_t positions, float* y) {
#if TESSERA_X86_SIMD
  static const GemmIsa isa = bestGemmIsa();
  if (isa == GemmIsa::Avx512) return tapSumsAvx512(w, cols, taps, positions, y);
  if (isa == GemmIsa::Avx2) return tapSumsAvx2(w, cols, taps, positions, y);
#endif
  for (int64_t p = 0; p < positions; ++p) {
    float sum = 0.0f;
    for (int64_t k = 0; k < taps; ++k) sum = std::fma(w[k], cols[k * positions + p], sum);
    y[p] = sum;
  }
}

// lanes[p mod 16] += dy[p] cols[p] in order of p, one fused multiply-add.
void laneSums(const float* dy, const float* cols, int64_t positions, float* lanes) {
#if TESSERA_X86_SIMD
  static const GemmIsa isa = bestGemmIsa();
  if (isa == GemmIsa::Avx512) return laneSumsAvx512(dy, cols, positions, lanes);
  if (isa == GemmIsa::Avx2) return laneSumsAvx2(dy, cols, positions, lanes);
#endif
  for (int64_t p = 0; p < positions; ++p) lanes[p % 16] = std::fma(dy[p], cols[p], lanes[p % 16]);
}

// f(first, last, thread) over channels [first, last) of `channels`, split
// over the step's threads when each part has kMinPartWork of `perChannel`.
template <class F>
void forChannels(const Step& s, int64_t channels, int64_t perChannel, F&& f) {
  const int64_t parts64 =
      s.pool == nullptr
          ? 1
          : std::clamp<int64_t>(std::min(channels * perChannel / kMinPartWork, channels), 1, s.pool->threads());
  const int parts = static_cast<int>(parts64);
  if (parts == 1) return f(int64_t{0}, channels, callerThread(s));
  s.pool->run(parts,
              [&](int part, int thread) { f(channels * part / parts, channels * (part + 1) / parts, thread); });
}

// The sizes of one channel of a depthwise convolution, for im2col/col2im.
ConvSizes oneChannel(ConvSizes z) {
  z.cIn = z.cOut = z.group = 1;
  return z;
}

void depthwiseForward(const Step& s) {
  const ConvSizes z = sizesOf(s);
  const ConvSizes c1 = oneChannel(z);
  const int64_t channels = z.cIn;
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      const float* x = operand(s, run, 0, g);
      const float* w = operand(s, run, 1, g);
      float* y = outOf(s, run) + g * s.outElements;
      forChannels(s, channels, z.batch * z.taps * z.outPositions, [&](int64_t first, int64_t last, int thread) {
        float* cols = workspace(s, thread);
        float* weight = cols + z.taps * z.outPositions;
        for (int64_t c = first; c < last; ++c) {
          const float* wc = liveWeight(s, oneChannel(z), w + c * z.fullTaps, weight);
          for (int64_t n = 0; n < z.batch; ++n) {
            float* out = y + (n * channels + c) * z.outPositions;
            im2col(c1, s.table.data(), x + (n * channels + c) * z.inPositions, cols, z.outPositions);
            tapSums(wc, cols, z.taps, z.outPositions, out);
            if (s.halfOutput) roundToHalves(out, static_cast<std::size_t>(z.outPositions));
          }
        }
      });
    }
  }
}

void depthwiseBackwardData(const Step& s) {
  const ConvSizes z = sizesOf(s);
  const ConvSizes c1 = oneChannel(z);
  const int64_t* live = z.taps < z.fullTaps ? liveTaps(s, z) : nullptr;
  const int64_t channels = z.cIn;
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      const float* dy = operand(s, run, 0, g);
      const float* w = operand(s, run, 1, g);
      float* dx = outOf(s, run) + g * s.outElements;
      forChannels(s, channels, z.batch * z.taps * z.outPositions, [&](int64_t first, int64_t last, int thread) {
        float* cols = workspace(s, thread);
        for (int64_t c = first; c < last; ++c) {
          for (int64_t n = 0; n < z.batch; ++n) {
            const float* from = dy + (n * channels + c) * z.outPositions;
            float* in = dx + (n * channels + c) * z.inPositions;
            for (int64_t k = 0; k < z.taps; ++k) {
              const float wk = w[c * z.fullTaps + (live == nullptr ? k : live[k])];
              float* row = cols + k * z.outPositions;
              for (int64_t p = 0; p < z.outPositions; ++p) row[p] = wk * from[p];
            }
            col2im(c1, s.table.data(), cols, in, z.outPositions);
            if (s.halfOutput) roundToHalves(in, static_cast<std::size_t>(z.inPositions));
          }
        }
      });
    }
  }
}

void depthwiseBackwardWeight(const Step& s) {
  const ConvSizes z = sizesOf(s);
  const ConvSizes c1 = oneChannel(z);
  const int64_t channels = z.cIn;
  for (const Run& run : s.runs) {
    for (int64_t g = 0; g < run.count; ++g) {
      const float* dy = operand(s, run, 0, g);
      const float* x = operand(s, run, 1, g);
      float* dw = outOf(s, run) + g * s.outElements;
      forChannels(s, channels, z.batch * z.taps * z.outPositions, [&](int64_t first, int64_t last, int thread) {
        float* cols = workspace(s, thread);
        float* lanes = cols + z.taps * z.outPositions;
        for (int64_t c = first; c < last; ++c) {
          std::fill_n(lanes, 16 * z.taps, 0.0f);
          for (int64_t n = 0; n < z.batch; ++n) {
            im2col(c1, s.table.data(), x + (n * channels + c) * z.inPositions, cols, z.outPositions);
            const float* from = dy + (n * channels + c) * z.outPositions;
            for (int64_t k = 0; k < z.taps; ++k) {
              laneSums(from, cols + k * z.outPositions, z.outPositions, lanes + 16 * k);
            }
          }
          // (The live taps' sums, then spread over the weight's taps.)
          for (int64_t k = 0; k < z.taps; ++k) {
            float sum = 0.0f;
            for (int i = 0; i < 16; ++i) sum += lanes[16 * k + i];
            dw[c * z.fullTaps + k] = sum;
          }
          spreadLiveTaps(s, oneChannel(z), dw + c * z.fullTaps);
          if (s.halfOutput) roundToHalves(dw + c * z.fullTaps, static_cast<std::size_t>(z.fullTaps));
        }
      });
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
              0,
              kPerSample,
              0};
  z.fullTaps = z.taps;
  std::vector<int64_t> live;
  for (int64_t t = 0; t < z.taps; ++t) {
    const auto from = taps.begin() + t * z.outPositions;
    if (std::any_of(from, from + z.outPositions, [](int64_t i) { return i >= 0; })) live.push_back(t);
  }
  const bool depthwise = z.cInGroup() == 1 && z.cOutGroup() == 1;
  std::vector<int64_t> liveTable;
  if (!live.empty() && static_cast<int64_t>(live.size()) < z.taps) {
    for (const int64_t t : live) {
      const auto from = taps.begin() + t * z.outPositions;
      liveTable.insert(liveTable.end(), from, from + z.outPositions);
    }
    z.taps = static_cast<int64_t>(live.size());
  } else {
    live.clear();
  }
  step.table = segmentsOf(liveTable.empty() ? taps : liveTable, z.taps, z.outPositions, z.width, z.step);
  step.table.insert(step.table.end(), live.begin(), live.end());
  // A window that reads each input position once, in order (1x1, stride 1,
  // no pads): the input is its own column matrix.
  bool identity = z.taps == 1 && z.inPositions == z.outPositions;
  const std::vector<int64_t>& first = liveTable.empty() ? taps : liveTable;
  for (int64_t p = 0; identity && p < z.outPositions; ++p) identity = first[static_cast<std::size_t>(p)] == p;
  z.direct = identity && kWay != Way::BackwardWeight ? 1 : 0;
  const int64_t rows = z.columnRows();
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  if (depthwise) {
    z.mode = kDepthwise;
    // Columns of one channel of one sample, and the weight's lanes (or
    // the live taps of a channel's weight).
    step.workFloats = z.taps * z.outPositions + 16 * z.taps;
    step.kernel = kWay == Way::Forward        ? depthwiseForward
                  : kWay == Way::BackwardData ? depthwiseBackwardData
                                              : depthwiseBackwardWeight;
  } else if constexpr (kWay != Way::BackwardWeight) {
    const int64_t perSample = std::max<int64_t>((rows + z.cOutGroup()) * z.outPositions, 1);
    z.chunk = std::clamp<int64_t>(kChunkColumnsFloats / perSample, 1, std::max<int64_t>(z.batch, 1));
    // (Only the kernels by chunks leave out dead taps.)
    if (z.chunk >= 2 || z.taps < z.fullTaps) z.mode = kSampleChunks;
    const int64_t columns = z.chunk * z.outPositions;
    if constexpr (kWay == Way::Forward) {
      m = z.cOutGroup(), n = columns, k = rows;
      step.kernel = z.mode == kSampleChunks ? convForwardChunks : convForward;
    } else {
      m = rows, n = columns, k = z.cOutGroup();
      step.kernel = z.mode == kSampleChunks ? convBackwardDataChunks : convBackwardData;
    }
    // Columns and the chunk's product (or packed conv outputs).
    // Columns and the chunk's product (or packed conv outputs), and the
    // weight of the live taps.
    step.workFloats = z.mode == kSampleChunks ? perSample * z.chunk + (z.taps < z.fullTaps ? z.cOut * rows : 0)
                      : z.direct != 0         ? 0
                                              : rows * z.outPositions;
  } else if ((rows + z.cOutGroup()) * z.outPositions * z.batch <= kChunkColumnsFloats &&
             z.outPositions * z.batch <= kWholeDepth) {
    z.mode = kSampleChunks;
    z.chunk = z.batch;
    m = z.cOutGroup(), n = rows, k = z.batch * z.outPositions;
    step.workFloats = (rows + z.cOutGroup()) * k;
    step.kernel = convBackwardWeightWhole;
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
  step.table2 = {z.batch, z.cIn,    z.cOut, z.group, z.inPositions, z.taps,   z.outPositions,
                 z.chunk, z.direct, z.width, z.step, z.dyFirst,     z.mode, z.fullTaps};
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
