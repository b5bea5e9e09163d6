// tessera train CONFIG [--set PATH=VALUE]... [--resume FILE] [--json-summary FILE] [--quiet]
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include <signal.h>
#include <unistd.h>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "tessera/dist.hpp"
#include "tessera/error.hpp"
#include "tessera/trainer.hpp"

namespace tessera::cli {
namespace {

struct TrainArgs {
  ConfigArgs config;
  std::string resume;
  std::string summaryPath;
  std::string weightsPath;
  bool quiet = false;
};

// Set by the first Ctrl-C: training stops at the next step boundary and
// writes its checkpoint. The handler is installed with SA_RESETHAND, so a
// second Ctrl-C ends the process at once.
volatile std::sig_atomic_t interruptRequested = 0;

void requestInterrupt(int) { interruptRequested = 1; }

// Catches SIGINT while training; restores the previous handler afterwards.
class InterruptHandler {
 public:
  InterruptHandler() {
    interruptRequested = 0;
    struct sigaction action {};
    action.sa_handler = requestInterrupt;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND;
    sigaction(SIGINT, &action, &previous_);
  }
  ~InterruptHandler() { sigaction(SIGINT, &previous_, nullptr); }
  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;

 private:
  struct sigaction previous_ {};
};

// A one-line progress bar on a terminal; a line per epoch otherwise, so that
// logs stay readable.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool quiet) : quiet_(quiet), terminal_(isatty(fileno(stderr)) != 0) {}

  void operator()(const TrainProgress& p) {
    if (quiet_) return;
    const bool epochDone = p.stepInEpoch == p.stepsPerEpoch;
    openLine_ = terminal_ && !epochDone;
    if (!terminal_ && !epochDone) return;
    constexpr int kWidth = 30;
    const auto filled = static_cast<int>(kWidth * p.stepInEpoch / p.stepsPerEpoch);
    fmt::print(stderr, "{}epoch {}/{} [{:<{}}] {}/{}  loss {:.4f}  {:.0f} samples/s{}", terminal_ ? "\r" : "",
               p.epoch + 1, p.epochs, std::string(static_cast<size_t>(filled), '='), kWidth, p.stepInEpoch,
               p.stepsPerEpoch, p.loss, p.samplesPerSecond, epochDone || !terminal_ ? "\n" : "");
    std::fflush(stderr);
  }

  // Ends a progress line left open by an interruption.
  void endLine() {
    if (openLine_) fmt::print(stderr, "\n");
    openLine_ = false;
  }

 private:
  bool quiet_;
  bool terminal_;
  bool openLine_ = false;
};

void writeJsonFile(const std::string& path, const nlohmann::json& value) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << value.dump(2) << '\n';
    out.close();
    if (!out) throw IoError(ErrorCode::FileUnwritable, path, "cannot write the file");
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw IoError(ErrorCode::FileUnwritable, path, "cannot move the file into place");
  }
}

}  // namespace

Action attachTrain(CLI::App& command) {
  auto args = std::make_shared<TrainArgs>();
  addConfigArgs(command, args->config);
  command.add_option("--resume", args->resume,
                     "Continue from this checkpoint: its weights, optimizer state, learning rate and step")
      ->type_name("FILE");
  command.add_option("--json-summary", args->summaryPath,
                     "Write {steps, losses, finalLoss, testAccuracy, samplesPerSecond, ...} to this file");
  command.add_option("--dump-weights", args->weightsPath,
                     "Write the final weights to this file as JSON: {NAME: [values in host order], ...}")
      ->type_name("FILE");
  command.add_flag("--quiet", args->quiet, "No progress output");
  return [args] {
    const LoadedRunConfig loaded = loadValidated(args->config);
    // In a multi-instance run (tessera launch) instance 0 reports for all.
    const bool reports = dist::instanceIndex() == 0;
    ProgressPrinter progress(args->quiet || !reports);
    TrainControl control;
    control.resumeFrom = args->resume;
    control.stopRequested = [] { return interruptRequested != 0; };
    control.onWarning = [](const std::string& warning) { fmt::print(stderr, "warning: {}\n", warning); };
    TrainSummary summary;
    {
      const InterruptHandler handler;
      summary = train(loaded.config, [&](const TrainProgress& p) { progress(p); }, control);
    }
    progress.endLine();
    if (!reports) return summary.interrupted ? kExitInterrupted : kExitOk;
    if (!summary.notice.empty()) fmt::print(stderr, "note: {}\n", summary.notice);
    fmt::print("dataset: {}\n", summary.dataset);
    if (!args->resume.empty()) fmt::print("resumed: {} at step {}\n", args->resume, summary.firstStep);
    fmt::print("steps: {} (global batch {})\n", summary.steps, summary.globalBatch);
    fmt::print("final loss: {:.4f}\n", summary.finalLoss);
    if (!summary.interrupted) {
      fmt::print("test accuracy: {:.4f} ({} samples)\n", summary.testAccuracy, summary.testSamples);
      if (summary.epochTestAccuracies.size() > 1)
        fmt::print("test accuracy per epoch: {:.4f}\n", fmt::join(summary.epochTestAccuracies, " "));
    }
    fmt::print("throughput: {:.0f} samples/s\n", summary.samplesPerSecond);
    if (!summary.checkpoint.empty())
      fmt::print("checkpoint: {} (step {})\n", summary.checkpoint, summary.checkpointStep);
    if (!args->summaryPath.empty()) writeJsonFile(args->summaryPath, summaryJson(summary));
    if (!args->weightsPath.empty()) {
      nlohmann::json weights = nlohmann::json::object();
      for (const auto& [name, values] : summary.weights) weights[name] = values;
      writeJsonFile(args->weightsPath, weights);
    }
    if (!summary.interrupted) return kExitOk;
    const int64_t step = summary.firstStep + summary.steps;
    if (summary.checkpoint.empty()) {
      fmt::print(stderr,
                 "interrupted after step {}; no checkpoint is configured, so the progress is lost (set "
                 "/output/checkpoint to keep it)\n",
                 step);
    } else {
      fmt::print(stderr,
                 "interrupted after step {}; checkpoint written to {}; continue with: tessera train {} "
                 "--resume {}\n",
                 step, summary.checkpoint, args->config.path, summary.checkpoint);
    }
    return kExitInterrupted;
  };
}

}  // namespace tessera::cli
