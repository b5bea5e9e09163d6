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
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/autodiff.hpp"
#include "tessera/dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/mlp.hpp"
#include "tessera/ops.hpp"
#include "tessera/session.hpp"

namespace {

using namespace tessera;

struct Options {
  int64_t replicationFactor = 1;
  int64_t batchSize = 8;
  int64_t testBatchSize = 80;
  int64_t epochs = 1;
  double lr = 0.05;
  bool rts = false;
  std::string dataset = "fashion-mnist";
  std::string dataPath;
  int64_t limitTrainSamples = 0;
  int64_t limitTestSamples = 0;
  int64_t seed = 0;
  std::string summaryPath;
};

constexpr int64_t kHidden = 32;
constexpr int64_t kPixels = 28 * 28;
constexpr int64_t kClasses = 10;

// A trainable weight: the variable the host reads, the shard the program
// updates (when sharded), the full tensor the model uses, and the remote
// buffer it lives in (when it has one).
struct Trainable {
  Tensor var;
  std::optional<Tensor> shards;
  Tensor full;
  std::optional<RemoteBuffer> remoteBuffer;
};

struct InitialWeights {
  std::vector<float> w0, b0, w1, b1;
};

InitialWeights initialWeights(int64_t seed) {
  return {normalSamples(kPixels * kHidden, static_cast<uint64_t>(seed) * 2 + 1, std::sqrt(2.0 / kPixels)),
          std::vector<float>(kHidden, 0.0f),
          normalSamples(kHidden * kClasses, static_cast<uint64_t>(seed) * 2 + 2, std::sqrt(2.0 / kHidden)),
          std::vector<float>(kClasses, 0.0f)};
}

Tensor forward(Tensor x, const Trainable& w0, const Trainable& b0, const Trainable& w1, const Trainable& b1) {
  const int64_t batch = x.shape().front();
  Tensor h = ops::reshape(x, {batch, kPixels});
  h = ops::gelu(ops::add(ops::matmul(h, w0.full), b0.full));
  return ops::add(ops::matmul(h, w1.full), b1.full);
}

Trainable plain(Graph& g, const std::string& name, std::vector<float> data, Shape shape) {
  Tensor v = ops::variable(g, name, std::move(data), std::move(shape));
  return {v, std::nullopt, v, std::nullopt};
}

struct TrainProgram {
  Graph graph;
  Tensor loss;
};

TrainProgram buildTrainProgram(const Options& opts, const InitialWeights& init) {
  TrainProgram program{Graph(opts.replicationFactor), {}};
  Graph& g = program.graph;
  const bool rts = opts.rts && opts.replicationFactor > 1;
  InSequence sequence(g);

  Tensor x = ops::input(g, "x", {opts.batchSize, 28, 28});
  Tensor labels = ops::input(g, "labels", {opts.batchSize}, DType::Int32);

  Trainable w0;
  if (rts) {
    const ShardedVariable sharded = ops::replicaShardedVariable(g, "W0", init.w0, {kPixels, kHidden});
    w0 = {sharded.variable, sharded.shard, ops::replicatedAllGather(sharded.shard), std::nullopt};
  } else {
    w0 = plain(g, "W0", init.w0, {kPixels, kHidden});
  }
  Trainable b0 = plain(g, "b0", init.b0, {kHidden});

  Trainable w1;
  if (rts) {
    const int64_t shardElements = (kHidden * kClasses + opts.replicationFactor - 1) / opts.replicationFactor;
    const RemoteBuffer buffer = ops::remoteBuffer(g, {shardElements}, DType::Float32, 1);
    Tensor remote = ops::remoteReplicaShardedVariable(g, "W1", init.w1, {kHidden, kClasses}, buffer, 0);
    Tensor shards = ops::remoteLoad(g, buffer, 0);
    w1 = {remote, shards, ops::replicatedAllGather(shards), buffer};
  } else {
    w1 = plain(g, "W1", init.w1, {kHidden, kClasses});
  }
  Trainable b1 = plain(g, "b1", init.b1, {kClasses});

  Tensor logits = forward(x, w0, b0, w1, b1);
  program.loss = ops::softmaxCrossEntropy(logits, labels, ReductionType::Mean);

  // Gradients of the full tensors, averaged over the replicas so that every
  // replication factor trains on the same global batch.
  const std::vector<Trainable*> params{&w0, &b0, &w1, &b1};
  std::vector<Tensor> wrt;
  for (const Trainable* p : params) wrt.push_back(p->full);
  std::vector<Tensor> grads = autodiff(g, program.loss, wrt);
  for (size_t i = 0; i < params.size(); ++i) {
    if (opts.replicationFactor > 1) grads[i] = ops::replicatedAllReduce(grads[i], ReductionType::Mean);
    if (params[i]->shards) grads[i] = ops::replicaShardedSlice(grads[i]);
  }

  // W += -lr * grad, on the shard when sharded; a remote shard goes back to
  // its buffer after the update.
  for (size_t i = 0; i < params.size(); ++i) {
    Trainable& p = *params[i];
    if (p.shards) {
      ops::scaledAddInplace(*p.shards, grads[i], 1.0, -opts.lr);
      if (p.remoteBuffer) ops::remoteStore(g, *p.remoteBuffer, 0, *p.shards);
    } else {
      ops::scaledAddInplace(p.var, grads[i], 1.0, -opts.lr);
    }
  }
  return program;
}

struct TestProgram {
  Graph graph;
  Tensor predictions;
};

TestProgram buildTestProgram(const Options& opts, const InitialWeights& init) {
  TestProgram program{Graph(opts.replicationFactor), {}};
  Graph& g = program.graph;
  Tensor x = ops::input(g, "x", {opts.testBatchSize, 28, 28});
  const Trainable w0 = plain(g, "W0", init.w0, {kPixels, kHidden});
  const Trainable b0 = plain(g, "b0", init.b0, {kHidden});
  const Trainable w1 = plain(g, "W1", init.w1, {kHidden, kClasses});
  const Trainable b1 = plain(g, "b1", init.b1, {kClasses});
  program.predictions = ops::argmax(forward(x, w0, b0, w1, b1));
  return program;
}

SessionOptions sessionOptions(const Options& opts) {
  SessionOptions options;
  options.enableReplicatedGraphs = opts.replicationFactor > 1;
  options.replicatedGraphCount = opts.replicationFactor;
  return options;
}

int run(const Options& opts) {
  DataConfig dataConfig;
  const auto kind = enumFromString<DatasetKind>(opts.dataset);
  if (!kind) {
    throw ConfigError(ErrorCode::InvalidEnumValue, "--dataset",
                      fmt::format("\"{}\"; expected fashion-mnist, mnist or synthetic", opts.dataset));
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
  for (int64_t first = 0; first + testGlobal <= data.test.count; first += testGlobal) {
    fillBatch(data.test, testOrder, first, testImages, testLabels);
    testSession.run({StepInput("x", testImages)});
    const std::vector<float>& out = testSession.output(predictions).data;
    for (int64_t i = 0; i < testGlobal; ++i) {
      correct += static_cast<int32_t>(out[static_cast<size_t>(i)]) == testLabels[static_cast<size_t>(i)];
    }
    seen += testGlobal;
  }
  const double accuracy = seen > 0 ? static_cast<double>(correct) / static_cast<double>(seen) : 0.0;
  fmt::print("test accuracy: {:.4f} ({} samples, replication factor {}, rts {})\n", accuracy, seen,
             opts.replicationFactor, opts.rts ? "on" : "off");
  if (!opts.summaryPath.empty()) {
    std::ofstream out(opts.summaryPath);
    out << nlohmann::json{{"testAccuracy", accuracy}, {"finalLoss", loss}, {"steps", steps * opts.epochs}}.dump(2)
        << '\n';
    if (!out) throw IoError(ErrorCode::FileUnwritable, opts.summaryPath, "cannot write the summary");
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
  app.add_option("--dataset", opts.dataset, "fashion-mnist, mnist or synthetic");
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
