// tessera train CONFIG [--set PATH=VALUE]... [--resume FILE] [--json-summary FILE] [--quiet]
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <signal.h>
#include <unistd.h>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "tessera/popdist/communicator.hpp"
#include "tessera/app/config_notes.hpp"
#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/app/output_check.hpp"
#include "tessera/app/trainer.hpp"

namespace tessera::cli {
namespace {

struct TrainArgs {
  RunArgs run;
  std::string resume;
  std::string weightsPath;
  bool quiet = false;
};

// The number of the first stop signal (0: none yet): training stops at the
// next step boundary and writes its checkpoint. A second signal ends the
// process at once.
volatile std::sig_atomic_t stopSignal = 0;

void requestStop(int signal) {
  if (stopSignal != 0) {
    // Async-signal-safe: back to the default action, then the signal again.
    struct sigaction fallback {};
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    sigaction(signal, &fallback, nullptr);
    raise(signal);
    return;
  }
  // tessera launch forwards SIGTERM and SIGHUP as SIGUSR1 and SIGUSR2, the
  // signals mpirun passes on to the instances (it kills them on SIGTERM).
  stopSignal = signal == SIGUSR1 ? SIGTERM : signal == SIGUSR2 ? SIGHUP : signal;
}

// Catches the signals that ask a program to stop (Ctrl-C; SIGTERM from
// timeout, batch schedulers, container runtimes; SIGHUP from a closed
// terminal) while training, and under tessera launch the launcher's
// forwarded ones; restores the previous handlers afterwards.
class StopSignalHandler {
 public:
  StopSignalHandler() {
    stopSignal = 0;
    signals_ = {SIGINT, SIGTERM, SIGHUP};
    if (dist::isDistEnvSet()) signals_.insert(signals_.end(), {SIGUSR1, SIGUSR2});
    struct sigaction action {};
    action.sa_handler = requestStop;
    sigemptyset(&action.sa_mask);
    for (const int signal : signals_) sigaddset(&action.sa_mask, signal);
    previous_.resize(signals_.size());
    for (size_t i = 0; i < signals_.size(); ++i) sigaction(signals_[i], &action, &previous_[i]);
  }
  ~StopSignalHandler() {
    for (size_t i = 0; i < signals_.size(); ++i) sigaction(signals_[i], &previous_[i], nullptr);
  }
  StopSignalHandler(const StopSignalHandler&) = delete;
  StopSignalHandler& operator=(const StopSignalHandler&) = delete;

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
};

// mpirun stops the whole job as soon as one instance exits with a non-zero
// code, so the instances of an interrupted run leave together, once instance
// 0 has written everything, and ignore the SIGTERM with which mpirun may then
// hurry those still exiting.
int leaveTogether(int code) {
  if (dist::numInstances() > 1) {
    dist::instanceCommunicator()->barrier();
    std::signal(SIGTERM, SIG_IGN);
  }
  return code;
}

std::string signalName(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return fmt::format("signal {}", signal);
  }
}

// A one-line progress bar on a terminal, redrawn at most every 100 ms (a
// step can take a tenth of a millisecond); a line per epoch otherwise, so
// that logs stay readable.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool quiet) : quiet_(quiet), terminal_(isatty(fileno(stderr)) != 0) {}

  void operator()(const TrainProgress& p) {
    if (quiet_) return;
    const bool epochDone = p.stepInEpoch == p.stepsPerEpoch;
    if (!terminal_ && !epochDone) return;
    const auto now = std::chrono::steady_clock::now();
    if (!epochDone && p.stepInEpoch > 1 && now - lastDrawn_ < kRedrawInterval) return;
    lastDrawn_ = now;
    openLine_ = terminal_ && !epochDone;
    constexpr int kWidth = 30;
    const auto filled = static_cast<int>(kWidth * p.stepInEpoch / p.stepsPerEpoch);
    const std::string scaling =
        p.automaticLossScaling ? fmt::format("  scale {:g} ({} skipped)", p.lossScale, p.skippedSteps) : "";
    fmt::print(stderr, "{}epoch {}/{} [{:<{}}] {}/{}  loss {:.4f}{}  {:.0f} samples/s{}",
               terminal_ ? "\r" : "", p.epoch + 1, p.epochs, std::string(static_cast<size_t>(filled), '='),
               kWidth, p.stepInEpoch, p.stepsPerEpoch, p.loss, scaling, p.samplesPerSecond,
               epochDone || !terminal_ ? "\n" : "");
    std::fflush(stderr);
  }

  // Ends a progress line left open by an interruption.
  void endLine() {
    if (openLine_) fmt::print(stderr, "\n");
    openLine_ = false;
  }

 private:
  static constexpr std::chrono::milliseconds kRedrawInterval{100};
  bool quiet_;
  bool terminal_;
  bool openLine_ = false;
  std::chrono::steady_clock::time_point lastDrawn_{};
};

// The command that continues an interrupted run from `checkpoint`: this
// run's config and --set arguments, under the same `tessera launch` when it
// ran under one.
std::string resumeCommand(const TrainArgs& args, const std::string& checkpoint) {
  std::vector<std::string> words;
  for (const std::string& set : args.run.config.overrides)
    words.insert(words.end(), {"--set", shellQuoted(set)});
  const char* launch = std::getenv(kLaunchCommandVar);
  return fmt::format("{}tessera train {} {}{}--resume {}",
                     launch != nullptr && *launch != '\0' ? std::string(launch) + " " : std::string(),
                     shellQuoted(args.run.config.path), fmt::join(words, " "), words.empty() ? "" : " ",
                     shellQuoted(checkpoint));
}

void writeJsonFile(const std::string& path, const nlohmann::json& value) {
  writeOutputFile(path, value.dump(2) + '\n');
}

}  // namespace

Action attachTrain(CLI::App& command) {
  auto args = std::make_shared<TrainArgs>();
  addConfigArgs(command, args->run.config);
  command.add_option("--resume", args->resume,
                     "Continue from this checkpoint: its weights, optimizer state, learning rate and step")
      ->type_name("FILE");
  addSummaryOption(command, args->run, "{steps, losses, finalLoss, testAccuracy, testLoss, ...}");
  command.add_option("--dump-weights", args->weightsPath,
                     "Write the final weights to this file as JSON: {NAME: [values in host order], ...}")
      ->type_name("FILE");
  addAllowNonFiniteFlag(command, args->run, "Resume from");
  command.add_flag("--quiet", args->quiet, "No progress output");
  return [args] {
    // In a multi-instance run (tessera launch) instance 0 reports for all.
    const StartedRun run = startRun(args->run);
    const LoadedRunConfig& loaded = run.loaded;
    const bool reports = run.reports;
    // train() checks the config's outputs; these are the command's own.
    if (reports) {
      checkOutputPath(args->weightsPath, "--dump-weights");
      // The warnings of `tessera validate`, before the run rather than after it.
      for (const ConfigNote& note : configNotes(loaded.config))
        fmt::print(stderr, "warning: {}\n", note.text());
    }
    ProgressPrinter progress(args->quiet || !reports);
    TrainControl control;
    control.resumeFrom = args->resume;
    control.allowNonFinite = args->run.allowNonFinite;
    control.stopRequested = [] { return stopSignal != 0; };
    control.stopReason = [] { return static_cast<int>(stopSignal); };
    control.onWarning = [](const std::string& warning) { fmt::print(stderr, "warning: {}\n", warning); };
    TrainSummary summary;
    {
      const StopSignalHandler handler;
      summary = train(loaded.config, [&](const TrainProgress& p) { progress(p); }, control);
    }
    progress.endLine();
    // Every instance stops for the same reason, so all exit with one code.
    const int interruptedCode = exitCodeForSignal(summary.stopReason > 0 ? summary.stopReason : SIGINT);
    if (!reports) {
      if (summary.diverged) return kExitInvalidInput;
      return summary.interrupted ? leaveTogether(interruptedCode) : kExitOk;
    }
    printRunHeader(summary.notice, summary.dataset);
    if (!args->resume.empty()) fmt::print("resumed: {} at step {}\n", args->resume, summary.firstStep);
    fmt::print("steps: {} (global batch {})\n", summary.steps, summary.globalBatch);
    if (summary.steps > 0) {
      fmt::print("final loss: {:.4f}\n", summary.finalLoss);
    } else {
      // A run resumed at or after its last step: the checkpoint holds no loss to repeat.
      fmt::print("final loss: none, no steps were run (step {} is the run's last)\n", summary.firstStep);
    }
    const ModelConfig& model = loaded.config.model;
    const bool mlp = model.type == kMlpModel;
    const bool evaluated = !summary.interrupted && !summary.diverged;
    if (evaluated && (mlp || (model.type == kOnnxModel && !model.logits.empty()))) {
      fmt::print("test accuracy: {:.4f} ({} samples)\n", summary.testAccuracy, summary.testSamples);
      if (summary.epochTestAccuracies.size() > 1)
        fmt::print("test accuracy per epoch: {:.4f}\n", fmt::join(summary.epochTestAccuracies, " "));
    }
    if (evaluated && !mlp && summary.testSamples > 0) {
      // Another model reports its mean loss on the test set (an onnx model with logits: besides the
      // accuracy).
      fmt::print("test loss: {:.4f} ({} samples)\n", summary.testLoss, summary.testSamples);
      if (summary.epochTestLosses.size() > 1)
        fmt::print("test loss per epoch: {:.4f}\n", fmt::join(summary.epochTestLosses, " "));
    }
    const bool automaticScaling = loaded.config.sessionOptions.automaticLossScalingSettings.enabled;
    if (automaticScaling || summary.lossScale != 1.0) {
      fmt::print(
          "loss scale: {:g}{}\n", summary.lossScale,
          automaticScaling ? fmt::format(" ({} step(s) skipped)", summary.skippedStepIndices.size()) : "");
    }
    fmt::print("throughput: {:.0f} samples/s\n", summary.samplesPerSecond);
    if (!summary.checkpoint.empty())
      fmt::print("checkpoint: {} (step {})\n", summary.checkpoint, summary.checkpointStep);
    if (!loaded.config.output.onnx.empty() && !summary.interrupted)
      fmt::print("onnx model: {} (step {})\n", loaded.config.output.onnx, summary.firstStep + summary.steps);
    if (!args->run.summaryPath.empty()) writeJsonFile(args->run.summaryPath, summaryJson(summary));
    if (!args->weightsPath.empty()) {
      nlohmann::json weights = nlohmann::json::object();
      for (const auto& [name, values] : summary.weights) weights[name] = values;
      writeJsonFile(args->weightsPath, weights);
    }
    if (summary.diverged) {
      throw DeviceError(ErrorCode::TrainingDiverged, fmt::format("step {}", summary.divergedStep),
                        fmt::format("the training loss is {}; training diverged and stopped{} (lower "
                                    "/optimizer/learningRate, or enable loss scaling for float16)",
                                    summary.finalLoss,
                                    summary.checkpoint.empty()
                                        ? std::string()
                                        : fmt::format("; the checkpoint {} of step {} is the last finite one",
                                                      summary.checkpoint, summary.checkpointStep)));
    }
    if (!summary.interrupted) return kExitOk;
    const int64_t step = summary.firstStep + summary.steps;
    const std::string by = signalName(summary.stopReason > 0 ? summary.stopReason : SIGINT);
    if (summary.checkpoint.empty()) {
      fmt::print(stderr,
                 "interrupted after step {} by {}; no checkpoint is configured, so the progress is lost (set "
                 "/output/checkpoint to keep it, e.g. --set /output/checkpoint=model.safetensors, and "
                 "/output/checkpointEvery to write it every N steps as well)\n",
                 step, by);
    } else {
      fmt::print(stderr,
                 "interrupted after step {} by {}; checkpoint written to {}; continue with: {}\n", step, by,
                 summary.checkpoint, resumeCommand(*args, summary.checkpoint));
    }
    return leaveTogether(interruptedCode);
  };
}

}  // namespace tessera::cli
