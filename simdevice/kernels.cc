#include "kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>

#include <fmt/format.h>

#include "half.hpp"
#include "planes.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::sim {

void StridedLoop::push(int64_t extent, std::array<int64_t, kMaxOperands> strides) {
  size[static_cast<std::size_t>(rank)] = extent;
  for (std::size_t i = 0; i < kMaxOperands; ++i) stride[i][static_cast<std::size_t>(rank)] = strides[i];
  ++rank;
}

void StridedLoop::coalesce() {
  StridedLoop out;
  for (int d = 0; d < rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    if (size[u] == 1) continue;
    if (out.rank > 0) {
      const auto last = static_cast<std::size_t>(out.rank - 1);
      bool contiguous = true;
      for (std::size_t i = 0; i < kMaxOperands; ++i)
        contiguous = contiguous && out.stride[i][last] == stride[i][u] * size[u];
      if (contiguous) {
        out.size[last] *= size[u];
        for (std::size_t i = 0; i < kMaxOperands; ++i) out.stride[i][last] = stride[i][u];
        continue;
      }
    }
    std::array<int64_t, kMaxOperands> strides{};
    for (std::size_t i = 0; i < kMaxOperands; ++i) strides[i] = stride[i][u];
    out.push(size[u], strides);
  }
  *this = out;
}

int64_t StridedLoop::elements() const {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= size[static_cast<std::size_t>(d)];
  return n;
}

void zeroRun(const Step& s, const Run& run) { std::fill_n(outOf(s, run), run.count * s.outElements, 0.0f); }

void roundToHalfKernel(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    const StridedLoop& loop = run.loop;
    if (loop.rank == 1 && loop.stride[0][0] == 1 && loop.stride[1][0] == 1) {
      roundToHalves(x, o, static_cast<std::size_t>(loop.size[0]));
      continue;
    }
    forEach(loop, [&](int64_t io, int64_t ix, int64_t) { o[io] = roundToHalf(x[ix]); });
  }
}

void copyTile(const Step& s, const TileOperands& t, int64_t n) {
  if (s.tileStride[0] == 0) {
    std::fill_n(t.out, n, t.in[0][0]);
  } else if (t.out != t.in[0]) {
    std::memmove(t.out, t.in[0], static_cast<std::size_t>(n) * sizeof(float));
  }
}

void roundToHalfTile(const Step& s, const TileOperands& t, int64_t n) {
  if (s.tileStride[0] == 1) {
    roundToHalves(t.in[0], t.out, static_cast<std::size_t>(n));
    return;
  }
  const float value = roundToHalf(t.in[0][0]);
  std::fill_n(t.out, n, value);
}

namespace {

void copyRuns(const Step& s) {
  for (const Run& run : s.runs) {
    if (s.zeroFirst) {
      // Cleared in contiguous ranges on the threads that then fill them
      // (the loop's outermost dimension is the output's).
      StridedLoop whole;
      whole.push(run.count * s.outElements, {1});
      float* groups = outOf(s, run);
      forLoopParts(s, whole, [&](const StridedLoop& part, const std::array<int64_t, kMaxOperands>& at) {
        std::fill_n(groups + at[0], part.size[0], 0.0f);
      });
    }
    float* o = outOf(s, run) + s.outLoopOffset;
    const float* x = inOf(s, run, 0);
    forLoopParts(s, run.loop, [&](const StridedLoop& part, const std::array<int64_t, kMaxOperands>& at) {
      copyStrided(part, o + at[0], x + at[1]);
    });
  }
}

void copyDoubleRuns(const Step& s) {
  for (const Run& run : s.runs) {
    float* o = outOf(s, run);
    const float* x = inOf(s, run, 0);
    forEach(run.loop, [&](int64_t io, int64_t ix, int64_t) { std::memcpy(o + io, x + ix, sizeof(double)); });
  }
}

// Slices of a chain per thread at the least: below this, handing slices
// to another thread costs more than it saves.
constexpr int64_t kMinSlicesPerPart = 8;

// The host's values for an Input, copied into the arena (rounded to halves
// on the way for a float16 input: Step::halfOutput). A large input (the
// batch) is copied by every thread, a run of whole slices each, so that the
// threads that read it next find their share in their own cache instead of
// all of it in the calling thread's.
void feedKernel(const Step& s) {
  const auto n = static_cast<int64_t>(s.feed->size());
  const float* from = s.feed->data();
  const auto copy = [&](int64_t begin, int64_t end) {
    if (s.halfOutput) {
      roundToHalves(from + begin, s.out + begin, static_cast<std::size_t>(end - begin));
    } else {
      std::copy(from + begin, from + end, s.out + begin);
    }
  };
  const int64_t slices = (n + kChainSlice - 1) / kChainSlice;
  const int threads = s.pool == nullptr ? 1 : s.pool->threads();
  const int parts = static_cast<int>(std::clamp<int64_t>(slices / kMinSlicesPerPart, 1, threads));
  if (parts == 1) return copy(0, n);
  s.pool->run(parts, [&](int part, int) {
    copy(std::min(n, slices * part / parts * kChainSlice),
         std::min(n, slices * (part + 1) / parts * kChainSlice));
  });
}

// Slices [first, last) of a chain; slices are independent (see
// sliceable() in the executor), so any split gives the same bits.
void runChainSlices(const Step& s, int64_t first, int64_t last, float* scratch) {
  for (int64_t begin = first * kChainSlice; begin < std::min(last * kChainSlice, s.chainElements);
       begin += kChainSlice) {
    const int64_t n = std::min(kChainSlice, s.chainElements - begin);
    for (const Step& part : s.chain) {
      const Run& run = part.runs.front();
      TileOperands t;
      t.out = part.outSlot >= 0 ? scratch + part.outSlot * kChainSlice : part.out + run.out + begin;
      for (std::size_t i = 0; i < t.in.size(); ++i) {
        if (part.in[i] == nullptr) continue;
        t.in[i] = part.inSlot[i] >= 0 ? scratch + part.inSlot[i] * kChainSlice
                                      : part.in[i] + run.in[i] + begin * part.tileStride[i];
      }
      part.tile(part, t, n);
    }
  }
}

void runChain(const Step& s) {
  const int64_t slices = (s.chainElements + kChainSlice - 1) / kChainSlice;
  const int parts = chainParts(s.chainElements, s.pool == nullptr ? 1 : s.pool->threads());
  if (parts == 1)
    return runChainSlices(s, 0, slices, s.chainScratch + callerThread(s) * s.chainScratchStride);
  s.pool->run(parts, [&](int part, int thread) {
    runChainSlices(s, slices * part / parts, slices * (part + 1) / parts,
                   s.chainScratch + thread * s.chainScratchStride);
  });
}

// Each step on a thread of its own, all at once: they share no memory that
// one of them writes, and each computes what it computes alone.
void runBeside(const Step& s) {
  s.pool->run(static_cast<int>(s.beside.size()), [&](int part, int) {
    const Step& step = s.beside[static_cast<std::size_t>(part)];
    step.kernel(step);
  });
}

}  // namespace

// Output points per part of a step that splits its loop (Step::splitsLoop)
// at the least, as for a chain.
constexpr int64_t kMinLoopPartPoints = kMinSlicesPerPart * kChainSlice;

int loopParts(int64_t points, int threads) {
  return static_cast<int>(std::clamp<int64_t>(points / kMinLoopPartPoints, 1, threads));
}

int chainParts(int64_t elements, int threads) {
  const int64_t slices = (elements + kChainSlice - 1) / kChainSlice;
  return static_cast<int>(std::clamp<int64_t>(slices / kMinSlicesPerPart, 1, threads));
}

Kernel besideKernel() { return runBeside; }
Kernel copyKernel() { return copyRuns; }
Kernel copyDoublesKernel() { return copyDoubleRuns; }
Kernel inputKernel() { return feedKernel; }
Kernel chainKernel() { return runChain; }

}  // namespace tessera::sim
