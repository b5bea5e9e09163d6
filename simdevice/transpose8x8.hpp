// The 8 x 8 transpose of floats in AVX registers, shared by the short rows
// of the softmax family (vector_math.cc) and the strided copies
// (planes.cc). x86 only: the includer checks TESSERA_X86_SIMD.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TESSERA_X86_SIMD 1
#include <immintrin.h>

namespace tessera::sim {

// Transposes the 8 x 8 floats v[i][j] in place (rows to columns).
__attribute__((target("avx"), always_inline)) inline void transpose8x8(__m256 (&v)[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    v[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

}  // namespace tessera::sim

#endif
