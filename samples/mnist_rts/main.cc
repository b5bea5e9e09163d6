// MNIST with replication and replicated tensor sharding, written against the
// explicit API the way a PopXL user writes it by hand:
//
//  - W0 is a replica-sharded variable, all-gathered before use;
//  - W1 lives in a remote buffer as a remote replica-sharded variable: it is
//    loaded, all-gathered, and stored back after its update;
//  - gradients are averaged over the replicas and sliced to each replica's
//    shard with replicaShardedSlice; updates are scaledAddInplace on shards.
//
// Without --rts (or with one replica) every weight is a plain replicated
// variable. The same global batch (batch size x replication factor) gives
// the same training whatever the replication factor.
//
//   mnist_rts --replication-factor 2 --batch-size 4 --rts
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "program.hpp"
#include "tessera/app/dataset.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/app/output_check.hpp"
#include "tessera/sessions/session.hpp"

namespace {

using namespace mnist_rts;

int run(const Options& opts) {
  DataConfig dataConfig;
  const auto kind = enumFromString<DatasetKind>(opts.dataset);
  if (!kind || *kind == DatasetKind::Tensors) {
    const auto folded = enumFromFoldedString<DatasetKind>(opts.dataset);
    throw ConfigError(ErrorCode::InvalidEnumValue, "--dataset",
                      fmt::format("\"{}\"; expected FashionMnist, Mnist or Synthetic{}", opts.dataset,
                                  folded && *folded != DatasetKind::Tensors
                                      ? fmt::format(" (did you mean \"{}\"?)", toString(*folded))
                                      : std::string()));
  }
  dataConfig.dataset = *kind;
  dataConfig.path = opts.dataPath;
  dataConfig.limitTrainSamples = opts.limitTrainSamples;
  dataConfig.limitTestSamples = opts.limitTestSamples;
  dataConfig.seed = opts.seed;
  const Dataset data = loadDataset(dataConfig);
  if (!data.notice.empty()) fmt::print(stderr, "note: {}\n", data.notice);

  const InitialWeights init = initialWeights(opts.seed);
  TrainProgram train = buildTrainProgram(opts, init);
  const std::string lossName = train.loss.name();
  InferenceSession trainSession(std::move(train.graph), {lossName}, sessionOptions(opts), makeSimDevice());

  const int64_t globalBatch = opts.batchSize * opts.replicationFactor;
  const int64_t steps = data.train.count / globalBatch;
  std::vector<int64_t> order(static_cast<size_t>(data.train.count));
  std::vector<float> images(static_cast<size_t>(globalBatch * kPixels));
  std::vector<int32_t> labels(static_cast<size_t>(globalBatch));
  double loss = 0.0;
  for (int64_t epoch = 0; epoch < opts.epochs; ++epoch) {
    fillEpochOrder(order, opts.seed, epoch, true);
    for (int64_t step = 0; step < steps; ++step) {
      fillBatch(data.train, order, step * globalBatch, images, labels);
      trainSession.run({StepInput("x", images), StepInput("labels", labels)});
      double sum = 0.0;
      for (float v : trainSession.output(lossName).data) sum += v;
      loss = sum / static_cast<double>(opts.replicationFactor);
    }
    fmt::print("epoch {}/{}: loss {:.4f}\n", epoch + 1, opts.epochs, loss);
  }

  // Test with the trained weights, reassembled from their shards on the host.
  TestProgram test = buildTestProgram(opts, init);
  const std::string predictions = test.predictions.name();
  InferenceSession testSession(std::move(test.graph), {predictions}, sessionOptions(opts), makeSimDevice());
  testSession.writeWeights(trainSession.readWeights());
  const int64_t testGlobal = opts.testBatchSize * opts.replicationFactor;
  std::vector<int64_t> testOrder(static_cast<size_t>(data.test.count));
  fillEpochOrder(testOrder, opts.seed, 0, false);
  std::vector<float> testImages(static_cast<size_t>(testGlobal * kPixels));
  std::vector<int32_t> testLabels(static_cast<size_t>(testGlobal));
  int64_t correct = 0;
  int64_t seen = 0;
  // Every test sample counts: a last step with fewer samples than a test
  // step is filled up with the first samples again, which are not counted
  // twice (so a test set smaller than one step is still tested).
  std::vector<int64_t> window(static_cast<size_t>(testGlobal));
  for (int64_t first = 0; first < data.test.count; first += testGlobal) {
    for (int64_t i = 0; i < testGlobal; ++i)
      window[static_cast<size_t>(i)] = testOrder[static_cast<size_t>((first + i) % data.test.count)];
    fillBatch(data.test, window, 0, testImages, testLabels);
    testSession.run({StepInput("x", testImages)});
    const std::vector<float>& out = testSession.output(predictions).data;
    const int64_t real = std::min(testGlobal, data.test.count - first);
    for (int64_t i = 0; i < real; ++i) {
      correct += static_cast<int32_t>(out[static_cast<size_t>(i)]) == testLabels[static_cast<size_t>(i)];
    }
    seen += real;
  }
  if (seen == 0) {
    throw ConfigError(ErrorCode::InvalidData, "--limit-test-samples", "the test set is empty: nothing to test");
  }
  const double accuracy = static_cast<double>(correct) / static_cast<double>(seen);
  // With one replica there is nothing to shard: --rts changes nothing.
  const char* rts = !opts.rts ? "off" : opts.replicationFactor > 1 ? "on" : "on, not applied with one replica";
  fmt::print("test accuracy: {:.4f} ({} samples, replication factor {}, rts {})\n", accuracy, seen,
             opts.replicationFactor, rts);
  if (!opts.summaryPath.empty()) {
    writeOutputFile(
        opts.summaryPath,
        nlohmann::json{{"testAccuracy", accuracy}, {"finalLoss", loss}, {"steps", steps * opts.epochs}}.dump(
            2) +
            '\n');
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opts;
  CLI::App app{"MNIST with replication and replicated tensor sharding on the simulated device", "mnist_rts"};
  app.add_option("--replication-factor", opts.replicationFactor, "Number of replicas")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", opts.batchSize, "Samples per replica per step")->check(CLI::PositiveNumber);
  app.add_option("--test-batch-size", opts.testBatchSize, "Test samples per replica per step")
      ->check(CLI::PositiveNumber);
  app.add_option("--epochs", opts.epochs, "Passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--lr", opts.lr, "Learning rate")->check(CLI::PositiveNumber);
  app.add_flag("--rts", opts.rts, "Shard W0 and W1 over the replicas");
  app.add_option("--dataset", opts.dataset, "FashionMnist, Mnist or Synthetic");
  app.add_option("--data-path", opts.dataPath, "Folder of the IDX files");
  app.add_option("--limit-train-samples", opts.limitTrainSamples, "Use only the first N training samples");
  app.add_option("--limit-test-samples", opts.limitTestSamples, "Use only the first N test samples");
  app.add_option("--seed", opts.seed, "Initialisation and shuffling seed");
  app.add_option("--json-summary", opts.summaryPath, "Write {testAccuracy, finalLoss, steps} to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return run(opts);
  } catch (const tessera::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
