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

#include "tessera/device.hpp"
#include "tessera/run_config.hpp"

namespace tessera {

struct TrainProgress {
  int64_t epoch = 0;          // 0-based
  int64_t epochs = 0;
  int64_t stepInEpoch = 0;    // steps done in this epoch
  int64_t stepsPerEpoch = 0;
  double loss = 0.0;          // of the last step, mean over the global batch
  double samplesPerSecond = 0.0;
};

struct TrainSummary {
  int64_t steps = 0;
  std::vector<double> losses;  // per step, mean over the global batch
  double finalLoss = 0.0;
  double testAccuracy = 0.0;
  double samplesPerSecond = 0.0;  // training samples per second of wall time
  // Samples per weight update: batchSize x replicas x accumulationFactor.
  int64_t globalBatch = 0;
  int64_t trainSamples = 0;
  int64_t testSamples = 0;
  std::string dataset;  // what was loaded
  std::string notice;   // e.g. the synthetic fallback; empty when nothing to say
  MemoryReport memory;
  // Final weights by name in host shape (for comparisons and checkpoints).
  std::vector<std::pair<std::string, std::vector<float>>> weights;
};

// Validates the config, loads the data, builds and compiles the model, trains
// for data.epochs epochs and evaluates the test accuracy. `onStep` is called
// after every step. Throws the tessera errors of the pieces it uses;
// ConfigError(InvalidData) when a global batch is larger than the training
// set, with the equation.
TrainSummary train(const RunConfig& config, const std::function<void(const TrainProgress&)>& onStep = {});

// {"steps", "losses", "finalLoss", "testAccuracy", "samplesPerSecond",
//  "globalBatch", "trainSamples", "testSamples", "dataset"}
nlohmann::json summaryJson(const TrainSummary& summary);

}  // namespace tessera
