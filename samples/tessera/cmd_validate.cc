// tessera validate CONFIG [--set PATH=VALUE]...
#include <memory>

#include <fmt/core.h>

#include "cli.hpp"
#include "tessera/output_check.hpp"

namespace tessera::cli {

Action attachValidate(CLI::App& command) {
  auto args = std::make_shared<ConfigArgs>();
  addConfigArgs(command, *args);
  return [args] {
    const LoadedRunConfig loaded = loadValidated(*args);
    // A config is valid only where its outputs can be written.
    checkOutputs(loaded.config.output);
    fmt::print("{}: valid\n", args->path);
    return kExitOk;
  };
}

}  // namespace tessera::cli
