// --set overrides on arbitrary bytes: each line of the input is one
// PATH=VALUE, applied to the dump of the default run config (so that array
// entries and every section exist to be overwritten), then the result is
// read and validated. A config that loads must survive its canonical dump.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_support.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/app/run_config.hpp"

namespace {

// More lines are joined to the last override, so that long inputs do not
// turn into thousands of overrides.
constexpr std::size_t kMaxOverrides = 16;

std::vector<std::string> splitLines(std::string_view text) {
  std::vector<std::string> lines;
  while (!text.empty()) {
    const std::size_t end = lines.size() + 1 < kMaxOverrides ? text.find('\n') : std::string_view::npos;
    lines.emplace_back(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return lines;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static const std::string base = nlohmann::json(tessera::RunConfig{}).dump();
  const std::vector<std::string> overrides =
      splitLines(std::string_view(reinterpret_cast<const char*>(data), size));
  tessera::fuzz::expectOnlyTesseraErrors([&] {
    const tessera::RunConfig config = tessera::parseRunConfig(base, "default.json", overrides).config;
    tessera::fuzz::checkRoundTrip(config);
    tessera::validate(config);
  });
  return 0;
}
