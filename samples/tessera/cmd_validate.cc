// tessera validate CONFIG [--set PATH=VALUE]...: the config's rules, its
// outputs writable, and its program planned against the device (exit status
// kExitDoesNotFit when it does not fit).
#include <memory>
#include <optional>

#include <fmt/core.h>

#include "cli.hpp"
#include "tessera/app/config_notes.hpp"
#include "tessera/app/output_check.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/app/run_plan.hpp"

namespace tessera::cli {

Action attachValidate(CLI::App& command) {
  auto args = std::make_shared<ConfigArgs>();
  addConfigArgs(command, *args);
  return [args] {
    // Planning makes no tensor, so the host bounds of /limits are train's.
    const LoadedRunConfig loaded = loadForPlanning(*args);
    // A config is valid only where its outputs can be written.
    checkOutputs(loaded.config.output);
    // And its program is planned against the device, as explain does.
    const RunPlan plan = planRun(loaded.config);
    fmt::print("{}: valid\n", args->path);
    // Combinations that run but probably are not what was meant.
    for (const ConfigNote& note : configNotes(loaded.config)) fmt::print("warning: {}\n", note.text());
    // Each host stream as the plan models it.
    fmt::print("{}", hostStreamsTable(plan.time));
    if (const std::optional<MemoryShortfall> shortfall = findShortfall(plan.memory))
      return reportDoesNotFit(*shortfall, plan.memory);
    return kExitOk;
  };
}

}  // namespace tessera::cli
