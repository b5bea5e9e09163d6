// tessera validate CONFIG [--set PATH=VALUE]...
#include <memory>

#include <fmt/core.h>

#include "cli.hpp"
#include "tessera/config_notes.hpp"
#include "tessera/output_check.hpp"
#include "tessera/run_config.hpp"

namespace tessera::cli {

Action attachValidate(CLI::App& command) {
  auto args = std::make_shared<ConfigArgs>();
  addConfigArgs(command, *args);
  return [args] {
    const LoadedRunConfig loaded = loadValidated(*args);
    // A config is valid only where its outputs can be written.
    checkOutputs(loaded.config.output);
    fmt::print("{}: valid\n", args->path);
    // Combinations that run but probably are not what was meant.
    for (const ConfigNote& note : configNotes(loaded.config)) fmt::print("warning: {}\n", note.text());
    return kExitOk;
  };
}

}  // namespace tessera::cli
