// Training a run config end to end: the model of its "model" section on the
// data of its "data" section, with its optimizer and SessionOptions, on a
// simulated device built from its "device" section. `tessera train` is a thin
// wrapper around train(); applications may call it directly.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tessera/simdevice/device.hpp"
#include "tessera/app/run_config.hpp"

namespace tessera {

struct TrainProgress {
  int64_t epoch = 0;  // 0-based
  int64_t epochs = 0;
  int64_t stepInEpoch = 0;  // steps done in this epoch
  int64_t stepsPerEpoch = 0;
  double loss = 0.0;  // of the last step, mean over the global batch
  double samplesPerSecond = 0.0;
  // Automatic loss scaling is on: the scale the next step uses, and the
  // steps skipped so far in this run (an overflowed gradient).
  bool automaticLossScaling = false;
  double lossScale = 1.0;
  int64_t skippedSteps = 0;
};

struct TrainSummary {
  int64_t steps = 0;
  std::vector<double> losses;  // per step, mean over the global batch
  double finalLoss = 0.0;
  // The mlp model's accuracy on the test set (0 for other models).
  double testAccuracy = 0.0;
  // Test accuracy after each epoch this run completed, in order (the last is
  // testAccuracy).
  std::vector<double> epochTestAccuracies;
  // Models without an accuracy (onnx): the mean loss over the test set's
  // whole global batches of testBatchSize x replicas samples (0 without a
  // test set or for the mlp model).
  double testLoss = 0.0;
  // Test loss after each epoch this run completed, in order.
  std::vector<double> epochTestLosses;
  double samplesPerSecond = 0.0;  // training samples per second of wall time
  // Wall time from the call until the first step starts: reading the config,
  // building and planning the model, loading the data, compiling the session
  // and making the initial values (the first step's own time excluded).
  double setupSeconds = 0.0;
  // Samples per weight update: batchSize x replicas x accumulationFactor.
  int64_t globalBatch = 0;
  // Samples per test step over every replica (0 without a test set): the mlp
  // model's test batch is testBatchSize per replica, at most the test set's
  // share of a replica (see DataConfig::testBatchSize).
  int64_t testGlobalBatch = 0;
  int64_t trainSamples = 0;
  int64_t testSamples = 0;
  std::string dataset;  // what was loaded
  std::string notice;   // e.g. the synthetic fallback; empty when nothing to say
  MemoryReport memory;
  // Final weights by name in host shape (for comparisons and checkpoints).
  std::vector<std::pair<std::string, std::vector<float>>> weights;
  // The step training resumed from (0 when it started from scratch); steps
  // and losses count the steps run after it.
  int64_t firstStep = 0;
  // Stopped by TrainControl::stopRequested before the last step; the test
  // accuracy is then not evaluated (0).
  bool interrupted = false;
  // When interrupted: TrainControl::stopReason's answer (1 without one); with
  // several instances, the largest of the instances that asked to stop.
  int stopReason = 0;
  // The checkpoint written last and the step it holds (empty: none written).
  std::string checkpoint;
  int64_t checkpointStep = 0;
  // Loss scaling: the scale at the end (the optimizer's lossScaling unless
  // automatic loss scaling changed it), and the steps of this run whose
  // update automatic loss scaling skipped, by absolute 0-based step index.
  double lossScale = 1.0;
  std::vector<int64_t> skippedStepIndices;
  // The loss of a step was NaN or infinite: training stopped after that step
  // (absolute 0-based index divergedStep), without evaluating the test set or
  // writing a checkpoint of the non-finite weights (an earlier one stays).
  bool diverged = false;
  int64_t divergedStep = 0;
};

// How a run starts and stops besides what its config says.
struct TrainControl {
  // A checkpoint (see checkpoint.hpp) to resume from: its weights, optimizer
  // state, learning rate and step are restored and training goes on from that
  // step of the same data order. Empty: start from the initial weights.
  std::string resumeFrom;
  // Polled before every step; when it returns true, training stops there,
  // writes output.checkpoint when one is configured, and returns with
  // TrainSummary::interrupted set. Applications set it from a signal handler's
  // flag (tessera train does for SIGINT, SIGTERM and SIGHUP).
  std::function<bool()> stopRequested;
  // Why stopRequested() returns true, as a positive number (tessera train
  // gives the signal's number), for TrainSummary::stopReason. Optional.
  std::function<int()> stopReason;
  // Called with what resuming could not restore exactly but does not stop
  // training: session options, optimizer hyper-parameters or data settings
  // that differ from the checkpoint's run.
  std::function<void(const std::string&)> onWarning;
  // Resume from a checkpoint holding NaN or infinite values (refused with
  // IoError(NonFiniteCheckpoint) otherwise).
  bool allowNonFinite = false;
};

// Validates the config, loads the data, builds and compiles the model, trains
// for data.epochs epochs and evaluates the test accuracy. `onStep` is called
// after every step. With output.checkpoint set, the checkpoint is written
// every output.checkpointEvery steps (when > 0), at the end, and when
// `control` stops the run; it records the run config as extra metadata
// "runConfig" and the global batch as "globalBatch", which resuming compares.
// Throws the tessera errors of the pieces it uses; ConfigError(InvalidData)
// when a global batch is larger than the training set, with the equation;
// IoError(OutputUnwritable) before the data is loaded when a path of the
// output section cannot be created (see checkOutputPath()); IoError for a
// checkpoint that cannot be read or that does not fit the model (see
// loadCheckpoint()). A checkpoint that cannot be written (a full disk) is
// written once more under its file name in the working directory, and the
// IoError(FileUnwritable) then says where it went, or that it went nowhere.
TrainSummary train(const RunConfig& config, const std::function<void(const TrainProgress&)>& onStep = {},
                   const TrainControl& control = {});

// What evaluate() reports: the test set of a run config with a checkpoint's
// weights or the initial ones, without training.
struct EvaluateSummary {
  // The model has predictions (the mlp model, an onnx model with
  // /model/logits): the accuracy over every test sample.
  bool hasAccuracy = false;
  double testAccuracy = 0.0;
  // Other models, and onnx models with logits besides: the mean loss over
  // the test set's whole global batches (testGlobalBatch samples each).
  bool hasLoss = false;
  double testLoss = 0.0;
  int64_t testSamples = 0;
  int64_t testGlobalBatch = 0;
  std::string dataset;  // what was loaded
  std::string notice;   // e.g. the synthetic fallback; empty when nothing to say
  // The checkpoint evaluated and its step (empty: the initial weights).
  std::string checkpoint;
  int64_t checkpointStep = 0;
};

struct EvaluateControl {
  // A checkpoint whose weights (and BatchNormalization statistics) are
  // evaluated; empty: the model's initial weights (its seed's, or an ONNX
  // model's initializers).
  std::string checkpoint;
  // Evaluate a checkpoint holding NaN or infinite values (refused with
  // IoError(NonFiniteCheckpoint) otherwise).
  bool allowNonFinite = false;
  // Called with what the checkpoint could not restore exactly (see
  // TrainControl::onWarning).
  std::function<void(const std::string&)> onWarning;
};

// The test set of `config` as train() evaluates it at the end of a run, with
// the weights of control.checkpoint (or the initial weights), on the config's
// replicas and instances; no weight is updated. The numbers are those train()
// reports for the same weights, whatever the replica count. Throws what
// train() throws for the config, the data and the checkpoint;
// ConfigError(InvalidData) naming /data/limitTestSamples when the run has no
// test set.
EvaluateSummary evaluate(const RunConfig& config, const EvaluateControl& control = {});

// {"testAccuracy" (or null), "testLoss" (or null), "testSamples", "testGlobalBatch", "dataset",
//  "checkpoint" (or null), "checkpointStep"}
nlohmann::json summaryJson(const EvaluateSummary& summary);

// {"steps", "losses", "finalLoss", "testAccuracy", "epochTestAccuracies", "testLoss",
//  "epochTestLosses", "samplesPerSecond", "globalBatch", "trainSamples", "testSamples", "dataset",
//  "firstStep", "interrupted", "stopReason", "checkpoint", "checkpointStep", "lossScale", "skippedSteps"
//  (how many), "skippedStepIndices"}
nlohmann::json summaryJson(const TrainSummary& summary);

}  // namespace tessera
