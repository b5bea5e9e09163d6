// tessera train CONFIG [--set PATH=VALUE]... [--json-summary FILE] [--quiet]
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "tessera/error.hpp"
#include "tessera/trainer.hpp"

namespace tessera::cli {
namespace {

struct TrainArgs {
  ConfigArgs config;
  std::string summaryPath;
  bool quiet = false;
};

// A one-line progress bar on a terminal; a line per epoch otherwise, so that
// logs stay readable.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool quiet) : quiet_(quiet), terminal_(isatty(fileno(stderr)) != 0) {}

  void operator()(const TrainProgress& p) {
    if (quiet_) return;
    const bool epochDone = p.stepInEpoch == p.stepsPerEpoch;
    if (!terminal_ && !epochDone) return;
    constexpr int kWidth = 30;
    const auto filled = static_cast<int>(kWidth * p.stepInEpoch / p.stepsPerEpoch);
    fmt::print(stderr, "{}epoch {}/{} [{:<{}}] {}/{}  loss {:.4f}  {:.0f} samples/s{}", terminal_ ? "\r" : "",
               p.epoch + 1, p.epochs, std::string(static_cast<size_t>(filled), '='), kWidth, p.stepInEpoch,
               p.stepsPerEpoch, p.loss, p.samplesPerSecond, epochDone || !terminal_ ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  bool quiet_;
  bool terminal_;
};

void writeSummary(const std::string& path, const nlohmann::json& summary) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << summary.dump(2) << '\n';
    out.close();
    if (!out) throw IoError(ErrorCode::FileUnwritable, path, "cannot write the summary file");
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw IoError(ErrorCode::FileUnwritable, path, "cannot move the summary file into place");
  }
}

}  // namespace

Action attachTrain(CLI::App& command) {
  auto args = std::make_shared<TrainArgs>();
  addConfigArgs(command, args->config);
  command.add_option("--json-summary", args->summaryPath,
                     "Write {steps, losses, finalLoss, testAccuracy, samplesPerSecond, ...} to this file");
  command.add_flag("--quiet", args->quiet, "No progress output");
  return [args] {
    const LoadedRunConfig loaded = loadValidated(args->config);
    ProgressPrinter progress(args->quiet);
    const TrainSummary summary = train(loaded.config, [&](const TrainProgress& p) { progress(p); });
    if (!summary.notice.empty()) fmt::print(stderr, "note: {}\n", summary.notice);
    fmt::print("dataset: {}\n", summary.dataset);
    fmt::print("steps: {} (global batch {})\n", summary.steps, summary.globalBatch);
    fmt::print("final loss: {:.4f}\n", summary.finalLoss);
    fmt::print("test accuracy: {:.4f} ({} samples)\n", summary.testAccuracy, summary.testSamples);
    fmt::print("throughput: {:.0f} samples/s\n", summary.samplesPerSecond);
    if (!args->summaryPath.empty()) writeSummary(args->summaryPath, summaryJson(summary));
    return kExitOk;
  };
}

}  // namespace tessera::cli
