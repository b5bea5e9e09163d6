#include "tessera/trainer.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tessera/dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/mlp.hpp"
#include "tessera/optimizer.hpp"
#include "tessera/session.hpp"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

void checkInputWidth(const ModelConfig& model, const DatasetSplit& split) {
  if (model.layers.front() != split.sampleElements()) {
    throw ConfigError(ErrorCode::InvalidModel, "/model/layers/0",
                      fmt::format("the model takes {} inputs but the dataset's samples have {} ({} x {}); set "
                                  "/model/layers/0 to {}",
                                  model.layers.front(), split.sampleElements(), split.rows, split.cols,
                                  split.sampleElements()));
  }
}

// Test accuracy with the weights of `session`, batch after batch; the last
// batch is padded with sample 0 and its padding ignored.
double evaluate(const RunConfig& config, const TrainingSession& training, const DatasetSplit& test) {
  if (test.count == 0) return 0.0;
  SessionOptions options = config.sessionOptions;
  options.enableGradientAccumulation = false;
  options.accumulationFactor = 1;
  const int64_t replicas = options.getLocalReplicationFactor();
  const int64_t batch = config.data.testBatchSize;
  MlpGraph mlp = buildMlp(config.model, batch, options.getGlobalReplicationFactor(), config.data.seed, &options);
  const std::string predictions = mlp.graph.tensor(mlp.predictions).name;
  const std::string input = mlp.graph.tensor(mlp.input).name;
  const std::string labels = mlp.graph.tensor(mlp.labels).name;
  InferenceSession inference(std::move(mlp.graph), {predictions}, options, makeSimDevice(config.device));
  inference.writeWeights(training.readWeights());

  const int64_t perStep = batch * replicas;
  std::vector<int64_t> order(static_cast<size_t>(perStep));
  std::vector<float> images(static_cast<size_t>(perStep * test.sampleElements()));
  std::vector<int32_t> labelData(static_cast<size_t>(perStep));
  int64_t correct = 0;
  for (int64_t first = 0; first < test.count; first += perStep) {
    const int64_t real = std::min(perStep, test.count - first);
    for (int64_t i = 0; i < perStep; ++i) order[static_cast<size_t>(i)] = i < real ? first + i : 0;
    fillBatch(test, order, 0, images, labelData);
    inference.run({StepInput(input, images), StepInput(labels, labelData)});
    const HostTensor& out = inference.output(predictions);
    for (int64_t i = 0; i < real; ++i) {
      if (static_cast<int32_t>(out.data[static_cast<size_t>(i)]) == labelData[static_cast<size_t>(i)]) ++correct;
    }
  }
  return static_cast<double>(correct) / static_cast<double>(test.count);
}

}  // namespace

TrainSummary train(const RunConfig& config, const std::function<void(const TrainProgress&)>& onStep) {
  validate(config);
  const SessionOptions& options = config.sessionOptions;
  const Dataset data = loadDataset(config.data);
  checkInputWidth(config.model, data.train);

  const int64_t replicas = options.getLocalReplicationFactor();
  const int64_t af = options.getAccumulationFactor();
  const int64_t batch = config.data.batchSize;
  const int64_t globalBatch = batch * options.getGlobalReplicationFactor() * af;
  const int64_t stepsPerEpoch = data.train.count / globalBatch;
  if (stepsPerEpoch == 0) {
    throw ConfigError(ErrorCode::InvalidData, "/data/batchSize",
                      fmt::format("a global batch of batchSize {} x replicas {} x accumulationFactor {} = {} samples "
                                  "is larger than the {} training samples",
                                  batch, options.getGlobalReplicationFactor(), af, globalBatch, data.train.count));
  }

  MlpGraph mlp = buildMlp(config.model, batch, options.getGlobalReplicationFactor(), config.data.seed, &options);
  const std::string input = mlp.graph.tensor(mlp.input).name;
  const std::string labels = mlp.graph.tensor(mlp.labels).name;
  TrainingSession session(std::move(mlp.graph), mlp.loss, makeOptimizer(config.optimizer), options,
                          makeSimDevice(config.device));

  TrainSummary summary;
  summary.globalBatch = globalBatch;
  summary.trainSamples = data.train.count;
  summary.testSamples = data.test.count;
  summary.dataset = data.source;
  summary.notice = data.notice;
  summary.losses.reserve(static_cast<size_t>(stepsPerEpoch * config.data.epochs));

  // Host order [micro-batch, replica, sample]: consecutive samples of the
  // global batch fill replica 0's micro-batch first, so the global batch is
  // the same whatever the replica count.
  const int64_t stepSamples = batch * replicas * af;
  std::vector<int64_t> order(static_cast<size_t>(data.train.count));
  std::vector<float> images(static_cast<size_t>(stepSamples * data.train.sampleElements()));
  std::vector<int32_t> labelData(static_cast<size_t>(stepSamples));
  double trainSeconds = 0.0;
  for (int64_t epoch = 0; epoch < config.data.epochs; ++epoch) {
    fillEpochOrder(order, config.data.seed, epoch, config.data.shuffle);
    for (int64_t step = 0; step < stepsPerEpoch; ++step) {
      const auto start = Clock::now();
      fillBatch(data.train, order, step * stepSamples, images, labelData);
      session.run({StepInput(input, images), StepInput(labels, labelData)});
      trainSeconds += std::chrono::duration<double>(Clock::now() - start).count();
      summary.losses.push_back(session.meanLoss());
      ++summary.steps;
      if (onStep) {
        TrainProgress progress;
        progress.epoch = epoch;
        progress.epochs = config.data.epochs;
        progress.stepInEpoch = step + 1;
        progress.stepsPerEpoch = stepsPerEpoch;
        progress.loss = session.meanLoss();
        progress.samplesPerSecond =
            trainSeconds > 0 ? static_cast<double>(summary.steps * stepSamples) / trainSeconds : 0.0;
        onStep(progress);
      }
    }
  }
  summary.finalLoss = summary.losses.empty() ? 0.0 : summary.losses.back();
  summary.samplesPerSecond = trainSeconds > 0 ? static_cast<double>(summary.steps * stepSamples) / trainSeconds : 0.0;
  summary.testAccuracy = evaluate(config, session, data.test);
  summary.memory = session.memory();
  for (auto& [name, value] : session.readWeights()) summary.weights.emplace_back(name, std::move(value.data));
  return summary;
}

nlohmann::json summaryJson(const TrainSummary& summary) {
  return nlohmann::json{{"steps", summary.steps},
                        {"losses", summary.losses},
                        {"finalLoss", summary.finalLoss},
                        {"testAccuracy", summary.testAccuracy},
                        {"samplesPerSecond", summary.samplesPerSecond},
                        {"globalBatch", summary.globalBatch},
                        {"trainSamples", summary.trainSamples},
                        {"testSamples", summary.testSamples},
                        {"dataset", summary.dataset}};
}

}  // namespace tessera
