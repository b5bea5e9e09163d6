// tessera: the command-line tool. It uses only the public API and is the
// reference application: every error the library throws is reported here, in
// one place, and mapped to an exit code.
#include <array>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "cli.hpp"
#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::cli {
namespace {

// Every subcommand, in the order `tessera --help` lists them.
constexpr std::array kSubcommands = {
    Subcommand{"validate", "Check a run config file", attachValidate},
    Subcommand{"explain", "Show a resolved run config, where each value came from, and its sharding domains",
               attachExplain},
    Subcommand{"groups", "Show which replicas a ReplicaGrouping puts together", attachGroups},
    Subcommand{"cbr", "Show how a tensor is split into padded replica shards", attachCbr},
    Subcommand{"train", "Train the model of a run config and report its test accuracy", attachTrain},
    Subcommand{"evaluate", "Report the test accuracy or loss of a checkpoint (or the initial weights) without training",
               attachEvaluate},
    Subcommand{"launch",
               "Run a command as several instances under mpirun, each with its share of the replicas",
               attachLaunch},
    Subcommand{"checkpoint", "Inspect checkpoint files", attachCheckpoint},
    Subcommand{"onnx-test", "Run ONNX backend test folders forward on the simulated device", attachOnnxTest},
    Subcommand{"schema", "Print the JSON Schema of run config files", attachSchema},
};

int run(int argc, char** argv) {
  CLI::App app{"Configure distributed training sessions on a simulated multi-replica device.", "tessera"};
  app.set_version_flag("--version", std::string(TESSERA_VERSION));
  app.require_subcommand(0, 1);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("error: {}\nRun 'tessera --help' or 'tessera COMMAND --help' for usage.\n", e.what());
  });

  std::vector<std::pair<CLI::App*, Action>> actions;
  for (const Subcommand& subcommand : kSubcommands) {
    CLI::App* command = app.add_subcommand(std::string(subcommand.name), std::string(subcommand.summary));
    actions.emplace_back(command, subcommand.attach(*command));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive here too, with exit code 0.
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }

  for (const auto& [command, action] : actions) {
    if (command->parsed()) return action();
  }
  fmt::print(stderr, "{}", app.help());
  return kExitUsage;
}

}  // namespace
}  // namespace tessera::cli

namespace {

// Runs the command line and reports any error; returns the exit code.
int runAndReport(int argc, char** argv) {
  using tessera::cli::kExitInternal;
  using tessera::cli::kExitInvalidInput;
  using tessera::cli::kExitUsage;
  try {
    return tessera::cli::run(argc, argv);
  } catch (const tessera::Error& e) {
    if (e.kind() == tessera::ErrorKind::Internal) {
      fmt::print(stderr, "error: internal: {}\n", e.what());
      return kExitInternal;
    }
    fmt::print(stderr, "error: {}\n", e.what());
    // A file that cannot be read is a usage problem, like a mistyped path, and
    // so is an option's value out of its range.
    const bool usage =
        e.code() == tessera::ErrorCode::FileUnreadable || e.code() == tessera::ErrorCode::InvalidOption;
    return usage ? kExitUsage : kExitInvalidInput;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: internal: {}\n", e.what());
    return kExitInternal;
  } catch (...) {
    fmt::print(stderr, "error: internal: unknown exception\n");
    return kExitInternal;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int status = runAndReport(argc, argv);
  // An instance of a multi-instance run that failed stops the others now
  // rather than leaving them to wait for it until their timeout. (After a
  // stop signal every instance stops at the same step and ends normally.)
  if (status != tessera::cli::kExitOk && status < tessera::cli::kExitSignalBase) {
    tessera::dist::abortInstances(status);
  }
  return status;
}
