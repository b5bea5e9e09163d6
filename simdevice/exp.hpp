// The device's exponential in double precision, for the softmax family.
//
// glibc's exp is called one element at a time and takes most of a softmax
// or a cross entropy (a transformer's attention and its loss). This one runs
// 8 elements at a time on AVX-512 and gives the same bits on every CPU: the
// vector and the scalar forms make the same IEEE operations in the same
// order (fused multiply-adds written out, never left to the compiler), and
// the scaling by 2^n rounds once (vscalefpd, std::ldexp).
//
// The method: n = round(x / ln 2), r = x - n ln 2 (two fused steps, ln 2 in
// two parts), e^r by its Taylor series to r^13 (|r| <= ln 2 / 2, so the
// series' remainder is below 5e-18), then e^r 2^n. Within 1 ulp of e^x for
// every x from -708 (the tests check it against std::exp), infinity from
// e^709.79 on, NaN for NaN; and 0 below -708, where e^x < 3.3e-308 is at
// most a few times the least normal double: computing those values takes the CPU a
// microcode assist each, and no result of the softmax family can tell them
// from 0 (its sums are at least 1, its outputs floats).
#pragma once

#include <cstdint>

namespace tessera::sim {

// e^x, computed as described above.
double exponential(double x);

// out[j] = exponential(double(x[j] - max)) for j in [0, n), x[j] - max
// rounded to float first (the softmax's shifted logits).
void shiftedExponentials(const float* x, int64_t n, float max, double* out);

}  // namespace tessera::sim
