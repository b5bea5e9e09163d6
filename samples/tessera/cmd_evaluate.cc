// tessera evaluate CONFIG [--set PATH=VALUE]... [--checkpoint FILE] [--json-summary FILE]:
// the test set of a run config with a checkpoint's weights (or the initial
// ones), without training; under tessera launch on any split of the replicas.
#include <memory>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "tessera/dist.hpp"
#include "tessera/output_check.hpp"
#include "tessera/trainer.hpp"

namespace tessera::cli {
namespace {

struct EvaluateArgs {
  ConfigArgs config;
  std::string checkpoint;
  std::string summaryPath;
  bool allowNonFinite = false;
};

}  // namespace

Action attachEvaluate(CLI::App& command) {
  auto args = std::make_shared<EvaluateArgs>();
  addConfigArgs(command, args->config);
  command.add_option("--checkpoint", args->checkpoint,
                     "Evaluate this checkpoint's weights (default: the model's initial weights)")
      ->type_name("FILE");
  command.add_option("--json-summary", args->summaryPath,
                     "Write {testAccuracy, testLoss, testSamples, testGlobalBatch, dataset, checkpoint, "
                     "checkpointStep} to this file")
      ->type_name("FILE");
  command.add_flag("--allow-non-finite", args->allowNonFinite,
                   "Evaluate a checkpoint that holds NaN or infinite values (refused otherwise)");
  return [args] {
    const LoadedRunConfig loaded = loadValidated(args->config);
    // In a multi-instance run (tessera launch) instance 0 reports for all.
    const bool reports = dist::instanceIndex() == 0;
    if (reports) checkOutputPath(args->summaryPath, "--json-summary");
    EvaluateControl control;
    control.checkpoint = args->checkpoint;
    control.allowNonFinite = args->allowNonFinite;
    control.onWarning = [reports](const std::string& warning) {
      if (reports) fmt::print(stderr, "warning: {}\n", warning);
    };
    const EvaluateSummary summary = evaluate(loaded.config, control);
    if (!reports) return kExitOk;
    if (!summary.notice.empty()) fmt::print(stderr, "note: {}\n", summary.notice);
    fmt::print("dataset: {}\n", summary.dataset);
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
    if (!args->summaryPath.empty()) writeOutputFile(args->summaryPath, summaryJson(summary).dump(2) + '\n');
    return kExitOk;
  };
}

}  // namespace tessera::cli
