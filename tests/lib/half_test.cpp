// float32 <-> IEEE half conversions: every half widens exactly and narrows back
// to itself; narrowing rounds to nearest, ties to even, against a double-
// precision search over all halves; the bulk conversions (F16C where the CPU
// has it) give the scalar functions' bits for every input.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "half.hpp"

namespace {

using tessera::floatToHalf;
using tessera::halfToFloat;

bool isNanHalf(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

// The half's value from its definition, in double.
double halfValue(uint16_t h) {
  const double sign = (h & 0x8000u) != 0 ? -1.0 : 1.0;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0x1f) return mantissa == 0 ? sign * std::numeric_limits<double>::infinity() : std::nan("");
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// The nearest half to `value` (finite), ties to the even pattern, by search
// over the table of every non-negative finite half plus 65536 standing for
// infinity (pattern 0x7c00, even), as IEEE rounding treats it.
// (For a double too: the differences below are exact, as the value lies
// between two neighbouring halves, within a factor of 2 of each.)
template <class T>
uint16_t nearestHalf(T value, const std::vector<double>& table) {
  const double magnitude = std::fabs(static_cast<double>(value));
  const auto sign = static_cast<uint16_t>(std::signbit(value) ? 0x8000u : 0u);
  if (magnitude >= table.back()) return sign | 0x7c00u;
  const auto upper = std::lower_bound(table.begin(), table.end(), magnitude);
  auto high = static_cast<uint16_t>(upper - table.begin());
  if (table[high] == magnitude || high == 0) return sign | high;
  const auto low = static_cast<uint16_t>(high - 1);
  const double below = magnitude - table[low];
  const double above = table[high] - magnitude;
  if (below < above) return sign | low;
  if (above < below) return sign | high;
  return sign | ((low & 1u) == 0 ? low : high);
}

std::vector<double> halfTable() {
  std::vector<double> table;
  for (uint32_t h = 0; h < 0x7c00u; ++h) table.push_back(halfValue(static_cast<uint16_t>(h)));
  table.push_back(65536.0);
  return table;
}

// A deterministic stream of float bit patterns over every exponent.
struct Bits {
  uint64_t state = 0x9e3779b97f4a7c15u;
  uint32_t next() {
    state = state * 6364136223846793005u + 1442695040888963407u;
    return static_cast<uint32_t>(state >> 32);
  }
};

}  // namespace

TEST_CASE("every half widens to its exact value and narrows back to itself") {
  int nans = 0;
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    CAPTURE(h);
    const float wide = halfToFloat(bits);
    if (isNanHalf(bits)) {
      ++nans;
      REQUIRE(std::isnan(wide));
      CHECK(std::signbit(wide) == ((bits & 0x8000u) != 0));
      // Quieted, payload kept: narrowing gives the quiet form of the same NaN.
      CHECK(floatToHalf(wide) == (bits | 0x0200u));
      continue;
    }
    REQUIRE(static_cast<double>(wide) == halfValue(bits));
    CHECK(std::signbit(wide) == ((bits & 0x8000u) != 0));  // -0 stays -0
    REQUIRE(floatToHalf(wide) == bits);
  }
  CHECK(nans == 2 * 1023);
}

TEST_CASE("narrowing rounds to the nearest half, ties to even") {
  const std::vector<double> table = halfTable();
  SUBCASE("landmarks") {
    CHECK(floatToHalf(65504.0f) == 0x7bffu);
    CHECK(floatToHalf(65519.996f) == 0x7bffu);
    CHECK(floatToHalf(65520.0f) == 0x7c00u);  // the tie goes to the even pattern: infinity
    CHECK(floatToHalf(-65520.0f) == 0xfc00u);
    CHECK(floatToHalf(1e30f) == 0x7c00u);
    CHECK(floatToHalf(std::ldexp(1.0f, -24)) == 0x0001u);  // the smallest subnormal
    CHECK(floatToHalf(std::ldexp(1.0f, -25)) == 0x0000u);  // half of it: a tie, to zero
    CHECK(floatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001u);
    CHECK(floatToHalf(-std::ldexp(1.0f, -26)) == 0x8000u);        // -0
    CHECK(floatToHalf(std::ldexp(3.0f, -25)) == 0x0002u);         // 1.5 units: a tie, to the even 2
    CHECK(floatToHalf(std::ldexp(1.0f, -14)) == 0x0400u);         // the smallest normal
    CHECK(floatToHalf(std::ldexp(2047.0f, -25)) == 0x0400u);      // the largest subnormal's tie rounds up
    CHECK(floatToHalf(1.0f + std::ldexp(1.0f, -11)) == 0x3c00u);  // 1 + half an ulp: to 1 (even)
    CHECK(floatToHalf(1.0f + std::ldexp(3.0f, -11)) == 0x3c02u);  // 1 + 1.5 ulp: to 1 + 2 ulp (even)
    CHECK(floatToHalf(std::numeric_limits<float>::infinity()) == 0x7c00u);
    CHECK(floatToHalf(-std::numeric_limits<float>::infinity()) == 0xfc00u);
    CHECK(floatToHalf(std::numeric_limits<float>::denorm_min()) == 0x0000u);
    CHECK(isNanHalf(floatToHalf(std::numeric_limits<float>::quiet_NaN())));
    CHECK(isNanHalf(floatToHalf(std::numeric_limits<float>::signaling_NaN())));
    CHECK(isNanHalf(floatToHalf(std::bit_cast<float>(0xff800001u))));  // payload only below the kept bits
  }
  SUBCASE("every midpoint between neighbouring halves, and the floats either side of it") {
    for (std::size_t k = 0; k + 1 < table.size(); ++k) {
      const auto mid = static_cast<float>((table[k] + table[k + 1]) / 2);
      REQUIRE(static_cast<double>(mid) == (table[k] + table[k + 1]) / 2);  // exact in float
      for (const float value : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f), -mid}) {
        CAPTURE(value);
        REQUIRE(floatToHalf(value) == nearestHalf(value, table));
      }
    }
  }
  SUBCASE("a million floats of every exponent") {
    Bits bits;
    for (int i = 0; i < 1'000'000; ++i) {
      const float value = std::bit_cast<float>(bits.next());
      if (!std::isfinite(value)) continue;
      CAPTURE(value);
      REQUIRE(floatToHalf(value) == nearestHalf(value, table));
    }
  }
}

TEST_CASE("a double narrows to the nearest half in one rounding, not through float32") {
  const std::vector<double> table = halfTable();
  const auto halfOf = [](double value) { return floatToHalf(tessera::roundDoubleToHalf(value)); };
  SUBCASE("landmarks") {
    // Rounded to float32 first, each of these lands on a midpoint and ties the wrong way.
    CHECK(halfOf(1.0 + 0x1p-11 + 0x1p-40) == 0x3c01u);
    CHECK(floatToHalf(static_cast<float>(1.0 + 0x1p-11 + 0x1p-40)) == 0x3c00u);
    CHECK(halfOf(1.0 + 3 * 0x1p-11 - 0x1p-45) == 0x3c01u);
    CHECK(halfOf(65520.0 - 0x1p-30) == 0x7bffu);
    CHECK(halfOf(0x1p-25 + 0x1p-60) == 0x0001u);
    // True ties still go to even; the range's edges as for a float.
    CHECK(halfOf(1.0 + 0x1p-11) == 0x3c00u);
    CHECK(halfOf(0x1p-25) == 0x0000u);
    CHECK(halfOf(65520.0) == 0x7c00u);
    CHECK(halfOf(1e300) == 0x7c00u);
    CHECK(halfOf(-1e300) == 0xfc00u);
    CHECK(halfOf(std::numeric_limits<double>::max()) == 0x7c00u);
    CHECK(halfOf(-std::numeric_limits<double>::infinity()) == 0xfc00u);
    CHECK(halfOf(1e-300) == 0x0000u);
    CHECK(halfOf(-1e-300) == 0x8000u);  // -0
    CHECK(halfOf(std::numeric_limits<double>::denorm_min()) == 0x0000u);
    CHECK(halfOf(-0.0) == 0x8000u);
    CHECK(isNanHalf(halfOf(std::numeric_limits<double>::quiet_NaN())));
  }
  SUBCASE("every midpoint between neighbouring halves, and doubles just either side of it") {
    for (std::size_t k = 0; k + 1 < table.size(); ++k) {
      const double mid = (table[k] + table[k + 1]) / 2;
      const double step = (table[k + 1] - table[k]) * 0x1p-30;
      for (const double value : {mid, mid - step, mid + step, std::nextafter(mid, 0.0),
                                 std::nextafter(mid, 1e300), -(mid + step)}) {
        CAPTURE(value);
        REQUIRE(halfOf(value) == nearestHalf(value, table));
      }
    }
  }
  SUBCASE("a million doubles from 2^-30 to 2^17") {
    Bits bits;
    for (int i = 0; i < 1'000'000; ++i) {
      const uint64_t mantissa = (uint64_t{bits.next()} << 21) ^ bits.next();
      const int exponent = static_cast<int>(bits.next() % 48) - 30;
      const double value =
          std::ldexp(1.0 + static_cast<double>(mantissa & ((uint64_t{1} << 52) - 1)) * 0x1p-52, exponent) *
          ((bits.next() & 1u) != 0 ? -1.0 : 1.0);
      CAPTURE(value);
      REQUIRE(halfOf(value) == nearestHalf(value, table));
    }
  }
}

TEST_CASE("the bulk conversions give the scalar bits, on F16C and without") {
  INFO("F16C: ", tessera::halfConversionUsesF16c());
  // Every half, and floats of every kind: NaNs of both signs and payloads,
  // infinities, subnormals, ties; an odd count, so the tail runs too.
  std::vector<float> floats;
  for (uint32_t h = 0; h <= 0xffffu; ++h) floats.push_back(halfToFloat(static_cast<uint16_t>(h)));
  Bits bits;
  for (int i = 0; i < 200'001; ++i) floats.push_back(std::bit_cast<float>(bits.next()));
  for (const uint32_t special :
       {0x7f800001u, 0xffc00001u, 0x7fbfffffu, 0x00000001u, 0x477ff000u, 0x33000000u})
    floats.push_back(std::bit_cast<float>(special));

  std::vector<uint16_t> expected(floats.size());
  for (std::size_t i = 0; i < floats.size(); ++i) expected[i] = floatToHalf(floats[i]);
  std::vector<uint16_t> bulk(floats.size()), portable(floats.size());
  tessera::floatsToHalves(floats.data(), bulk.data(), floats.size());
  tessera::detail::floatsToHalvesPortable(floats.data(), portable.data(), floats.size());
  CHECK(bulk == expected);
  CHECK(portable == expected);

  // Rounding in place and into another buffer (float16 storage in float
  // slots) gives the bits of narrowing and widening back, on F16C and
  // without; the source of the copy is left as it was.
  std::vector<float> rounded = floats;
  std::vector<float> roundedPortable = floats;
  tessera::roundToHalves(rounded.data(), rounded.size());
  tessera::detail::roundToHalvesPortable(roundedPortable.data(), roundedPortable.data(),
                                         roundedPortable.size());
  const std::vector<float> source = floats;
  std::vector<float> copied(floats.size(), -1.0f);
  std::vector<float> copiedPortable(floats.size(), -1.0f);
  tessera::roundToHalves(source.data(), copied.data(), source.size());
  tessera::detail::roundToHalvesPortable(source.data(), copiedPortable.data(), source.size());
  CHECK(std::memcmp(source.data(), floats.data(), floats.size() * sizeof(float)) == 0);
  for (std::size_t i = 0; i < floats.size(); ++i) {
    const uint32_t want = std::bit_cast<uint32_t>(halfToFloat(expected[i]));
    REQUIRE(std::bit_cast<uint32_t>(rounded[i]) == want);
    REQUIRE(std::bit_cast<uint32_t>(roundedPortable[i]) == want);
    REQUIRE(std::bit_cast<uint32_t>(copied[i]) == want);
    REQUIRE(std::bit_cast<uint32_t>(copiedPortable[i]) == want);
    REQUIRE(std::bit_cast<uint32_t>(tessera::roundToHalf(floats[i])) == want);
  }

  std::vector<uint16_t> halves(0x10000 + 7);
  for (std::size_t h = 0; h < halves.size(); ++h) halves[h] = static_cast<uint16_t>(h * 40503u);
  std::vector<float> wide(halves.size()), widePortable(halves.size());
  tessera::halvesToFloats(halves.data(), wide.data(), halves.size());
  tessera::detail::halvesToFloatsPortable(halves.data(), widePortable.data(), halves.size());
  for (std::size_t i = 0; i < halves.size(); ++i) {
    CAPTURE(halves[i]);
    const uint32_t scalar = std::bit_cast<uint32_t>(halfToFloat(halves[i]));
    REQUIRE(std::bit_cast<uint32_t>(wide[i]) == scalar);
    REQUIRE(std::bit_cast<uint32_t>(widePortable[i]) == scalar);
  }
}

TEST_CASE("every instruction set converts runs of any length, the last ones too, and nothing past them") {
  // Runs of 0 to 40 elements at four alignments: every tail length of the
  // 8- and 16-wide loops. Each path's output must be the scalar bits, and
  // the guard elements on both sides of the run must stay as they were.
  constexpr std::size_t kGuard = 16;
  constexpr float kFloatGuard = 1234.5f;
  constexpr uint16_t kHalfGuard = 0xbeef;
  std::vector<float> values;
  Bits bits;
  for (int i = 0; i < 64; ++i) values.push_back(std::bit_cast<float>(bits.next()));
  values[5] = 65520.0f;                           // a tie that overflows
  values[9] = std::bit_cast<float>(0x7fbfffffu);  // a signalling NaN
  for (const tessera::detail::HalfConversions& path : tessera::detail::halfConversionPaths()) {
    const std::string name = path.name;
    CAPTURE(name);
    for (std::size_t offset = 0; offset < 4; ++offset) {
      for (std::size_t count = 0; count <= 40; ++count) {
        CAPTURE(offset);
        CAPTURE(count);
        const float* in = values.data() + offset;
        std::vector<uint16_t> halves(count + 2 * kGuard, kHalfGuard);
        path.toHalves(in, halves.data() + kGuard, count);
        std::vector<float> rounded(count + 2 * kGuard, kFloatGuard);
        path.round(in, rounded.data() + kGuard, count);
        std::vector<float> inPlace(count + 2 * kGuard, kFloatGuard);
        std::copy_n(in, count, inPlace.begin() + kGuard);
        path.round(inPlace.data() + kGuard, inPlace.data() + kGuard, count);
        std::vector<uint16_t> source(count + 2 * kGuard);
        for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint16_t>(bits.next());
        std::vector<float> widened(count + 2 * kGuard, kFloatGuard);
        path.toFloats(source.data() + kGuard, widened.data() + kGuard, count);
        for (std::size_t i = 0; i < count + 2 * kGuard; ++i) {
          const bool inside = i >= kGuard && i < kGuard + count;
          const uint16_t half = inside ? floatToHalf(in[i - kGuard]) : kHalfGuard;
          const uint32_t round = std::bit_cast<uint32_t>(inside ? halfToFloat(half) : kFloatGuard);
          const uint32_t wide = std::bit_cast<uint32_t>(inside ? halfToFloat(source[i]) : kFloatGuard);
          CAPTURE(i);
          REQUIRE(halves[i] == half);
          REQUIRE(std::bit_cast<uint32_t>(rounded[i]) == round);
          REQUIRE(std::bit_cast<uint32_t>(inPlace[i]) == round);
          REQUIRE(std::bit_cast<uint32_t>(widened[i]) == wide);
        }
      }
    }
  }
  CHECK(tessera::detail::halfConversionPaths().size() >= (tessera::halfConversionUsesF16c() ? 2u : 1u));
}
