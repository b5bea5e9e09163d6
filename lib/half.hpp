// IEEE 754 binary16 ("half") storage: conversions between float32 and the
// 16-bit pattern, rounding to nearest, ties to even, as hardware does on store.
//
// Every value of a half is exactly a float, so widening never rounds. Narrowing
// rounds to the nearest half; a tie goes to the half whose last mantissa bit is
// 0. Magnitudes of 65520 and more (the midpoint between the largest half, 65504,
// and the next power of two) become infinities; magnitudes below half the
// smallest subnormal (2^-25) become zeros of the same sign; a NaN stays a NaN of
// the same sign, quieted, with the top bits of its payload kept.
//
// The bulk conversions use the CPU's F16C instructions where it has them
// (chosen at run time, so a build for the baseline architecture uses them too)
// and give the same bits as the scalar functions for every input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tessera {

// The bit pattern of the half nearest to `value`.
uint16_t floatToHalf(float value);

// The float equal to the half with bit pattern `bits`.
float halfToFloat(uint16_t bits);

// out[i] = floatToHalf(in[i]) for i < count.
void floatsToHalves(const float* in, uint16_t* out, std::size_t count);

// out[i] = halfToFloat(in[i]) for i < count.
void halvesToFloats(const uint16_t* in, float* out, std::size_t count);

// The float equal to the half nearest to `value`: a float32 value stored as
// half and read back.
inline float roundToHalf(float value) { return halfToFloat(floatToHalf(value)); }

// The float equal to the half nearest to the double `value`, rounded once
// (not through float32, whose rounding can land on the midpoint between two
// halves and then tie to even: 1 + 2^-11 + 2^-40 is 1 + 2^-10, not 1).
float roundDoubleToHalf(double value);

// out[i] = roundToHalf(in[i]) for i < count (float16 storage held in float
// slots); `out` may be `in`.
void roundToHalves(const float* in, float* out, std::size_t count);
inline void roundToHalves(float* data, std::size_t count) { roundToHalves(data, data, count); }

// Whether the bulk conversions run on F16C instructions on this CPU (for the
// benchmarks and the tests, which check both paths).
bool halfConversionUsesF16c();

namespace detail {
// The portable bulk conversions, always available (the tests compare them
// with the F16C ones).
void floatsToHalvesPortable(const float* in, uint16_t* out, std::size_t count);
void halvesToFloatsPortable(const uint16_t* in, float* out, std::size_t count);
void roundToHalvesPortable(const float* in, float* out, std::size_t count);

// One instruction set's bulk conversions.
struct HalfConversions {
  const char* name;
  void (*toHalves)(const float* in, uint16_t* out, std::size_t count);
  void (*toFloats)(const uint16_t* in, float* out, std::size_t count);
  void (*round)(const float* in, float* out, std::size_t count);
};
// Every set this CPU can run, the portable one first and the one the bulk
// conversions use last (the tests run each).
std::vector<HalfConversions> halfConversionPaths();
}  // namespace detail

}  // namespace tessera
