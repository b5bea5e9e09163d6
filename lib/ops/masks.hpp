// The random mask of Dropout, which the mask family's reference
// (lib/ops/masks.cc) and its device kernel (simdevice/ops/masks.cc) share,
// so that both draw the same mask.
#pragma once

#include <cmath>
#include <cstdint>

namespace tessera {

// The draws of 24 bits that Dropout drops at `ratio`: those below
// ratio * 2^24 (an integer, so the reference and the device compare alike).
inline uint64_t dropoutThreshold(double ratio) {
  return static_cast<uint64_t>(std::ceil(ratio * 16777216.0));
}

// Whether Dropout keeps element `index` of the global batch at `step`: a
// uniform draw of 24 bits from a hash of (seed, step, index) alone, so the
// mask does not depend on which replica holds the element.
inline bool dropoutKeeps(uint64_t seed, uint64_t step, uint64_t index, uint64_t threshold) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ULL ^ (step + 0x632BE59BD9B4E019ULL) * 0xBF58476D1CE4E5B9ULL ^
               (index + 1) * 0x94D049BB133111EBULL;
  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return (z >> 40) >= threshold;
}

}  // namespace tessera
