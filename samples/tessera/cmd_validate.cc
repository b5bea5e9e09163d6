// tessera validate CONFIG [--set PATH=VALUE]...
#include <memory>

#include <fmt/core.h>

#include "cli.hpp"

namespace tessera::cli {

Action attachValidate(CLI::App& command) {
  auto args = std::make_shared<ConfigArgs>();
  addConfigArgs(command, *args);
  return [args] {
    loadValidated(*args);
    fmt::print("{}: valid\n", args->path);
    return kExitOk;
  };
}

}  // namespace tessera::cli
