// Small pieces of x86 vector code shared by the vector kernels
// (vector_math.cc, planes.cc, ops/elementwise.cc, ops/pooling.cc): masks
// of a vector's first lanes and the 8 x 8 transpose of floats. x86 only:
// the includer checks TESSERA_X86_SIMD.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TESSERA_X86_SIMD 1
#include <immintrin.h>

#include <cstdint>

namespace tessera::sim {

// The mask of a vector's first n lanes (all of them when n >= 8 or 16):
// the lanes of a row's last, partial vector.
inline __mmask8 firstLanes8(int64_t n) { return static_cast<__mmask8>(n >= 8 ? 0xff : (1u << n) - 1); }
inline __mmask16 firstLanes16(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xffff : (1u << n) - 1); }

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
