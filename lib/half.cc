#include "half.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define TESSERA_HALF_X86 1
#else
#define TESSERA_HALF_X86 0
#endif

namespace tessera {

namespace {

constexpr uint32_t kFloatAbsMask = 0x7fffffffu;
constexpr uint32_t kFloatInfinity = 0x7f800000u;
constexpr uint16_t kHalfInfinity = 0x7c00u;
constexpr uint16_t kHalfQuietBit = 0x0200u;
// 65520: halfway between 65504, the largest half, and 65536. 65504's last
// mantissa bit is 1, so the tie goes up, to infinity.
constexpr uint32_t kFloatHalfOverflow = 0x477ff000u;
// 2^-14, the smallest normal half.
constexpr uint32_t kFloatHalfNormalMin = 0x38800000u;
// The float exponent bias less the half's (127 - 15), in place.
constexpr uint32_t kRebias = 112u << 23;

}  // namespace

uint16_t floatToHalf(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & kFloatAbsMask;
  if (magnitude >= kFloatInfinity) {
    if (magnitude == kFloatInfinity) return sign | kHalfInfinity;
    // A NaN: quieted, the top ten bits of its payload kept.
    return static_cast<uint16_t>(sign | kHalfInfinity | kHalfQuietBit | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= kFloatHalfOverflow) return sign | kHalfInfinity;
  if (magnitude >= kFloatHalfNormalMin) {
    // Normal: drop 13 mantissa bits, rounding to nearest even; a carry moves
    // into the exponent, as it should (0x477fefff and below stay finite).
    const uint32_t rounded = magnitude + 0x0fffu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - kRebias) >> 13));
  }
  // Subnormal or zero: the value is m * 2^(e - 150) for the float's biased
  // exponent e and mantissa m with its implicit bit, and the half counts units
  // of 2^-24, so the result is m / 2^(126 - e) rounded to nearest even. Below
  // 2^-25 (e < 102) everything rounds to zero; 2^-25 itself is a tie to zero.
  const uint32_t exponent = magnitude >> 23;
  if (exponent < 102) return sign;
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // 14 to 24
  uint32_t units = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (units & 1u))) ++units;  // 1024 is 2^-14, the smallest normal
  return static_cast<uint16_t>(sign | units);
}

float halfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {
    // Infinity, or a NaN quieted with its payload kept.
    const uint32_t quiet = mantissa != 0 ? 0x400000u : 0u;
    return std::bit_cast<float>(sign | kFloatInfinity | quiet | (mantissa << 13));
  }
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent << 23) + kRebias) | (mantissa << 13));
  if (mantissa == 0) return std::bit_cast<float>(sign);
  // Subnormal: m * 2^-24, normal as a float. Shift the leading 1 up to the
  // implicit bit's place, lowering the exponent by one per step.
  uint32_t floatExponent = 127 - 14;  // of 2^-14, for a leading 1 in bit 10
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --floatExponent;
  }
  return std::bit_cast<float>(sign | (floatExponent << 23) | ((mantissa & 0x3ffu) << 13));
}

float roundDoubleToHalf(double value) {
  float narrow = static_cast<float>(value);
  if (static_cast<double>(narrow) == value || value != value) return roundToHalf(narrow);
  // Inexact: round to odd instead, the float next to `value` toward zero
  // with its last bit set. It lies on the same side of every half and every
  // midpoint between two halves as `value` does (float32 keeps at least two
  // bits more than a half, in the normal range and in the half's subnormal
  // one), so the one rounding that follows is that of `value` itself. Beyond
  // float32's range it is the largest float, which overflows a half as
  // `value` does; below it, the smallest subnormal, which rounds to zero.
  if (std::fabs(static_cast<double>(narrow)) > std::fabs(value)) narrow = std::nextafter(narrow, 0.0f);
  return roundToHalf(std::bit_cast<float>(std::bit_cast<uint32_t>(narrow) | 1u));
}

namespace detail {

void floatsToHalvesPortable(const float* in, uint16_t* out, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) out[i] = floatToHalf(in[i]);
}

void roundToHalvesPortable(const float* in, float* out, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) out[i] = halfToFloat(floatToHalf(in[i]));
}

void halvesToFloatsPortable(const uint16_t* in, float* out, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) out[i] = halfToFloat(in[i]);
}

}  // namespace detail

namespace {

#if TESSERA_HALF_X86

bool cpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  // F16C is ECX bit 29; its 256-bit forms need the OS to keep AVX state,
  // which __builtin_cpu_supports("avx") checks.
  return (ecx & (1u << 29)) != 0 && __builtin_cpu_supports("avx");
}

__attribute__((target("avx,f16c"))) void floatsToHalvesF16c(const float* in, uint16_t* out,
                                                            std::size_t count) {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 values = _mm256_loadu_ps(in + i);
    const __m128i halves = _mm256_cvtps_ph(values, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), halves);
  }
  if (i == count) return;
  // The last 1-7 through a vector too, by way of a buffer.
  alignas(32) float tail[8] = {};
  alignas(16) uint16_t halves[8];
  std::copy(in + i, in + count, tail);
  _mm_store_si128(reinterpret_cast<__m128i*>(halves),
                  _mm256_cvtps_ph(_mm256_load_ps(tail), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  std::copy_n(halves, count - i, out + i);
}

__attribute__((target("avx,f16c"))) void halvesToFloatsF16c(const uint16_t* in, float* out,
                                                            std::size_t count) {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(halves));
  }
  if (i == count) return;
  alignas(16) uint16_t tail[8] = {};
  alignas(32) float floats[8];
  std::copy(in + i, in + count, tail);
  _mm256_store_ps(floats, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(tail))));
  std::copy_n(floats, count - i, out + i);
}

__attribute__((target("avx,f16c"))) void roundToHalvesF16c(const float* in, float* out, std::size_t count) {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i halves =
        _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(halves));
  }
  if (i == count) return;
  alignas(32) float tail[8] = {};
  std::copy(in + i, in + count, tail);
  const __m128i halves = _mm256_cvtps_ph(_mm256_load_ps(tail), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm256_store_ps(tail, _mm256_cvtph_ps(halves));
  std::copy_n(tail, count - i, out + i);
}

// 16 floats a step: AVX-512 converts whole zmm registers (the zero-masked
// forms: the plain ones start from an undefined register, which g++ 12
// reports as maybe uninitialized).
__attribute__((target("avx512f"))) void roundToHalvesAvx512(const float* in, float* out, std::size_t count) {
  const __mmask16 all = 0xffff;
  std::size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256i halves =
        _mm512_maskz_cvtps_ph(all, _mm512_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm512_storeu_ps(out + i, _mm512_maskz_cvtph_ps(all, halves));
  }
  if (i == count) return;
  // The last 1-15 through masks: the lanes past the end are neither read
  // nor written (rows of a GEMM's product, 10 columns wide, are all tail).
  const auto tail = static_cast<__mmask16>((1u << (count - i)) - 1u);
  const __m256i halves = _mm512_maskz_cvtps_ph(all, _mm512_maskz_loadu_ps(tail, in + i),
                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm512_mask_storeu_ps(out + i, tail, _mm512_maskz_cvtph_ps(all, halves));
}

#endif

// The paths this CPU can run, the portable one first and the one chosen last.
std::vector<detail::HalfConversions> availablePaths() {
  std::vector<detail::HalfConversions> paths{{"portable", detail::floatsToHalvesPortable,
                                              detail::halvesToFloatsPortable, detail::roundToHalvesPortable}};
#if TESSERA_HALF_X86
  if (cpuHasF16c()) {
    paths.push_back({"f16c", floatsToHalvesF16c, halvesToFloatsF16c, roundToHalvesF16c});
    if (__builtin_cpu_supports("avx512f"))
      paths.push_back({"f16c+avx512", floatsToHalvesF16c, halvesToFloatsF16c, roundToHalvesAvx512});
  }
#endif
  return paths;
}

const detail::HalfConversions& converters() {
  static const detail::HalfConversions chosen = availablePaths().back();
  return chosen;
}

}  // namespace

void floatsToHalves(const float* in, uint16_t* out, std::size_t count) {
  converters().toHalves(in, out, count);
}

void halvesToFloats(const uint16_t* in, float* out, std::size_t count) {
  converters().toFloats(in, out, count);
}

void roundToHalves(const float* in, float* out, std::size_t count) { converters().round(in, out, count); }

bool halfConversionUsesF16c() { return converters().round != detail::roundToHalvesPortable; }

std::vector<detail::HalfConversions> detail::halfConversionPaths() { return availablePaths(); }

}  // namespace tessera
