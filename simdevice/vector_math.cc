// The device's vector math (see vector_math.hpp).
#include "vector_math.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>

#include "cpu_features.hpp"
#include "x86_simd.hpp"

namespace tessera::sim {
namespace {

// Below kLowest, e^x is under 3.3e-308, near and below the least normal
// double (2^-1022): 0 then, because computing such a value takes the CPU
// a microcode assist (a masked attention score of -inf would take one per
// vector). Above kHighest, e^x overflows (the greatest double is ~ e^709.78).
constexpr double kLowest = -708.0;
constexpr double kHighest = 710.0;
constexpr double kInverseLn2 = 0x1.71547652b82fep0;
// ln 2 = kLn2High + kLn2Low: the double nearest to ln 2, and the rest.
constexpr double kLn2High = 0x1.62e42fefa39efp-1;
constexpr double kLn2Low = 0x1.abc9e3b39803fp-56;
// Adding 1.5 x 2^52 rounds a double of magnitude below 2^51 to an integer
// (to nearest, ties to even), which subtracting it recovers exactly.
constexpr double kShifter = 0x1.8p52;
// 1 / k! for k = 13 down to 0: the Taylor coefficients, Horner's order.
constexpr std::array<double, 14> kTaylor = {
    1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
    1.0 / 40320.0,      1.0 / 5040.0,      1.0 / 720.0,      1.0 / 120.0,     1.0 / 24.0,
    1.0 / 6.0,          0.5,               1.0,              1.0};

// erfOf: kErfPieces pieces of [0, kErfEnd), each a polynomial of degree
// kErfDegree; the coefficient of t^j of piece k is coefficients[j][k].
constexpr int kErfPieces = 8;
constexpr int kErfDegree = 12;
constexpr double kErfEnd = 4.0;
struct ErfTable {
  alignas(64) std::array<std::array<double, kErfPieces>, kErfDegree + 1> coefficients{};
};

// The function piece k fits: erf(a) / a on the first piece, erf(a) on the
// others.
long double erfPiece(int k, long double a) { return k == 0 ? std::erf(a) / a : std::erf(a); }

// Each piece's interpolating polynomial at the Chebyshev nodes of the first
// kind, in long double: its Chebyshev coefficients, then those of the
// powers of t (T_0 = 1, T_1 = t, T_j = 2 t T_(j-1) - T_(j-2)).
ErfTable makeErfTable() {
  constexpr int kNodes = kErfDegree + 1;
  const long double pi = std::acos(-1.0L);
  std::array<std::array<long double, kNodes>, kNodes> power{};  // power[j][i]: t^i in T_j
  power[0][0] = 1.0L;
  power[1][1] = 1.0L;
  for (std::size_t j = 2; j < kNodes; ++j) {
    for (std::size_t i = 0; i < kNodes; ++i)
      power[j][i] = (i > 0 ? 2.0L * power[j - 1][i - 1] : 0.0L) - power[j - 2][i];
  }
  ErfTable table;
  for (int k = 0; k < kErfPieces; ++k) {
    const long double centre = k / 2.0L + 0.25L;
    std::array<long double, kNodes> values{};
    for (std::size_t i = 0; i < kNodes; ++i)
      values[i] = erfPiece(k, centre + std::cos(pi * (i + 0.5L) / kNodes) / 4.0L);
    std::array<long double, kNodes> chebyshev{};
    for (std::size_t j = 0; j < kNodes; ++j) {
      long double sum = 0.0L;
      for (std::size_t i = 0; i < kNodes; ++i) sum += values[i] * std::cos(pi * j * (i + 0.5L) / kNodes);
      chebyshev[j] = sum * (j == 0 ? 1.0L : 2.0L) / kNodes;
    }
    for (std::size_t i = 0; i < kNodes; ++i) {
      long double c = 0.0L;
      for (std::size_t j = 0; j < kNodes; ++j) c += chebyshev[j] * power[j][i];
      table.coefficients[i][static_cast<std::size_t>(k)] = static_cast<double>(c);
    }
  }
  return table;
}

const ErfTable& erfTable() {
  static const ErfTable table = makeErfTable();
  return table;
}

// A fused multiply-add: a call to the C library's fma, or the CPU's
// instruction once inlined into a function built with target("fma").
struct FusedMultiplyAdd {
  double operator()(double a, double b, double c) const { return std::fma(a, b, c); }
};

// erfOf() with `fma`, a fused multiply-add (FusedMultiplyAdd).
template <class Fma>
inline float erfWith(float x, const ErfTable& table, Fma fma) {
  if (std::isnan(x)) return x;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= kErfEnd) return std::copysign(1.0f, x);
  const double piece = std::min(std::floor(2.0 * a), kErfPieces - 1.0);
  const double t = (a - fma(piece, 0.5, 0.25)) * 4.0;
  const auto k = static_cast<std::size_t>(piece);
  double p = table.coefficients[kErfDegree][k];
  for (int j = kErfDegree - 1; j >= 0; --j) p = fma(p, t, table.coefficients[static_cast<std::size_t>(j)][k]);
  if (k == 0) p = p * a;
  return static_cast<float>(std::copysign(p, static_cast<double>(x)));
}

// tanhOf: below kTanhSmall, the Taylor coefficients of x^3 to x^9.
constexpr double kTanhSmall = 0.0625;
constexpr double kTanh3 = -1.0 / 3.0;
constexpr double kTanh5 = 2.0 / 15.0;
constexpr double kTanh7 = -17.0 / 315.0;
constexpr double kTanh9 = 62.0 / 2835.0;

// tanh(|x|) below kTanhSmall, with `fma` a fused multiply-add.
template <class Fma>
inline double smallTanh(double a, Fma fma) {
  const double u = a * a;
  return fma(a * u, fma(fma(fma(kTanh9, u, kTanh7), u, kTanh5), u, kTanh3), a);
}

// 2^n for an integer n in [-1022, 1023], exactly.
double powerOf2(int64_t n) { return std::bit_cast<double>(static_cast<uint64_t>(n + 1023) << 52); }

// exponential() with `fma`, a fused multiply-add (FusedMultiplyAdd).
template <class Fma>
inline double exponentialWith(double x, Fma fma) {
  if (std::isnan(x)) return x;
  if (x < kLowest) return 0.0;
  const double clamped = std::min(x, kHighest);
  const double n = fma(clamped, kInverseLn2, kShifter) - kShifter;
  double r = fma(-n, kLn2High, clamped);
  r = fma(-n, kLn2Low, r);
  double p = kTaylor[0];
#pragma GCC unroll 16
  for (std::size_t k = 1; k < kTaylor.size(); ++k) p = fma(p, r, kTaylor[k]);
  // n is in [-1021, 1024] and p in [0.7, 1.5), so p 2^n is a normal double
  // (exact) or overflows (to infinity, exact below it): what vscalefpd gives.
  const auto whole = static_cast<int64_t>(n);
  return whole > 1023 ? p * powerOf2(1023) * powerOf2(whole - 1023) : p * powerOf2(whole);
}

#ifdef TESSERA_X86_SIMD
// With the CPU's fused multiply-add inline (FusedMultiplyAdd is a call in a build for
// the baseline architecture).
__attribute__((target("fma"))) double exponentialFma(double x) {
  return exponentialWith(x, FusedMultiplyAdd{});
}

// exponential() of 8 doubles, operation for operation.
__attribute__((target("avx512f"), always_inline)) inline __m512d exponential8(__m512d x) {
  // (The zero-masked forms: the plain ones start from an undefined
  // register, which g++ 12 reports as maybe uninitialized.)
  const __mmask8 all = 0xff;
  const __mmask8 nan = _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q);
  const __mmask8 kept = _mm512_cmp_pd_mask(x, _mm512_set1_pd(kLowest), _CMP_GE_OQ);
  const __m512d clamped = _mm512_maskz_min_pd(all, _mm512_maskz_max_pd(all, x, _mm512_set1_pd(kLowest)),
                                              _mm512_set1_pd(kHighest));
  const __m512d shifter = _mm512_set1_pd(kShifter);
  const __m512d n =
      _mm512_sub_pd(_mm512_fmadd_pd(clamped, _mm512_set1_pd(kInverseLn2), shifter), shifter);
  __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(kLn2High), clamped);
  r = _mm512_fnmadd_pd(n, _mm512_set1_pd(kLn2Low), r);
  __m512d p = _mm512_set1_pd(kTaylor[0]);
#pragma GCC unroll 16
  for (std::size_t k = 1; k < kTaylor.size(); ++k) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kTaylor[k]));
  return _mm512_mask_blend_pd(nan, _mm512_maskz_scalef_pd(kept, p, n), x);
}

__attribute__((target("fma"))) double smallTanhFma(double a) { return smallTanh(a, FusedMultiplyAdd{}); }

__attribute__((target("fma"))) float erfFma(float x, const ErfTable& table) {
  return erfWith(x, table, FusedMultiplyAdd{});
}

// erfOf() of 8 floats widened to doubles, operation for operation.
__attribute__((target("avx512f,avx512dq"), always_inline)) inline __m512d erf8(__m512d x,
                                                                               const ErfTable& table) {
  // (The zero-masked forms, as in exponential8.)
  const __mmask8 all = 0xff;
  const __m512d a = _mm512_abs_pd(x);
  const __mmask8 nan = _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q);
  const __mmask8 one = _mm512_cmp_pd_mask(a, _mm512_set1_pd(kErfEnd), _CMP_GE_OQ);
  // (Lanes of 4 and more, and NaNs, compute a piece of 4 and are replaced.)
  const __m512d clamped = _mm512_maskz_min_pd(all, a, _mm512_set1_pd(kErfEnd));
  const __m512d piece =
      _mm512_maskz_min_pd(all,
                          _mm512_maskz_roundscale_pd(all, _mm512_mul_pd(clamped, _mm512_set1_pd(2.0)),
                                                     _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC),
                          _mm512_set1_pd(kErfPieces - 1.0));
  const __m512d t =
      _mm512_mul_pd(_mm512_sub_pd(clamped, _mm512_fmadd_pd(piece, _mm512_set1_pd(0.5), _mm512_set1_pd(0.25))),
                    _mm512_set1_pd(4.0));
  const __m512i k = _mm512_cvttpd_epi64(piece);
  const auto& c = table.coefficients;
  __m512d p = _mm512_maskz_permutexvar_pd(all, k, _mm512_load_pd(c[kErfDegree].data()));
#pragma GCC unroll 16
  for (int j = kErfDegree - 1; j >= 0; --j)
    p = _mm512_fmadd_pd(
        p, t, _mm512_maskz_permutexvar_pd(all, k, _mm512_load_pd(c[static_cast<std::size_t>(j)].data())));
  const __mmask8 first = _mm512_cmp_pd_mask(piece, _mm512_setzero_pd(), _CMP_EQ_OQ);
  p = _mm512_mask_mul_pd(p, first, p, clamped);
  p = _mm512_mask_blend_pd(one, p, _mm512_set1_pd(1.0));
  const __m512d sign = _mm512_and_pd(x, _mm512_set1_pd(-0.0));
  return _mm512_mask_blend_pd(nan, _mm512_or_pd(p, sign), x);
}

// tanhOf() of 8 floats widened to doubles.
__attribute__((target("avx512f,avx512dq"), always_inline)) inline __m512d tanh8(__m512d x) {
  const __m512d a = _mm512_abs_pd(x);
  const __m512d u = _mm512_mul_pd(a, a);
  __m512d q = _mm512_fmadd_pd(_mm512_set1_pd(kTanh9), u, _mm512_set1_pd(kTanh7));
  q = _mm512_fmadd_pd(q, u, _mm512_set1_pd(kTanh5));
  q = _mm512_fmadd_pd(q, u, _mm512_set1_pd(kTanh3));
  const __m512d small = _mm512_fmadd_pd(_mm512_mul_pd(a, u), q, a);
  const __m512d one = _mm512_set1_pd(1.0);
  const __m512d large = _mm512_sub_pd(
      one, _mm512_div_pd(_mm512_set1_pd(2.0),
                         _mm512_add_pd(exponential8(_mm512_mul_pd(_mm512_set1_pd(2.0), a)), one)));
  const __mmask8 isSmall = _mm512_cmp_pd_mask(a, _mm512_set1_pd(kTanhSmall), _CMP_LT_OQ);
  const __m512d r = _mm512_mask_blend_pd(isSmall, large, small);
  // x's sign (a NaN stays a NaN).
  return _mm512_or_pd(r, _mm512_and_pd(x, _mm512_set1_pd(-0.0)));
}

struct Tanh8 {
  __attribute__((target("avx512f,avx512dq"), always_inline)) __m512d operator()(__m512d x) const {
    return tanh8(x);
  }
};
struct Sigmoid8 {
  __attribute__((target("avx512f,avx512dq"), always_inline)) __m512d operator()(__m512d x) const {
    const __m512d one = _mm512_set1_pd(1.0);
    return _mm512_div_pd(one, _mm512_add_pd(one, exponential8(_mm512_sub_pd(_mm512_setzero_pd(), x))));
  }
};

struct Erf8 {
  const ErfTable& table = erfTable();
  __attribute__((target("avx512f,avx512dq"), always_inline)) __m512d operator()(__m512d x) const {
    return erf8(x, table);
  }
};
struct Exponential8 {
  __attribute__((target("avx512f"), always_inline)) __m512d operator()(__m512d x) const {
    return exponential8(x);
  }
};

// f (8 doubles at a time) of the floats x[0, n) into out, rounded to
// float: four vectors a step (each is a chain of a dozen dependent
// multiply-adds, which one or two alone would leave waiting), the last few
// through masks.
template <class F>
__attribute__((target("avx512f,avx512dq,avx512vl"))) void floatsThroughDoubles(const float* x, int64_t n,
                                                                               float* out, F f) {
  const __mmask8 all = 0xff;
  constexpr int kVectors = 4;
  int64_t j = 0;
  for (; j + 8 * kVectors <= n; j += 8 * kVectors) {
    __m512d r[kVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) r[v] = f(_mm512_maskz_cvtps_pd(all, _mm256_loadu_ps(x + j + 8 * v)));
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) _mm256_storeu_ps(out + j + 8 * v, _mm512_maskz_cvtpd_ps(all, r[v]));
  }
  for (; j < n; j += 8) {
    const auto lanes = firstLanes8(n - j);
    const __m512d r = f(_mm512_maskz_cvtps_pd(all, _mm256_maskz_loadu_ps(lanes, x + j)));
    _mm256_mask_storeu_ps(out + j, lanes, _mm512_maskz_cvtpd_ps(all, r));
  }
}

__attribute__((target("avx512f,avx512vl"))) int64_t shiftedExponentialsAvx512(const float* x, int64_t n,
                                                                              float max, double* out) {
  const __m256 shift = _mm256_set1_ps(max);
  const __mmask8 all = 0xff;
  int64_t j = 0;
  // Two vectors a step: each exponential is a chain of 16 dependent
  // operations, so one alone would leave the FMA units waiting.
  for (; j + 16 <= n; j += 16) {
    const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + j), shift);
    const __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(x + j + 8), shift);
    const __m512d e0 = exponential8(_mm512_maskz_cvtps_pd(all, d0));
    const __m512d e1 = exponential8(_mm512_maskz_cvtps_pd(all, d1));
    _mm512_storeu_pd(out + j, e0);
    _mm512_storeu_pd(out + j + 8, e1);
  }
  for (; j < n; j += 8) {
    // The last few through masks (the lanes past n load 0 and are not stored).
    const auto lanes = firstLanes8(n - j);
    const __m256 d = _mm256_sub_ps(_mm256_maskz_loadu_ps(lanes, x + j), shift);
    _mm512_mask_storeu_pd(out + j, lanes, exponential8(_mm512_maskz_cvtps_pd(all, d)));
  }
  return n;
}

// A block of up to 8 short rows (c <= kShortRow), a row in each lane:
// column j holds element j of each row (0 in the lanes past the block).
struct RowBlock {
  alignas(32) float x[kShortRow][8];
  alignas(64) double e[kShortRow][8];  // the exponentials
  alignas(32) float out[kShortRow][8];
};

// Rows [0, count) of c elements at x into columns, through masks.
__attribute__((target("avx512f,avx512vl"))) void loadRows(const float* x, int64_t count, int64_t c,
                                                          float (*columns)[8]) {
  for (int64_t j0 = 0; j0 < c; j0 += 8) {
    const auto lanes = firstLanes8(c - j0);
    __m256 v[8];
    for (int64_t i = 0; i < 8; ++i)
      v[i] = i < count ? _mm256_maskz_loadu_ps(lanes, x + i * c + j0) : _mm256_setzero_ps();
    transpose8x8(v);
    for (int64_t j = j0; j < std::min(c, j0 + 8); ++j) _mm256_store_ps(columns[j], v[j - j0]);
  }
}

// The columns back into rows [0, count) of c elements at out, through masks.
__attribute__((target("avx512f,avx512vl"))) void storeRows(const float (*columns)[8], int64_t count,
                                                           int64_t c, float* out) {
  for (int64_t j0 = 0; j0 < c; j0 += 8) {
    const auto lanes = firstLanes8(c - j0);
    __m256 v[8];
    for (int64_t j = 0; j < 8; ++j) v[j] = j0 + j < c ? _mm256_load_ps(columns[j0 + j]) : _mm256_setzero_ps();
    transpose8x8(v);
    for (int64_t i = 0; i < count; ++i) _mm256_mask_storeu_ps(out + i * c + j0, lanes, v[i]);
  }
}

// Each row's max (std::max_element's: the first of the greatest, and a
// NaN only from element 0) into *max, its exponentials into block.e, and
// their sum in LaneSum's order (element j into lane j mod 8) returned.
__attribute__((target("avx512f,avx512vl,avx512dq"))) __m512d exponentialSums(RowBlock& block, int64_t c,
                                                                             __m256* max) {
  const __mmask8 all = 0xff;
  __m256 m = _mm256_load_ps(block.x[0]);
  for (int64_t j = 1; j < c; ++j) {
    const __m256 v = _mm256_load_ps(block.x[j]);
    m = _mm256_mask_blend_ps(_mm256_cmp_ps_mask(m, v, _CMP_LT_OQ), m, v);
  }
  // (Unrolled by 8, so that the lanes stay in registers.)
  __m512d lanes[8];
  for (__m512d& lane : lanes) lane = _mm512_setzero_pd();
  for (int64_t j0 = 0; j0 < c; j0 += 8) {
#pragma GCC unroll 8
    for (int64_t k = 0; k < 8; ++k) {
      if (j0 + k == c) break;
      const __m512d e =
          exponential8(_mm512_maskz_cvtps_pd(all, _mm256_sub_ps(_mm256_load_ps(block.x[j0 + k]), m)));
      _mm512_store_pd(block.e[j0 + k], e);
      lanes[k] = _mm512_add_pd(lanes[k], e);
    }
  }
  *max = m;
  return _mm512_add_pd(_mm512_add_pd(_mm512_add_pd(lanes[0], lanes[4]), _mm512_add_pd(lanes[2], lanes[6])),
                       _mm512_add_pd(_mm512_add_pd(lanes[1], lanes[5]), _mm512_add_pd(lanes[3], lanes[7])));
}

// std::log of each lane.
__attribute__((target("avx512f"))) __m512d logOf(__m512d x) {
  alignas(64) double v[8];
  _mm512_store_pd(v, x);
  for (double& d : v) d = std::log(d);
  return _mm512_load_pd(v);
}

// Calls rows(block, first row, rows in the block) for the blocks of 8
// rows of c elements at x.
template <class Rows>
__attribute__((target("avx512f,avx512vl"))) void forRowBlocks(const float* x, int64_t rows, int64_t c,
                                                              Rows f) {
  RowBlock block;
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    const int64_t count = std::min<int64_t>(8, rows - r0);
    loadRows(x + r0 * c, count, c, block.x);
    f(block, r0, count);
  }
}

// probabilities() of 8 exponentials e with their sum: (e / sum, minus 1
// in the lanes of `hot`) times scale, rounded to float.
__attribute__((target("avx512f"), always_inline)) inline __m256 probability8(__m512d e, __m512d sum,
                                                                             __mmask8 hot, __m512d scale) {
  const __m512d p = _mm512_div_pd(e, sum);
  return _mm512_maskz_cvtpd_ps(0xff,
                               _mm512_mul_pd(_mm512_mask_sub_pd(p, hot, p, _mm512_set1_pd(1.0)), scale));
}

// The rows of shortRowProbabilities().
struct ProbabilityRows {
  int64_t c;
  const float* labels;
  double factor;
  float* out;
  __attribute__((target("avx512f,avx512vl,avx512dq"))) void operator()(RowBlock& block, int64_t r0,
                                                                       int64_t count) const {
    __m256 max;
    const __m512d sum = exponentialSums(block, c, &max);
    alignas(64) double label[8];
    for (int64_t i = 0; i < 8; ++i) label[i] = labels != nullptr && i < count ? labels[r0 + i] : -1.0;
    const __m512d labelOf = _mm512_load_pd(label);
    const __m512d scale = _mm512_set1_pd(factor);
    for (int64_t j = 0; j < c; ++j) {
      const __mmask8 hot = _mm512_cmp_pd_mask(labelOf, _mm512_set1_pd(static_cast<double>(j)), _CMP_EQ_OQ);
      _mm256_store_ps(block.out[j], probability8(_mm512_load_pd(block.e[j]), sum, hot, scale));
    }
    storeRows(block.out, count, c, out + r0 * c);
  }
};

// The rows of shortRowLogSoftmax() (into logSoftmax) or of
// shortRowLogSumExps() (into logSumExps).
struct LogRows {
  int64_t c;
  float* logSoftmax;
  double* logSumExps;
  __attribute__((target("avx512f,avx512vl,avx512dq"))) void operator()(RowBlock& block, int64_t r0,
                                                                       int64_t count) const {
    const __mmask8 all = 0xff;
    __m256 max;
    const __m512d logSum = logOf(exponentialSums(block, c, &max));
    if (logSumExps != nullptr) {
      const __m512d lse = _mm512_add_pd(_mm512_maskz_cvtps_pd(all, max), logSum);
      return _mm512_mask_storeu_pd(logSumExps + r0, firstLanes8(count), lse);
    }
    for (int64_t j = 0; j < c; ++j) {
      const __m512d shifted = _mm512_maskz_cvtps_pd(all, _mm256_sub_ps(_mm256_load_ps(block.x[j]), max));
      _mm256_store_ps(block.out[j], _mm512_maskz_cvtpd_ps(all, _mm512_sub_pd(shifted, logSum)));
    }
    storeRows(block.out, count, c, logSoftmax + r0 * c);
  }
};

// The short-row functions: f over the blocks of rows when they run here
// (rows), else nothing (0).
template <class Rows>
int64_t shortRows(const float* x, int64_t rows, int64_t c, Rows f) {
  if (c <= 0 || c > kShortRow || !cpuHasAvx512()) return 0;
  forRowBlocks(x, rows, c, f);
  return rows;
}

// LaneSum::add when the lanes are aligned: lanes += values[8 i, 8 i + 8)
// in order, the last few into the first lanes; the count added (n).
__attribute__((target("avx512f"))) int64_t addLanesAvx512(const double* values, int64_t n, double* lanes) {
  __m512d sum = _mm512_loadu_pd(lanes);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) sum = _mm512_add_pd(sum, _mm512_loadu_pd(values + j));
  if (j < n) {  // the last few into the first lanes
    const auto tail = firstLanes8(n - j);
    sum = _mm512_mask_add_pd(sum, tail, sum, _mm512_maskz_loadu_pd(tail, values + j));
  }
  _mm512_storeu_pd(lanes, sum);
  return n;
}

// probabilities(), the last few through masks; the count written (n).
__attribute__((target("avx512f,avx512vl"))) int64_t probabilitiesAvx512(const double* e, int64_t n,
                                                                        double sum, int64_t label,
                                                                        double factor, float* out) {
  const __m512d divisor = _mm512_set1_pd(sum);
  const __m512d scale = _mm512_set1_pd(factor);
  const __m512d index = _mm512_set_pd(7, 6, 5, 4, 3, 2, 1, 0);
  for (int64_t j = 0; j < n; j += 8) {
    const auto lanes = firstLanes8(n - j);
    const __mmask8 hot = _mm512_cmp_pd_mask(_mm512_add_pd(index, _mm512_set1_pd(static_cast<double>(j))),
                                            _mm512_set1_pd(static_cast<double>(label)), _CMP_EQ_OQ);
    // (Lanes past n load 1, not 0, so that no division makes a NaN.)
    const __m512d e8 = _mm512_mask_loadu_pd(_mm512_set1_pd(1.0), lanes, e + j);
    _mm256_mask_storeu_ps(out + j, lanes, probability8(e8, divisor, hot, scale));
  }
  return n;
}

// The lanes of blockSum() for n <= kRowSumBlock values: four vectors, lane
// k mod 64 of value k, the last few through masks.
__attribute__((target("avx512f"))) void blockLanesAvx512(const float* x, int64_t n, float* lanes) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) {
    for (std::size_t v = 0; v < 4; ++v) acc[v] = _mm512_add_ps(acc[v], _mm512_loadu_ps(x + j + 16 * v));
  }
  for (std::size_t v = 0; v < 4 && j + 16 * static_cast<int64_t>(v) < n; ++v) {
    const int64_t left = n - j - 16 * static_cast<int64_t>(v);
    const auto mask = firstLanes16(left);
    acc[v] = _mm512_mask_add_ps(acc[v], mask, acc[v], _mm512_maskz_loadu_ps(mask, x + j + 16 * v));
  }
  for (std::size_t v = 0; v < 4; ++v) _mm512_storeu_ps(lanes + 16 * v, acc[v]);
}
#else
// (The vector forms' names, for ofFloats; only x86 has them.)
struct Erf8;
struct Exponential8;
struct Sigmoid8;
struct Tanh8;
#endif

// A block's sum (n <= kRowSumBlock): 64 lanes, then the fixed tree. A lane
// that no value reached holds +0, so the additions of it are left out (they
// could only turn a -0 into +0, which the sum from +0 does anyway).
float blockSum(const float* x, int64_t n) {
  std::array<float, 64> lanes{};
  const auto used = static_cast<std::size_t>(std::min<int64_t>(n, 64));
  int64_t j = 0;
#ifdef TESSERA_X86_SIMD
  if (n >= 64 && cpuHasAvx512()) {
    blockLanesAvx512(x, n, lanes.data());
    j = n;
  }
#endif
  for (; j < n; ++j) lanes[static_cast<std::size_t>(j % 64)] += x[j];
  for (std::size_t w = 32; w >= 1; w /= 2) {
    for (std::size_t i = 0; i < w && i + w < used; ++i) lanes[i] = lanes[i] + lanes[i + w];
  }
  return lanes[0];
}

// out[j] = scalar(x[j]) for j in [0, n): through floatsThroughDoubles with
// a Vector where the CPU has AVX-512 (the same bits).
template <class Vector, class Scalar>
void ofFloats(const float* x, int64_t n, float* out, Scalar scalar) {
#ifdef TESSERA_X86_SIMD
  if (cpuHasAvx512()) return floatsThroughDoubles(x, n, out, Vector{});
#endif
  for (int64_t j = 0; j < n; ++j) out[j] = scalar(x[j]);
}

}  // namespace

double exponential(double x) {
#ifdef TESSERA_X86_SIMD
  if (cpuHasFma()) return exponentialFma(x);
#endif
  return exponentialWith(x, FusedMultiplyAdd{});
}

float erfOf(float x) {
#ifdef TESSERA_X86_SIMD
  if (cpuHasFma()) return erfFma(x, erfTable());
#endif
  return erfWith(x, erfTable(), FusedMultiplyAdd{});
}

void erfOf(const float* x, int64_t n, float* out) {
  ofFloats<Erf8>(x, n, out, [](float v) { return erfOf(v); });
}

float exponentialOf(float x) { return static_cast<float>(exponential(static_cast<double>(x))); }

void exponentialOf(const float* x, int64_t n, float* out) {
  ofFloats<Exponential8>(x, n, out, [](float v) { return exponentialOf(v); });
}

float sigmoidOf(float x) { return static_cast<float>(1.0 / (1.0 + exponential(-static_cast<double>(x)))); }

void sigmoidOf(const float* x, int64_t n, float* out) {
  ofFloats<Sigmoid8>(x, n, out, [](float v) { return sigmoidOf(v); });
}

float tanhOf(float x) {
  const double a = std::fabs(static_cast<double>(x));
  double r = 0.0;
  if (a < kTanhSmall) {
#ifdef TESSERA_X86_SIMD
    r = cpuHasFma() ? smallTanhFma(a) : smallTanh(a, FusedMultiplyAdd{});
#else
    r = smallTanh(a, FusedMultiplyAdd{});
#endif
  } else {
    r = 1.0 - 2.0 / (exponential(2.0 * a) + 1.0);
  }
  return static_cast<float>(std::copysign(r, static_cast<double>(x)));
}

void tanhOf(const float* x, int64_t n, float* out) {
  ofFloats<Tanh8>(x, n, out, [](float v) { return tanhOf(v); });
}

void shiftedExponentials(const float* x, int64_t n, float max, double* out) {
  int64_t j = 0;
#ifdef TESSERA_X86_SIMD
  if (cpuHasAvx512()) j = shiftedExponentialsAvx512(x, n, max, out);
#endif
  for (; j < n; ++j) out[j] = exponential(static_cast<double>(x[j] - max));
}

}  // namespace tessera::sim

namespace tessera::sim {

void LaneSum::add(const double* values, int64_t n) {
  int64_t j = 0;
#ifdef TESSERA_X86_SIMD
  if (count_ % 8 == 0 && cpuHasAvx512()) j = addLanesAvx512(values, n, lanes_.data());
#endif
  for (; j < n; ++j) lanes_[static_cast<std::size_t>((count_ + j) % 8)] += values[j];
  count_ += n;
}

double LaneSum::total() const {
  return ((lanes_[0] + lanes_[4]) + (lanes_[2] + lanes_[6])) +
         ((lanes_[1] + lanes_[5]) + (lanes_[3] + lanes_[7]));
}

void probabilities(const double* e, int64_t n, double sum, int64_t label, double factor, float* out) {
  int64_t j = 0;
#ifdef TESSERA_X86_SIMD
  if (cpuHasAvx512()) j = probabilitiesAvx512(e, n, sum, label, factor, out);
#endif
  for (; j < n; ++j) out[j] = static_cast<float>((e[j] / sum - (j == label ? 1.0 : 0.0)) * factor);
}

#ifdef TESSERA_X86_SIMD
int64_t shortRowProbabilities(const float* x, int64_t rows, int64_t c, const float* labels, double factor,
                              float* out) {
  return shortRows(x, rows, c, ProbabilityRows{c, labels, factor, out});
}

int64_t shortRowLogSoftmax(const float* x, int64_t rows, int64_t c, float* out) {
  return shortRows(x, rows, c, LogRows{c, out, nullptr});
}

int64_t shortRowLogSumExps(const float* x, int64_t rows, int64_t c, double* out) {
  return shortRows(x, rows, c, LogRows{c, nullptr, out});
}
#else
// Elsewhere the rows go one by one.
int64_t shortRowProbabilities(const float*, int64_t, int64_t, const float*, double, float*) { return 0; }
int64_t shortRowLogSoftmax(const float*, int64_t, int64_t, float*) { return 0; }
int64_t shortRowLogSumExps(const float*, int64_t, int64_t, double*) { return 0; }
#endif

float rowSum(const float* x, int64_t n) {
  float total = 0.0f;
  if (n < kRowSumLanes) {
    for (int64_t j = 0; j < n; ++j) total += x[j];
    return total;
  }
  for (int64_t j0 = 0; j0 < n; j0 += kRowSumBlock) total += blockSum(x + j0, std::min(kRowSumBlock, n - j0));
  return total;
}

double rowSumWide(const float* x, int64_t n) {
  std::array<double, 8> lanes{};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (std::size_t k = 0; k < 8; ++k) lanes[k] += x[j + static_cast<int64_t>(k)];
  for (std::size_t k = 0; j < n; ++j, ++k) lanes[k] += x[j];
  for (std::size_t w = 4; w >= 1; w /= 2)
    for (std::size_t i = 0; i < w; ++i) lanes[i] = lanes[i] + lanes[i + w];
  return lanes[0];
}

}  // namespace tessera::sim
