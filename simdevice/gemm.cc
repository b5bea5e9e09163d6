// The only translation unit of the device that includes Eigen, so that the
// malloc guard below is configured identically wherever Eigen is used.
#ifndef NDEBUG
#define EIGEN_RUNTIME_NO_MALLOC
#endif
#include "gemm.hpp"

#include <algorithm>
#include <cstring>

#include <Eigen/Core>

#include "cpu_features.hpp"
#include "half.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define TESSERA_GEMM_X86 1
#include <immintrin.h>
#endif

namespace tessera::sim {

namespace {

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t roundUp(int64_t a, int64_t b) { return ceilDiv(a, b) * b; }

// ---- Portable: Eigen's GEMM with packing buffers planned at load time (the
// expression API would allocate them on the heap for every large product).

class PlannedBlocking : public Eigen::internal::level3_blocking<float, float> {
 public:
  PlannedBlocking(float* lhs, float* rhs, Eigen::Index mc, Eigen::Index nc, Eigen::Index kc) {
    this->m_blockA = lhs;
    this->m_blockB = rhs;
    this->m_mc = mc;
    this->m_nc = nc;
    this->m_kc = kc;
  }
};

// The result is row-major, so Eigen computes the transposed product: its
// "rows" are our columns (plan.mc blocks n, plan.nc blocks m).
template <int kLhsOrder, int kRhsOrder>
void eigenOrdered(const GemmPlan& plan, const GemmShape& s, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, float alpha, float* lhs, float* rhs) {
  PlannedBlocking blocking(lhs, rhs, plan.mc, plan.nc, plan.kc);
  Eigen::internal::general_matrix_matrix_product<Eigen::Index, float, kLhsOrder, false, float, kRhsOrder,
                                                 false, Eigen::RowMajor, 1>::run(s.m, s.n, s.k, a, lda, b, ldb,
                                                                                 c, 1, s.n, alpha, blocking,
                                                                                 nullptr);
}

void eigenGemm(const GemmPlan& plan, const GemmShape& s, const float* a, const float* b, float* c, float alpha,
               float* lhs, float* rhs) {
  std::fill_n(c, s.m * s.n, 0.0f);
  if (s.k == 0) return;
  if (!s.transA && !s.transB) {
    eigenOrdered<Eigen::RowMajor, Eigen::RowMajor>(plan, s, a, s.k, b, s.n, c, alpha, lhs, rhs);
  } else if (s.transA && !s.transB) {
    eigenOrdered<Eigen::ColMajor, Eigen::RowMajor>(plan, s, a, s.m, b, s.n, c, alpha, lhs, rhs);
  } else if (!s.transA && s.transB) {
    eigenOrdered<Eigen::RowMajor, Eigen::ColMajor>(plan, s, a, s.k, b, s.k, c, alpha, lhs, rhs);
  } else {
    eigenOrdered<Eigen::ColMajor, Eigen::ColMajor>(plan, s, a, s.m, b, s.k, c, alpha, lhs, rhs);
  }
}

GemmPlan planEigen(int64_t m, int64_t n, int64_t k) {
  Eigen::Index kc = std::max<int64_t>(k, 1);
  Eigen::Index mc = std::max<int64_t>(n, 1);
  Eigen::Index nc = std::max<int64_t>(m, 1);
  Eigen::internal::computeProductBlockingSizes<float, float, 1, Eigen::Index>(kc, mc, nc, 1);
  GemmPlan plan;
  plan.kc = kc;
  plan.mc = mc;
  plan.nc = nc;
  plan.lhsFloats = kc * std::min<int64_t>(mc, std::max<int64_t>(n, 1));
  plan.rhsFloats = kc * std::min<int64_t>(nc, std::max<int64_t>(m, 1));
  return plan;
}

// ---- Packed micro-kernels (the GotoBLAS scheme). The sum is cut into blocks
// of at most kBlockK steps and op(B) into strips of kNR columns; a
// micro-kernel computes a kMR x kNR tile of C in registers, broadcasting kMR
// values of A per step against a step of a B strip (kNR floats). A strip of
// B [k, n] is read where it is (kNR contiguous floats per step); B [n, k] and
// a last strip of fewer than kNR columns are packed into the rhs scratch
// ([kc, kNR] per strip, padded with zeros). A is read where it is, [m, k] or
// [k, m]: a strip of kMR rows is reused from L1 across the whole block of B,
// so packing it would only copy it; only a last strip of fewer than kMR rows
// is copied, padded with zeros, into the lhs scratch (laid out [kc, kMR],
// i.e. transposed).

// c[i * ldc + j] = alpha * tile (+ c when accumulating), tile = the product
// of A's strip (element (i, p) at a[i * lda + p], or a[p * lda + i] when
// transposed) and B's strip (step p at b + p * ldb) over kc steps, for the
// first `rows` rows and `cols` columns of the tile. Kernels that mask
// (kEdges of packedGemm) read only those columns of B and write only those
// of C; the others are called with whole tiles.
using MicroKernel = void (*)(int64_t kc, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                             int64_t ldc, float alpha, bool accumulate, int rows, int cols);

// Sum blocks at most this deep; columns per packed block of B.
constexpr int64_t kBlockK = 256;
constexpr int64_t kBlockN = 512;
// Multiply-adds per part of a product split over threads: below about a
// microsecond of work, handing a part to another thread costs more than it
// saves.
constexpr int64_t kMinPartWork = int64_t{1} << 16;

// Transposes columns [j, j + nr) of B [n, k] for steps [p0, p0 + kc) into a
// [kc, kNR] strip whose columns from nr on are zero (a copy: the order of
// no sum depends on it).
using StripTransposer = void (*)(const float* b, int64_t k, int64_t p0, int64_t kc, int64_t j, int64_t nr,
                                 int64_t kNR, float* out);

// Portable: 8 steps at a time, a [8, kNR] block of the strip.
void transposeStrip(const float* b, int64_t k, int64_t p0, int64_t kc, int64_t j, int64_t nr, int64_t kNR,
                    float* out) {
  constexpr int64_t kSteps = 8;
  for (int64_t p = 0; p < kc; p += kSteps) {
    const int64_t steps = std::min(kSteps, kc - p);
    float* dst = out + p * kNR;
    for (int64_t jj = 0; jj < nr; ++jj) {
      const float* src = b + (j + jj) * k + p0 + p;
      for (int64_t q = 0; q < steps; ++q) dst[q * kNR + jj] = src[q];
    }
    for (int64_t q = 0; q < steps; ++q) std::fill(dst + q * kNR + nr, dst + (q + 1) * kNR, 0.0f);
  }
}

template <int kNR, StripTransposer kTranspose>
void packB(const GemmShape& s, const float* b, int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* out) {
  for (int64_t jr = 0; jr < nc; jr += kNR, out += kNR * kc) {
    const int64_t nr = std::min<int64_t>(kNR, nc - jr);
    if (!s.transB) {  // B is [k, n]: whole strips are read where they are
      if (nr == kNR) continue;
      const float* src = b + p0 * s.n + j0 + jr;
      for (int64_t p = 0; p < kc; ++p, src += s.n) {
        float* dst = out + p * kNR;
        for (int64_t j = 0; j < kNR; ++j) dst[j] = j < nr ? src[j] : 0.0f;
      }
    } else {  // B is [n, k]
      kTranspose(b, s.k, p0, kc, j0 + jr, nr, kNR, out);
    }
  }
}

// The last mr < kMR rows of op(A) for steps [p0, p0 + kc), as [kc, kMR].
template <int kMR>
void packEdgeA(const GemmShape& s, const float* a, int64_t i0, int64_t mr, int64_t p0, int64_t kc, float* out) {
  for (int64_t p = 0; p < kc; ++p) {
    for (int64_t i = 0; i < kMR; ++i) {
      out[p * kMR + i] =
          i >= mr ? 0.0f : (s.transA ? a[(p0 + p) * s.m + i0 + i] : a[(i0 + i) * s.k + p0 + p]);
    }
  }
}

// Where a run of blocks of the sum writes: element (i, j) of C at
// c[(i - row0) * ld + j - col0] (C itself, or the partial sums of a deep
// product's second half).
struct Out {
  float* c;
  int64_t ld;
  int64_t row0;
  int64_t col0;
  float* at(int64_t i, int64_t j) const { return c + (i - row0) * ld + (j - col0); }
};

// Blocks [kb0, kb1) of the sum (of `blocks`) of the block [row0, row1) x
// [col0, col1) of C into `out`: the first block's sums scaled by alpha and
// written, each next one's scaled and added. A block of rows starts on a
// multiple of kMR, one of columns on a multiple of kNR. Each element's sum
// runs in the same order whatever block it is in. round: every element
// rounded to the nearest half after the last block, while in L1.
// kEdges: the kernels mask, so an edge tile is computed in place and a
// last strip of row-major B is read where it is; otherwise an edge tile
// goes through a whole tile in registers' image and the strip is packed.
template <int kMR, int kNR, MicroKernel kRows, MicroKernel kTransposed, bool kEdges,
          StripTransposer kTranspose>
void sumBlocks(const GemmPlan& plan, const GemmShape& s, const float* a, const float* b, float alpha,
               float* lhs, float* rhs, GemmBlock block, int64_t blocks, int64_t kb0, int64_t kb1, Out out,
               bool round) {
  alignas(64) float tile[kMR * kNR];
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    const int64_t p0 = s.k * kb / blocks;
    const int64_t kc = s.k * (kb + 1) / blocks - p0;
    const bool accumulate = kb > kb0;
    for (int64_t j0 = block.col0; j0 < block.col1; j0 += plan.nc) {
      const int64_t nc = std::min(plan.nc, block.col1 - j0);
      if (s.transB || !kEdges) packB<kNR, kTranspose>(s, b, p0, kc, j0, nc, rhs);
      for (int64_t i0 = block.row0; i0 < block.row1; i0 += kMR) {
        const int64_t mr = std::min<int64_t>(kMR, block.row1 - i0);
        MicroKernel kernel = s.transA ? kTransposed : kRows;
        const float* ap = s.transA ? a + p0 * s.m + i0 : a + i0 * s.k + p0;
        int64_t lda = s.transA ? s.m : s.k;
        if (mr < kMR) {
          packEdgeA<kMR>(s, a, i0, mr, p0, kc, lhs);
          kernel = kTransposed;
          ap = lhs;
          lda = kMR;
        }
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const int64_t nr = std::min<int64_t>(kNR, nc - jr);
          const bool direct = !s.transB && (nr == kNR || kEdges);
          const float* bp = direct ? b + p0 * s.n + j0 + jr : rhs + jr * kc;
          const int64_t ldb = direct ? s.n : kNR;
          float* cp = out.at(i0, j0 + jr);
          if (kEdges || (mr == kMR && nr == kNR)) {
            kernel(kc, ap, lda, bp, ldb, cp, out.ld, alpha, accumulate, static_cast<int>(mr),
                   static_cast<int>(nr));
            continue;
          }
          // An edge tile: computed whole, then its valid part written with
          // the same arithmetic as a full tile's.
          kernel(kc, ap, lda, bp, ldb, tile, kNR, alpha, false, kMR, kNR);
          for (int64_t i = 0; i < mr; ++i) {
            float* row = cp + i * out.ld;
            const float* t = tile + i * kNR;
            if (accumulate) {
              for (int64_t j = 0; j < nr; ++j) row[j] = t[j] + row[j];
            } else {
              std::copy_n(t, nr, row);
            }
          }
        }
        if (round && kb + 1 == kb1) {
          for (int64_t i = i0; i < i0 + mr; ++i) roundToHalves(out.at(i, j0), static_cast<std::size_t>(nc));
        }
      }
    }
  }
}

// C = C + partial over a block of C (the two halves of a deep product's
// sum), each element rounded to a half after the addition when `round`.
void addHalves(float* c, int64_t ldc, const float* partial, int64_t ldp, int64_t rows, int64_t cols,
               bool round) {
  for (int64_t i = 0; i < rows; ++i, c += ldc, partial += ldp) {
    for (int64_t j = 0; j < cols; ++j) c[j] = c[j] + partial[j];
    if (round) roundToHalves(c, static_cast<std::size_t>(cols));
  }
}

// Blocks of the sum split k evenly and depend on k alone, so every element
// is summed in the same order whatever m and n are: at most kBlockK deep,
// and two for a sum of kBlockK exactly, so that two threads can share such
// a product by its sum too (the MLP's second layer: each reads the rows of
// its weight that its half of the update wrote).
int64_t sumBlockCount(int64_t k) {
  return std::max(ceilDiv(k, kBlockK), k >= kBlockK ? int64_t{2} : int64_t{1});
}
int64_t firstHalf(int64_t blocks) { return (blocks + 1) / 2; }

// Which blocks of the sum a call computes: all of them into C (in the
// documented order), or one half of a product split by its sum (the first
// into C, the second into the partial sums).
enum class SumPart { Whole, First, Second };

// The block of C, or one half of its sum. A whole product of four blocks of
// the sum or more computes the halves chunk by chunk of C, each chunk's
// second half in the partial sums (plan.partialFloats), then adds them.
template <int kMR, int kNR, MicroKernel kRows, MicroKernel kTransposed, bool kEdges,
          StripTransposer kTranspose>
void packedGemm(const GemmPlan& plan, const GemmShape& s, const float* a, const float* b, float* c,
                float alpha, float* lhs, float* rhs, float* partial, GemmBlock block, SumPart part) {
  const auto sum = sumBlocks<kMR, kNR, kRows, kTransposed, kEdges, kTranspose>;
  if (s.k == 0) {
    if (part == SumPart::Second) return;
    for (int64_t i = block.row0; i < block.row1; ++i)
      std::fill(c + i * s.n + block.col0, c + i * s.n + block.col1, 0.0f);
    return;
  }
  const int64_t blocks = sumBlockCount(s.k);
  const int64_t half = firstHalf(blocks);
  const Out whole{c, s.n, 0, 0};
  if (part == SumPart::First)
    return sum(plan, s, a, b, alpha, lhs, rhs, block, blocks, 0, half, whole, false);
  if (part == SumPart::Second)
    return sum(plan, s, a, b, alpha, lhs, rhs, block, blocks, half, blocks, Out{partial, s.n, 0, 0}, false);
  // Up to three blocks the second half is one block, added into C as the
  // blocks before it were: the same bits as the halves added.
  if (blocks < 4) return sum(plan, s, a, b, alpha, lhs, rhs, block, blocks, 0, blocks, whole, s.halfOutput);
  const int64_t rows = block.row1 - block.row0;
  const int64_t cols = block.col1 - block.col0;
  int64_t chunkCols = cols;
  int64_t chunkRows = rows;
  if (rows * cols > plan.partialFloats) {
    chunkCols = std::min(cols, std::max<int64_t>(plan.nr, plan.partialFloats / plan.mr / plan.nr * plan.nr));
    chunkCols = std::min(chunkCols, plan.nc);
    chunkRows = std::max<int64_t>(plan.mr, plan.partialFloats / chunkCols / plan.mr * plan.mr);
  }
  for (int64_t i0 = block.row0; i0 < block.row1; i0 += chunkRows) {
    for (int64_t j0 = block.col0; j0 < block.col1; j0 += chunkCols) {
      const GemmBlock chunk{i0, std::min(block.row1, i0 + chunkRows), j0,
                            std::min(block.col1, j0 + chunkCols)};
      const int64_t width = chunk.col1 - chunk.col0;
      sum(plan, s, a, b, alpha, lhs, rhs, chunk, blocks, 0, half, whole, false);
      sum(plan, s, a, b, alpha, lhs, rhs, chunk, blocks, half, blocks, Out{partial, width, i0, j0}, false);
      addHalves(whole.at(i0, j0), s.n, partial, width, chunk.row1 - chunk.row0, width, s.halfOutput);
    }
  }
}

using PackedGemm = void (*)(const GemmPlan&, const GemmShape&, const float*, const float*, float*, float,
                            float*, float*, float*, GemmBlock, SumPart);

// One tile shape of an instruction set.
struct PackedVariant {
  GemmIsa isa;
  int mr;
  int nr;
  PackedGemm run;
};

#ifdef TESSERA_GEMM_X86

// The sum over kc steps of a tile: B's rows read whole (kMasked false) or
// through the column masks.
template <int kMR, int kNV, bool kTransA, bool kMasked>
__attribute__((target("avx512f"), always_inline)) inline void sumAvx512(__m512 (&acc)[kMR][kNV], int64_t kc,
                                                                        const float* a, int64_t lda,
                                                                        const float* b, int64_t ldb,
                                                                        const __mmask16 (&mask)[kNV]) {
  for (int64_t p = 0; p < kc; ++p, a += kTransA ? lda : 1, b += ldb) {
    // B's rows are a row of B apart (1 KB for 256 columns), a stride the
    // hardware prefetchers follow late: 8 steps ahead gave 3-5 % on the
    // forward and input-gradient products (prefetches never fault, so the
    // rows after the last are harmless).
    for (int v = 0; v < kNV; ++v)
      _mm_prefetch(reinterpret_cast<const char*>(b + 8 * ldb + 16 * v), _MM_HINT_T0);
    __m512 bv[kNV];
    for (int v = 0; v < kNV; ++v)
      bv[v] = kMasked ? _mm512_maskz_loadu_ps(mask[v], b + 16 * v) : _mm512_loadu_ps(b + 16 * v);
    for (int i = 0; i < kMR; ++i) {
      const __m512 ai = _mm512_set1_ps(kTransA ? a[i] : a[i * lda]);
      for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
}

// Masked loads and stores: columns at and after `cols` are neither read
// (they load as 0, which no written element sums) nor written. A whole
// tile's sum reads B without masks: the masks did not stay in registers
// and their reloads took the FMA port (about 10 % of the loop).
template <int kMR, int kNV, bool kTransA>
__attribute__((target("avx512f"))) void kernelAvx512(int64_t kc, const float* a, int64_t lda, const float* b,
                                                     int64_t ldb, float* c, int64_t ldc, float alpha,
                                                     bool accumulate, int rows, int cols) {
  __mmask16 mask[kNV];
  for (int v = 0; v < kNV; ++v) {
    const int left = std::clamp(cols - 16 * v, 0, 16);
    mask[v] = static_cast<__mmask16>((uint32_t{1} << left) - 1);
  }
  __m512 acc[kMR][kNV];
#pragma GCC unroll 16
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
  if (cols >= 16 * kNV) {
    sumAvx512<kMR, kNV, kTransA, false>(acc, kc, a, lda, b, ldb, mask);
  } else {
    sumAvx512<kMR, kNV, kTransA, true>(acc, kc, a, lda, b, ldb, mask);
  }
  const __m512 scale = _mm512_set1_ps(alpha);
#pragma GCC unroll 16
  for (int i = 0; i < kMR; ++i, c += ldc) {
    if (i == rows) break;
    for (int v = 0; v < kNV; ++v) {
      __m512 r = _mm512_mul_ps(acc[i][v], scale);
      // Rounded before the addition: without the barrier the compiler may
      // fuse the two into one multiply-add in some builds and not others.
      asm("" : "+v"(r));
      if (accumulate) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask[v], c + 16 * v));
      _mm512_mask_storeu_ps(c + 16 * v, mask[v], r);
    }
  }
}

// 16 x 16 blocks transposed in registers: 16 (masked) loads of 16 steps of
// 16 columns, 64 shuffles, 16 stores.
__attribute__((target("avx512f"))) void transposeStripAvx512(const float* b, int64_t k, int64_t p0,
                                                             int64_t kc, int64_t j, int64_t nr, int64_t kNR,
                                                             float* out) {
  // All lanes through the zero-masked forms: the unmasked ones start from
  // an undefined vector, which g++ 12 reports as maybe uninitialized.
  constexpr __mmask16 kAll16 = 0xFFFF;
  constexpr __mmask8 kAll8 = 0xFF;
  for (int64_t jv = 0; jv < kNR; jv += 16) {
    const int64_t cols = std::clamp<int64_t>(nr - jv, 0, 16);
    for (int64_t p = 0; p < kc; p += 16) {
      const int64_t steps = std::min<int64_t>(16, kc - p);
      const auto mask = static_cast<__mmask16>((uint32_t{1} << steps) - 1);
      __m512 r[16];
      for (int64_t t = 0; t < 16; ++t)
        r[t] = t < cols ? _mm512_maskz_loadu_ps(mask, b + (j + jv + t) * k + p0 + p) : _mm512_setzero_ps();
      __m512 u[16];
      for (int t = 0; t < 16; t += 2) {
        u[t] = _mm512_maskz_unpacklo_ps(kAll16, r[t], r[t + 1]);
        u[t + 1] = _mm512_maskz_unpackhi_ps(kAll16, r[t], r[t + 1]);
      }
      // u[4g + c]: rows 4g..4g+3 of column c + 4L in lane L.
      for (int g = 0; g < 16; g += 4) {
        const __m512d t0 = _mm512_castps_pd(u[g]);
        const __m512d t1 = _mm512_castps_pd(u[g + 1]);
        const __m512d t2 = _mm512_castps_pd(u[g + 2]);
        const __m512d t3 = _mm512_castps_pd(u[g + 3]);
        r[g] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(kAll8, t0, t2));
        r[g + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(kAll8, t0, t2));
        r[g + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(kAll8, t1, t3));
        r[g + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(kAll8, t1, t3));
      }
      for (int c = 0; c < 4; ++c) {
        const __m512 v0 = _mm512_maskz_shuffle_f32x4(kAll16, r[c], r[4 + c], 0x44);
        const __m512 v1 = _mm512_maskz_shuffle_f32x4(kAll16, r[c], r[4 + c], 0xEE);
        const __m512 w0 = _mm512_maskz_shuffle_f32x4(kAll16, r[8 + c], r[12 + c], 0x44);
        const __m512 w1 = _mm512_maskz_shuffle_f32x4(kAll16, r[8 + c], r[12 + c], 0xEE);
        u[c] = _mm512_maskz_shuffle_f32x4(kAll16, v0, w0, 0x88);
        u[4 + c] = _mm512_maskz_shuffle_f32x4(kAll16, v0, w0, 0xDD);
        u[8 + c] = _mm512_maskz_shuffle_f32x4(kAll16, v1, w1, 0x88);
        u[12 + c] = _mm512_maskz_shuffle_f32x4(kAll16, v1, w1, 0xDD);
      }
      for (int64_t q = 0; q < steps; ++q) _mm512_storeu_ps(out + (p + q) * kNR + jv, u[q]);
    }
  }
}

template <int kMR, int kNV, bool kTransA>
__attribute__((target("avx2,fma"))) void kernelAvx2(int64_t kc, const float* a, int64_t lda, const float* b,
                                                    int64_t ldb, float* c, int64_t ldc, float alpha,
                                                    bool accumulate, int, int) {
  __m256 acc[kMR][kNV];
#pragma GCC unroll 16
  for (auto& row : acc)
    for (auto& v : row) v = _mm256_setzero_ps();
  for (int64_t p = 0; p < kc; ++p, a += kTransA ? lda : 1, b += ldb) {
    __m256 bv[kNV];
    for (int v = 0; v < kNV; ++v) bv[v] = _mm256_loadu_ps(b + 8 * v);
    for (int i = 0; i < kMR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(kTransA ? a + i : a + i * lda);
      for (int v = 0; v < kNV; ++v) acc[i][v] = _mm256_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
  const __m256 scale = _mm256_set1_ps(alpha);
#pragma GCC unroll 16
  for (int i = 0; i < kMR; ++i, c += ldc) {
    for (int v = 0; v < kNV; ++v) {
      __m256 r = _mm256_mul_ps(acc[i][v], scale);
      asm("" : "+x"(r));  // rounded before the addition, as above
      if (accumulate) r = _mm256_add_ps(r, _mm256_loadu_ps(c + 8 * v));
      _mm256_storeu_ps(c + 8 * v, r);
    }
  }
}

// A small product (smallProduct()): a row of C a vector, 4 rows at a time,
// read straight from the operands (B [n, k] transposed into one strip
// first, a copy), so that nothing else is packed. The packed kernels' operations: each
// element's sum over p in order from 0, one fused multiply-add a step, then
// scaled by alpha.
__attribute__((target("avx512f"))) void smallGemmAvx512(const GemmShape& s, const float* a, const float* b,
                                                        float* c, float alpha) {
  const auto cols = static_cast<__mmask16>((uint32_t{1} << s.n) - 1);
  alignas(64) float strip[kBlockK * 16];
  const float* rowsOfB = b;
  int64_t ldb = s.n;
  if (s.transB) {
    transposeStripAvx512(b, s.k, 0, s.k, 0, s.n, 16, strip);
    rowsOfB = strip;
    ldb = 16;
  }
  const __m512 scale = _mm512_set1_ps(alpha);
  constexpr int64_t kRows = 4;
  for (int64_t i0 = 0; i0 < s.m; i0 += kRows) {
    // (Rows past m repeat the last row: computed, never stored.)
    int64_t row[kRows];
    for (int64_t i = 0; i < kRows; ++i) row[i] = std::min(i0 + i, s.m - 1);
    __m512 acc[kRows];
    for (__m512& v : acc) v = _mm512_setzero_ps();
    for (int64_t p = 0; p < s.k; ++p) {
      const __m512 bv = _mm512_maskz_loadu_ps(cols, rowsOfB + p * ldb);
#pragma GCC unroll 4
      for (int64_t i = 0; i < kRows; ++i) {
        const float ai = s.transA ? a[p * s.m + row[i]] : a[row[i] * s.k + p];
        acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(ai), bv, acc[i]);
      }
    }
    for (int64_t i = 0; i < std::min(kRows, s.m - i0); ++i)
      _mm512_mask_storeu_ps(c + (i0 + i) * s.n, cols, _mm512_mul_ps(acc[i], scale));
  }
}

template <int kMR, int kNV>
constexpr PackedVariant avx512Variant() {
  return {GemmIsa::Avx512, kMR, 16 * kNV,
          packedGemm<kMR, 16 * kNV, kernelAvx512<kMR, kNV, false>, kernelAvx512<kMR, kNV, true>, true,
                     transposeStripAvx512>};
}

template <int kMR, int kNV>
constexpr PackedVariant avx2Variant() {
  return {GemmIsa::Avx2, kMR, 8 * kNV,
          packedGemm<kMR, 8 * kNV, kernelAvx2<kMR, kNV, false>, kernelAvx2<kMR, kNV, true>, false,
                     transposeStrip>};
}

// Per instruction set, the tile shapes from the narrowest; a product takes
// the first whose columns its n fills, else the widest it may take: a tile
// wider than kWideTile columns only for at least kTallRows rows that fill
// it (6 x 64 reads 4 vectors of B per 6 broadcasts of A where 8 x 32 reads 2
// per 8, which pays for the weight gradients, 256 x 128 x 64 A^T: 114 ->
// 132 GFLOP/s; with 64 rows its 6-row strips leave a 4-row edge strip and
// it loses, 150 -> 136 at 64 x 256 x 784).
constexpr PackedVariant kVariants[] = {
    avx512Variant<12, 1>(), avx512Variant<8, 2>(), avx512Variant<6, 4>(),
    avx2Variant<6, 1>(),    avx2Variant<6, 2>(),
};

#else

constexpr PackedVariant kVariants[] = {{GemmIsa::Portable, 0, 0, nullptr}};

#endif

const PackedVariant* variantOf(const GemmPlan& plan) {
  for (const PackedVariant& v : kVariants)
    if (v.run != nullptr && v.isa == plan.isa && v.nr == plan.nr && v.mr == plan.mr) return &v;
  return nullptr;
}

// Whether a product is small enough for smallGemmAvx512: up to 16 rows and
// 16 columns (an attention head's scores and values), one block of the
// sum, and the AVX-512 kernels planned. Packing its operands and computing
// the plan's whole tile took most of such a product's time.
[[maybe_unused]] bool smallProduct(const GemmPlan& plan, const GemmShape& shape) {
  return plan.isa == GemmIsa::Avx512 && variantOf(plan) != nullptr && shape.m <= 16 && shape.n <= 16 &&
         shape.k >= 1 && sumBlockCount(shape.k) == 1;
}

constexpr int kWideTile = 32;
constexpr int64_t kTallRows = 192;

// The most partial sums a thread keeps for a deep product (floats).
constexpr int64_t kMaxPartialFloats = int64_t{1} << 16;

GemmPlan planVariant(const PackedVariant& chosen, int64_t m, int64_t n, int64_t k) {
  GemmPlan plan;
  plan.isa = chosen.isa;
  plan.mr = chosen.mr;
  plan.nr = chosen.nr;
  plan.kc = std::max<int64_t>(std::min(k, kBlockK), 1);
  plan.nc = kBlockN;
  plan.lhsFloats = plan.mr * plan.kc;
  plan.rhsFloats = roundUp(std::clamp<int64_t>(n, 1, kBlockN), plan.nr) * plan.kc;
  if (sumBlockCount(k) >= 2) plan.partialFloats = std::min(std::max<int64_t>(m, 1) * n, kMaxPartialFloats);
  return plan;
}

GemmPlan planPacked(GemmIsa isa, int64_t m, int64_t n, int64_t k) {
  const PackedVariant* chosen = nullptr;
  for (const PackedVariant& v : kVariants) {
    if (v.run == nullptr || v.isa != isa) continue;
    if (chosen != nullptr && n <= chosen->nr) break;
    if (chosen != nullptr && v.nr > kWideTile && (m < kTallRows || n < v.nr)) break;
    chosen = &v;
  }
  if (chosen == nullptr) return planEigen(m, n, k);
  return planVariant(*chosen, m, n, k);
}

}  // namespace

std::string_view gemmIsaName(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::Portable: return "portable";
    case GemmIsa::Avx2: return "avx2";
    case GemmIsa::Avx512: return "avx512";
  }
  return "?";
}

std::vector<GemmIsa> availableGemmIsas() {
  std::vector<GemmIsa> isas{GemmIsa::Portable};
  if (cpuHasAvx2Fma()) isas.push_back(GemmIsa::Avx2);
  if (cpuHasAvx512()) isas.push_back(GemmIsa::Avx512);
  return isas;
}

GemmIsa bestGemmIsa() {
  static const GemmIsa best = availableGemmIsas().back();
  return best;
}

GemmPlan planGemm(GemmIsa isa, int64_t m, int64_t n, int64_t k) {
  return isa == GemmIsa::Portable ? planEigen(m, n, k) : planPacked(isa, m, n, k);
}

std::vector<GemmPlan> gemmTilePlans(GemmIsa isa, int64_t m, int64_t n, int64_t k) {
  std::vector<GemmPlan> plans;
  for (const PackedVariant& v : kVariants)
    if (v.run != nullptr && v.isa == isa) plans.push_back(planVariant(v, m, n, k));
  return plans;
}

void gemm(const GemmPlan& plan, const GemmShape& shape, const float* a, const float* b, float* c, float alpha,
          float* lhs, float* rhs, float* partial) {
  gemmPart(plan, shape, a, b, c, alpha, lhs, rhs, partial, 0, 1);
}

namespace {

// Whether the sum can be split in its two halves: two blocks or more, and
// partial sums for all of C.
bool sumSplits(const GemmPlan& plan, const GemmShape& shape) {
  return variantOf(plan) != nullptr && sumBlockCount(shape.k) >= 2 && shape.m * shape.n <= plan.partialFloats;
}

// What one part reads for each cut into `parts`, in floats. A block of rows
// reads its rows of op(A) and all of op(B), a block of columns all of op(A)
// and its columns of op(B), a half of the sum its half of both, writes
// partial sums for all of C and reads half of them back. op(B) is packed,
// into each part's own scratch, when it is [n, k] or when the kernels do
// not mask edges (AVX2), and counts twice. `fromOther`: of those reads, the
// floats another core wrote, when every operand was written by the threads
// in blocks of rows as the device splits its steps (a weight by its
// optimizer update, a batch by its feed).
struct CutCost {
  int64_t reads;
  int64_t fromOther;
};

struct CutCosts {
  CutCost rows;
  CutCost columns;
  CutCost sum;
};

CutCosts cutCosts(const GemmPlan& plan, const GemmShape& shape, int parts) {
  const bool packsB = shape.transB || plan.isa != GemmIsa::Avx512;
  const int64_t m = shape.m;
  const int64_t n = shape.n;
  const int64_t k = std::max<int64_t>(shape.k, 1);
  const int64_t bCost = packsB ? 2 : 1;
  const int64_t rowBlock = std::min(m, ceilDiv(ceilDiv(m, plan.mr), parts) * plan.mr);
  const int64_t colBlock = std::min(n, ceilDiv(ceilDiv(n, plan.nr), parts) * plan.nr);
  const int64_t blocks = sumBlockCount(k);
  const int64_t halfK = std::max(k * firstHalf(blocks) / blocks, k - k * firstHalf(blocks) / blocks);
  // Only the rows of a stored [m, k] A or [k, n] B follow C's rows or the
  // sum's halves; of anything read whole, the other cores wrote the rest.
  const auto others = [parts](int64_t floats) { return floats - floats / parts; };
  return {{rowBlock * k + bCost * n * k, (shape.transA ? others(rowBlock * k) : 0) + others(n * k)},
          {m * k + bCost * colBlock * k, others(m * k) + (shape.transB ? 0 : others(colBlock * k))},
          {(m + bCost * n) * halfK + m * n,
           (shape.transA ? 0 : others(m * halfK)) + (shape.transB ? others(n * halfK) : 0) + others(m * n)}};
}

// A cut's cost: its reads, those from other cores counted twice.
int64_t weighed(const CutCost& cost) { return cost.reads + cost.fromOther; }

// Rows or columns: when both dimensions have a tile for every part, the
// cut whose parts read fewer floats (the larger operand is the one worth
// dividing: the weight against a small batch's activations, or the batch
// against a narrow gradient; rows on a tie); else the dimension with more
// tiles.
bool rowsOverColumns(int64_t rowTiles, int64_t colTiles, int parts, const CutCosts& costs) {
  if (rowTiles < parts || colTiles < parts) return rowTiles >= colTiles;
  return costs.rows.reads <= costs.columns.reads;
}

enum class Cut { Rows, Columns, Sum };

// How a product split into `parts` (2 or more, packed kernels) is cut: by
// its sum (splitsBySum) when that can and should be, else rows or columns
// (splitsByRows). Each cost computed once.
Cut cutOf(const GemmPlan& plan, const GemmShape& shape, int parts) {
  const int64_t rowTiles = ceilDiv(shape.m, plan.mr);
  const int64_t colTiles = ceilDiv(shape.n, plan.nr);
  const bool halves = parts == 2 && sumSplits(plan, shape);
  if (halves && rowTiles < parts && colTiles < parts) return Cut::Sum;
  const CutCosts costs = cutCosts(plan, shape, parts);
  // Counted with the reads from other cores twice: the sum's halves read
  // mostly what their own core wrote.
  if (halves && weighed(costs.sum) < std::min(weighed(costs.rows), weighed(costs.columns))) return Cut::Sum;
  return rowsOverColumns(rowTiles, colTiles, parts, costs) ? Cut::Rows : Cut::Columns;
}

// Part `part` of `parts` of a product cut `cut`: whole tiles of rows or of
// columns split evenly, or all of C for a half of the sum.
GemmBlock blockOf(const GemmPlan& plan, const GemmShape& shape, int part, int parts, Cut cut) {
  if (cut == Cut::Sum) return {0, shape.m, 0, shape.n};
  const bool byRows = cut == Cut::Rows;
  const int64_t tiles = byRows ? ceilDiv(shape.m, plan.mr) : ceilDiv(shape.n, plan.nr);
  const int64_t step = byRows ? plan.mr : plan.nr;
  const int64_t extent = byRows ? shape.m : shape.n;
  const int64_t begin = std::min(extent, tiles * part / parts * step);
  const int64_t end = std::min(extent, tiles * (part + 1) / parts * step);
  return byRows ? GemmBlock{begin, end, 0, shape.n} : GemmBlock{0, shape.m, begin, end};
}

}  // namespace

int gemmParts(const GemmPlan& plan, const GemmShape& shape, int threads) {
  if (threads <= 1 || variantOf(plan) == nullptr) return 1;
  const int64_t work = shape.m * shape.n * std::max<int64_t>(shape.k, 1);
  int64_t tiles = std::max(ceilDiv(shape.m, plan.mr), ceilDiv(shape.n, plan.nr));
  if (sumSplits(plan, shape)) tiles = std::max<int64_t>(tiles, 2);
  return static_cast<int>(std::clamp<int64_t>(std::min(work / kMinPartWork, tiles), 1, threads));
}

bool splitsBySum(const GemmPlan& plan, const GemmShape& shape, int parts) {
  return parts == 2 && sumSplits(plan, shape) && cutOf(plan, shape, parts) == Cut::Sum;
}

bool splitsByRows(const GemmPlan& plan, const GemmShape& shape, int parts) {
  return rowsOverColumns(ceilDiv(shape.m, plan.mr), ceilDiv(shape.n, plan.nr), parts,
                         cutCosts(plan, shape, parts));
}

GemmBlock gemmBlock(const GemmPlan& plan, const GemmShape& shape, int part, int parts) {
  if (parts <= 1 || plan.mr == 0) return {0, shape.m, 0, shape.n};
  return blockOf(plan, shape, part, parts, cutOf(plan, shape, parts));
}

void gemmPart(const GemmPlan& plan, const GemmShape& shape, const float* a, const float* b, float* c,
              float alpha, float* lhs, float* rhs, float* partial, int part, int parts) {
  if (shape.m == 0 || shape.n == 0) return;
#ifdef TESSERA_GEMM_X86
  if (parts <= 1 && smallProduct(plan, shape)) {
    smallGemmAvx512(shape, a, b, c, alpha);
    if (shape.halfOutput) roundToHalves(c, static_cast<std::size_t>(shape.m * shape.n));
    return;
  }
#endif
  if (const PackedVariant* packed = variantOf(plan)) {
    const Cut cut = parts <= 1 ? Cut::Rows : cutOf(plan, shape, parts);
    const SumPart half = cut != Cut::Sum ? SumPart::Whole : part == 0 ? SumPart::First : SumPart::Second;
    return packed->run(plan, shape, a, b, c, alpha, lhs, rhs, partial, blockOf(plan, shape, part, parts, cut),
                       half);
  }
  if (part != 0) return;
  eigenGemm(plan, shape, a, b, c, alpha, lhs, rhs);
  if (shape.halfOutput) roundToHalves(c, static_cast<std::size_t>(shape.m * shape.n));
}

void gemmAddHalves(const GemmPlan& plan, const GemmShape& shape, float* c, const float* partial, int part,
                   int parts) {
  if (!splitsBySum(plan, shape, parts)) return;
  const int64_t row0 = shape.m * part / parts;
  const int64_t row1 = shape.m * (part + 1) / parts;
  addHalves(c + row0 * shape.n, shape.n, partial + row0 * shape.n, shape.n, row1 - row0, shape.n,
            shape.halfOutput);
}

void forbidEigenMalloc([[maybe_unused]] bool forbid) {
#ifdef EIGEN_RUNTIME_NO_MALLOC
  Eigen::internal::set_is_malloc_allowed(!forbid);
#endif
}

}  // namespace tessera::sim
