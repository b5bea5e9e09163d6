// The checkpoint reader on arbitrary bytes. A file it accepts must survive a
// round trip: encoding what was read, reading that and encoding it again
// gives the same bytes (bytes, not values: the data may hold NaNs).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "fuzz_support.hpp"
#include "tessera/app/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  tessera::fuzz::expectOnlyTesseraErrors([&] {
    const tessera::Checkpoint checkpoint = tessera::decodeCheckpoint(std::span<const uint8_t>(data, size), "fuzz");
    const std::vector<uint8_t> once = tessera::encodeCheckpoint(checkpoint);
    const std::vector<uint8_t> twice = tessera::encodeCheckpoint(tessera::decodeCheckpoint(once, "fuzz re-encoded"));
    if (once != twice) {
      std::fprintf(stderr, "fuzz finding: a checkpoint changed on a round trip\n");
      std::abort();
    }
  });
  return 0;
}
