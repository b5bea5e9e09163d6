// Strided copies and sums a plane at a time (see planes.hpp).
#include "planes.hpp"

#include <algorithm>
#include <type_traits>

#include "cpu_features.hpp"
#include "vector_math.hpp"
#include "x86_simd.hpp"

namespace tessera::sim {
namespace {

void copyPlanePortable(const Plane& p, float* out, const float* in) {
  for (int64_t r = 0; r < p.rows; ++r) {
    float* o = out + r * p.row[0];
    const float* x = in + r * p.row[1];
    if (p.col[0] == 1 && p.col[1] == 1) {
      std::copy_n(x, p.cols, o);
    } else if (p.col[0] == 1 && p.col[1] == 0) {
      std::fill_n(o, p.cols, *x);
    } else {
      for (int64_t c = 0; c < p.cols; ++c) o[c * p.col[0]] = x[c * p.col[1]];
    }
  }
}

#ifdef TESSERA_X86_SIMD

// Rows of up to this many floats are copied through masked vectors; longer
// ones by std::copy_n (the C library's own vector copy).
constexpr int64_t kMaskedRow = 64;

// A 2-D transpose (output rows contiguous along c, input contiguous along
// r) in blocks of 8 x 8 through registers.
__attribute__((target("avx512f,avx512vl"))) void transposePlaneAvx512(const Plane& p, float* out,
                                                                      const float* in) {
  for (int64_t r0 = 0; r0 < p.rows; r0 += 8) {
    const int64_t h = std::min<int64_t>(8, p.rows - r0);
    const __mmask8 rowLanes = firstLanes8(h);
    for (int64_t c0 = 0; c0 < p.cols; c0 += 8) {
      const int64_t w = std::min<int64_t>(8, p.cols - c0);
      __m256 v[8];
      for (int64_t k = 0; k < 8; ++k)
        v[k] = k < w ? _mm256_maskz_loadu_ps(rowLanes, in + (c0 + k) * p.col[1] + r0) : _mm256_setzero_ps();
      transpose8x8(v);
      const __mmask8 colLanes = firstLanes8(w);
      for (int64_t i = 0; i < h; ++i) _mm256_mask_storeu_ps(out + (r0 + i) * p.row[0] + c0, colLanes, v[i]);
    }
  }
}

__attribute__((target("avx512f,avx512vl"))) void copyPlaneAvx512(const Plane& p, float* out,
                                                                 const float* in) {
  if (p.col[0] == 1 && p.col[1] == 1 && p.cols <= kMaskedRow) {
    for (int64_t r = 0; r < p.rows; ++r) {
      float* o = out + r * p.row[0];
      const float* x = in + r * p.row[1];
      for (int64_t c = 0; c < p.cols; c += 16) {
        const __mmask16 lanes = firstLanes16(p.cols - c);
        _mm512_mask_storeu_ps(o + c, lanes, _mm512_maskz_loadu_ps(lanes, x + c));
      }
    }
  } else if (p.col[0] == 1 && p.col[1] == 0) {
    for (int64_t r = 0; r < p.rows; ++r) {
      float* o = out + r * p.row[0];
      const __m512 value = _mm512_set1_ps(in[r * p.row[1]]);
      for (int64_t c = 0; c < p.cols; c += 16) _mm512_mask_storeu_ps(o + c, firstLanes16(p.cols - c), value);
    }
  } else if (p.col[0] == 1 && p.row[1] == 1 && p.rows > 1) {
    transposePlaneAvx512(p, out, in);
  } else {
    copyPlanePortable(p, out, in);
  }
}

#endif

using PlaneCopy = void (*)(const Plane&, float*, const float*);

PlaneCopy planeCopy() {
#ifdef TESSERA_X86_SIMD
  if (cpuHasAvx512()) return copyPlaneAvx512;
#endif
  return copyPlanePortable;
}

// Short rows, each into its own output element: 8 rows side by side, each
// summed in order from its output's value. `Out` is the accumulator: float,
// or double for the reductions (sumStrided's double form).
template <typename Out>
void sumShortRows(const Plane& p, Out* out, const float* in) {
  constexpr int64_t kSide = 8;
  int64_t r = 0;
  for (; r + kSide <= p.rows; r += kSide) {
    Out sum[kSide];
    for (int64_t k = 0; k < kSide; ++k) sum[k] = out[(r + k) * p.row[0]];
    for (int64_t c = 0; c < p.cols; ++c)
      for (int64_t k = 0; k < kSide; ++k) sum[k] += in[(r + k) * p.row[1] + c];
    for (int64_t k = 0; k < kSide; ++k) out[(r + k) * p.row[0]] = sum[k];
  }
  for (; r < p.rows; ++r) {
    Out sum = out[r * p.row[0]];
    for (int64_t c = 0; c < p.cols; ++c) sum += in[r * p.row[1] + c];
    out[r * p.row[0]] = sum;
  }
}

// Every row into the same output row: its elements held in a local block
// while the rows are added in order.
template <typename Out>
void sumIntoOneRow(const Plane& p, Out* out, const float* in) {
  constexpr int64_t kBlock = 64;
  for (int64_t c0 = 0; c0 < p.cols; c0 += kBlock) {
    const int64_t w = std::min(kBlock, p.cols - c0);
    Out sum[kBlock];
    std::copy_n(out + c0, w, sum);
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* x = in + r * p.row[1] + c0;
      for (int64_t c = 0; c < w; ++c) sum[c] += x[c];
    }
    std::copy_n(sum, w, out + c0);
  }
}

template <typename Out>
void sumPlaneInto(const Plane& p, Out* out, const float* in) {
  if (p.col[0] == 0 && p.col[1] == 1 && p.cols >= kRowSumLanes) {
    for (int64_t r = 0; r < p.rows; ++r) {
      if constexpr (std::is_same_v<Out, double>) {
        out[r * p.row[0]] += rowSumWide(in + r * p.row[1], p.cols);
      } else {
        out[r * p.row[0]] += rowSum(in + r * p.row[1], p.cols);
      }
    }
  } else if (p.col[0] == 0 && p.col[1] == 1 && (p.row[0] != 0 || p.rows == 1)) {
    sumShortRows(p, out, in);
  } else if (p.row[0] == 0 && p.col[0] == 1 && p.col[1] == 1) {
    sumIntoOneRow(p, out, in);
  } else {
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t c = 0; c < p.cols; ++c)
        out[r * p.row[0] + c * p.col[0]] += in[r * p.row[1] + c * p.col[1]];
  }
}

}  // namespace

Plane innerPlane(const StridedLoop& loop) {
  Plane p;
  if (loop.rank == 0) return p;
  const auto col = static_cast<std::size_t>(loop.rank - 1);
  p.cols = loop.size[col];
  for (std::size_t i = 0; i < p.col.size(); ++i) p.col[i] = loop.stride[i][col];
  if (loop.rank == 1) return p;
  const std::size_t row = col - 1;
  p.rows = loop.size[row];
  for (std::size_t i = 0; i < p.row.size(); ++i) p.row[i] = loop.stride[i][row];
  return p;
}

void copyPlane(const Plane& p, float* out, const float* in) { planeCopy()(p, out, in); }

void sumPlane(const Plane& p, float* out, const float* in) { sumPlaneInto(p, out, in); }

void copyStrided(const StridedLoop& loop, float* out, const float* in) {
  const Plane p = innerPlane(loop);
  const PlaneCopy copy = planeCopy();
  forEachPlane(loop, [&](int64_t o, int64_t i, int64_t) { copy(p, out + o, in + i); });
}

void sumStrided(const StridedLoop& loop, float* out, const float* in) {
  const Plane p = innerPlane(loop);
  forEachPlane(loop, [&](int64_t o, int64_t i, int64_t) { sumPlaneInto(p, out + o, in + i); });
}

void sumStrided(const StridedLoop& loop, double* out, const float* in) {
  const Plane p = innerPlane(loop);
  forEachPlane(loop, [&](int64_t o, int64_t i, int64_t) { sumPlaneInto(p, out + o, in + i); });
}

}  // namespace tessera::sim
