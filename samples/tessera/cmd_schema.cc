// tessera schema: the JSON Schema of the run config.
#include "cli.hpp"
#include "tessera/app/run_config.hpp"

namespace tessera::cli {

Action attachSchema(CLI::App&) {
  return [] {
    printJson(runConfigSchema());
    return kExitOk;
  };
}

}  // namespace tessera::cli
