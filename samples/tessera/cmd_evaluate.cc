// tessera evaluate CONFIG [--set PATH=VALUE]... [--checkpoint FILE] [--json-summary FILE]:
// the test set of a run config with a checkpoint's weights (or the initial
// ones), without training; under tessera launch on any split of the replicas.
#include <memory>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "tessera/app/output_check.hpp"
#include "tessera/app/trainer.hpp"

namespace tessera::cli {
namespace {

struct EvaluateArgs {
  RunArgs run;
  std::string checkpoint;
};

}  // namespace

Action attachEvaluate(CLI::App& command) {
  auto args = std::make_shared<EvaluateArgs>();
  addConfigArgs(command, args->run.config);
  command.add_option("--checkpoint", args->checkpoint,
                     "Evaluate this checkpoint's weights (default: the model's initial weights)")
      ->type_name("FILE");
  addSummaryOption(
      command, args->run,
      "{testAccuracy, testLoss, testSamples, testGlobalBatch, dataset, checkpoint, checkpointStep}");
  addAllowNonFiniteFlag(command, args->run, "Evaluate");
  return [args] {
    const StartedRun run = startRun(args->run);
    const bool reports = run.reports;
    EvaluateControl control;
    control.checkpoint = args->checkpoint;
    control.allowNonFinite = args->run.allowNonFinite;
    control.onWarning = [reports](const std::string& warning) {
      if (reports) fmt::print(stderr, "warning: {}\n", warning);
    };
    const EvaluateSummary summary = evaluate(run.loaded.config, control);
    if (!reports) return kExitOk;
    printRunHeader(summary.notice, summary.dataset);
    if (summary.checkpoint.empty()) {
      fmt::print("weights: initial (no checkpoint given)\n");
    } else {
      fmt::print("weights: {} (step {})\n", summary.checkpoint, summary.checkpointStep);
    }
    if (summary.hasAccuracy)
      fmt::print("test accuracy: {:.4f} ({} samples)\n", summary.testAccuracy, summary.testSamples);
    if (summary.hasLoss) {
      const int64_t used = summary.testSamples / summary.testGlobalBatch * summary.testGlobalBatch;
      fmt::print("test loss: {:.4f} ({} samples in whole global batches of {})\n", summary.testLoss, used,
                 summary.testGlobalBatch);
    }
    if (!args->run.summaryPath.empty())
      writeOutputFile(args->run.summaryPath, summaryJson(summary).dump(2) + '\n');
    return kExitOk;
  };
}

}  // namespace tessera::cli
