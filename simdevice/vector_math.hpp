// The device's vector math: its exponential, the error function, the
// exponential, the sigmoid and tanh of floats (the Erf, Exp, Sigmoid and
// Tanh ops), the softmax family's sums and probabilities, and the sums of
// rows of floats that reductions make, each in a fixed order that a vector
// can compute, with the same bits on every CPU.
//
// The exponential, in double precision, for the softmax family. glibc's
// exp is called one element at a time and took most of a softmax or a
// cross entropy (a transformer's attention and its loss). This one runs 8
// elements at a time on AVX-512 and gives the same bits on every CPU: the
// vector and the scalar forms make the same IEEE operations in the same
// order (fused multiply-adds written out, never left to the compiler; the
// scalar form uses the CPU's own where it has one), and the scaling by 2^n
// is exact or overflows (vscalefpd; multiplications by powers of 2).
//
// The method: n = round(x / ln 2), r = x - n ln 2 (two fused steps, ln 2 in
// two parts), e^r by its Taylor series to r^13 (|r| <= ln 2 / 2, so the
// series' remainder is below 5e-18), then e^r 2^n. Within 1 ulp of e^x for
// every x from -708 (the tests check it against std::exp), infinity from
// e^709.79 on, NaN for NaN; and 0 below -708, where e^x < 3.3e-308 is at
// most a few times the least normal double: computing those values takes
// the CPU a microcode assist each, and no result of the softmax family can
// tell them from 0 (its sums are at least 1, its outputs floats).
#pragma once

#include <array>
#include <cstdint>

namespace tessera::sim {

// e^x, computed as described above.
double exponential(double x);

// The Erf, Exp, Sigmoid and Tanh ops on floats, 8 elements at a time on
// AVX-512 (glibc's erff took 13-24 ns an element and the Erf of a
// transformer's GELU was its largest step). Each value is computed in
// double and rounded once to float, and the scalar forms make the same
// operations, so the bits are the same on every CPU.
//
// erf: |x| in [0, 4) falls in one of 8 pieces of width 1/2, centre c; on
// each a polynomial of degree 12 in t = 4 (|x| - c) in [-1, 1] (Horner's
// order, fused multiply-adds), fitted to erf(x) / x on the first piece (then
// multiplied by |x|, so that tiny x keep their precision) and to erf on the
// others; then x's sign. The coefficients interpolate the C library's
// long double erf at the 13 Chebyshev nodes of each piece, computed once.
// Within 1e-15 of erf relative to it on [0, 4), so the float is the nearest
// one to erf(x) bar values within that distance of a tie; +-1 from |x| = 4
// on (erf rounds to 1 in float from 3.92); NaN for NaN.
float erfOf(float x);
void erfOf(const float* x, int64_t n, float* out);
// e^x: exponential(double(x)) rounded to float.
float exponentialOf(float x);
void exponentialOf(const float* x, int64_t n, float* out);
// The logistic sigmoid, 1 / (1 + exponential(-x)), rounded to float.
float sigmoidOf(float x);
void sigmoidOf(const float* x, int64_t n, float* out);
// tanh: for |x| < 1/16 its Taylor polynomial to x^9 (within 1e-14 of tanh
// relative to it), else 1 - 2 / (exponential(2 |x|) + 1) (within 1e-14
// too: the subtraction loses less than 4 bits there); then x's sign, and
// rounded to float. +-1 for large |x|, NaN for NaN.
float tanhOf(float x);
void tanhOf(const float* x, int64_t n, float* out);

// out[j] = exponential(double(x[j] - max)) for j in [0, n), x[j] - max
// rounded to float first (the softmax's shifted logits).
void shiftedExponentials(const float* x, int64_t n, float max, double* out);

// A sum of doubles in a fixed order that 8 lanes can add: the k-th value
// added goes to lane k mod 8, each lane adds its values in order, and the
// total is ((lane 0 + lane 4) + (lane 2 + lane 6)) + ((lane 1 + lane 5) +
// (lane 3 + lane 7)). The same bits however the values are handed in.
class LaneSum {
 public:
  // Adds values[0, n), the values that follow those added so far.
  void add(const double* values, int64_t n);
  double total() const;

 private:
  std::array<double, 8> lanes_{};
  int64_t count_ = 0;
};

// out[j] = float((e[j] / sum - (j == label ? 1 : 0)) * factor) for j in
// [0, n), each operation in double: a row of softmax probabilities (label
// -1, factor 1) or of the cross entropy's gradient.
void probabilities(const double* e, int64_t n, double sum, int64_t label, double factor, float* out);

// The softmax family on short rows, 8 rows at a time with a row in each
// lane. Row by row, a row of 8 or 32 (an attention row, a small
// vocabulary's logits) left most of each vector empty, and its max, its
// exponentials, their sum and its probabilities waited on each other; across
// rows, the 8 lanes are full and the rows independent. Each function below
// computes rows [0, rows) of c elements at x and returns rows when 0 < c <=
// kShortRow and the CPU has AVX-512; else it does nothing and returns 0 (the
// caller goes row by row). The bits are those of the row-by-row forms: the
// max of std::max_element, the exponentials of shiftedExponentials(), their
// LaneSum, probabilities(), and std::log of the sum.
inline constexpr int64_t kShortRow = 64;
// Row r of out: probabilities(row r's exponentials, c, their sum, label,
// factor), label labels[r] (whole numbers in [0, c)), or -1 where labels is
// null.
int64_t shortRowProbabilities(const float* x, int64_t rows, int64_t c, const float* labels, double factor,
                              float* out);
// Row r of out: float(double(x[j] - max) - log(sum)), the log-softmax.
int64_t shortRowLogSoftmax(const float* x, int64_t rows, int64_t c, float* out);
// out[r] = double(max) + log(sum): row r's log-sum-exp.
int64_t shortRowLogSumExps(const float* x, int64_t rows, int64_t c, double* out);

// The sum in float of a row of n floats, in the order reductions document:
// a row of fewer than kRowSumLanes values in order from +0; a longer one in
// blocks of kRowSumBlock values, each block in 64 lanes (value k into lane
// k mod 64, each lane in order from +0; then lane i += lane i + w for w =
// 32, 16, 8, 4, 2, 1 in turn), and the blocks' sums added in order from +0.
inline constexpr int64_t kRowSumLanes = 64;
inline constexpr int64_t kRowSumBlock = 4096;
float rowSum(const float* x, int64_t n);
// The sum in double of a row of n floats, as the reductions take it: value k
// into lane k mod 8, each lane in order from +0, then the lanes as rowSum's
// tree does (w = 4, 2, 1). The same bits on every CPU and thread count.
double rowSumWide(const float* x, int64_t n);

}  // namespace tessera::sim
