// The run-config loader and validate() on arbitrary bytes. A config that
// loads must survive its canonical dump: the dump reads back as the same
// config.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_support.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/app/run_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  tessera::fuzz::expectOnlyTesseraErrors([&] {
    const tessera::RunConfig config = tessera::parseRunConfig(text, "fuzz.json").config;
    tessera::fuzz::checkRoundTrip(config);
    tessera::validate(config);
  });
  return 0;
}
