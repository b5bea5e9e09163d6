#include "tessera/sessions/session.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "support/toy_data.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/placement.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

// A fixed, learnable toy problem: 16 samples of 12 features, 4 classes.
using test::ToyData;

ToyData toyData(int64_t samples, int64_t features) { return test::toyData(samples, features, 99); }

ModelConfig toyModel() {
  ModelConfig model;
  model.layers = {12, 8, 4};
  return model;
}

OptimizerConfig sgdMomentum() {
  OptimizerConfig config;
  config.type = OptimizerType::Sgd;
  config.sgd.learningRate = 0.1;
  config.sgd.momentum = 0.9;
  return config;
}

SessionOptions replicated(int64_t replicas, int64_t accumulation = 1) {
  SessionOptions options;
  options.enableReplicatedGraphs = replicas > 1;
  options.replicatedGraphCount = replicas;
  options.enableGradientAccumulation = accumulation > 1;
  options.accumulationFactor = accumulation;
  options.accumulationAndReplicationReductionType = ReductionType::Mean;
  return options;
}

struct RunResult {
  std::vector<double> losses;
  std::vector<std::pair<std::string, HostTensor>> weights;
};

// Trains the toy MLP for `steps` steps on the same 8 samples per step,
// whatever the split into replicas and micro-batches.
RunResult trainToy(int64_t replicas, int64_t accumulation, int64_t batch, int steps,
                   ExecutionMode mode = ExecutionMode::Vectorized,
                   MeanReductionStrategy strategy = MeanReductionStrategy::Post) {
  const ToyData data = toyData(8 * steps, 12);
  MlpGraph mlp = buildMlp(toyModel(), batch, replicas, 3);
  SessionOptions options = replicated(replicas, accumulation);
  options.meanAccumulationAndReplicationReductionStrategy = strategy;
  TrainingSession session(std::move(mlp.graph), mlp.loss, makeOptimizer(sgdMomentum()), options,
                          makeSimDevice({}, mode));
  RunResult result;
  for (int s = 0; s < steps; ++s) {
    const std::span<const float> images(data.images.data() + s * 8 * 12, 8 * 12);
    const std::span<const int32_t> labels(data.labels.data() + s * 8, 8);
    session.run({StepInput("input", images), StepInput("labels", labels)});
    result.losses.push_back(session.meanLoss());
  }
  result.weights = session.readWeights();
  return result;
}

void checkClose(const RunResult& a, const RunResult& b, double tolerance) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    INFO("step " << i);
    CHECK(a.losses[i] == doctest::Approx(b.losses[i]).epsilon(tolerance));
  }
  REQUIRE(a.weights.size() == b.weights.size());
  for (size_t w = 0; w < a.weights.size(); ++w) {
    INFO(a.weights[w].first);
    CHECK(a.weights[w].first == b.weights[w].first);
    CHECK(a.weights[w].second.shape == b.weights[w].second.shape);
    double worst = 0;
    for (size_t i = 0; i < a.weights[w].second.data.size(); ++i) {
      const double x = a.weights[w].second.data[i];
      const double y = b.weights[w].second.data[i];
      worst = std::max(worst, std::abs(x - y) / std::max(1.0, std::abs(y)));
    }
    CHECK(worst <= tolerance);
  }
}

}  // namespace

TEST_CASE("replicas and accumulation give the run of one replica with the whole batch") {
  const RunResult reference = trainToy(1, 1, 8, 5);
  SUBCASE("R = 2 x batch 4") { checkClose(trainToy(2, 1, 4, 5), reference, 1e-5); }
  SUBCASE("R = 4 x batch 2") { checkClose(trainToy(4, 1, 2, 5), reference, 1e-5); }
  SUBCASE("accumulation 2 x R = 2 x batch 2, Post") { checkClose(trainToy(2, 2, 2, 5), reference, 1e-5); }
  SUBCASE("accumulation 2 x R = 2 x batch 2, Running") {
    checkClose(trainToy(2, 2, 2, 5, ExecutionMode::Vectorized, MeanReductionStrategy::Running), reference,
               1e-5);
  }
  // The loss goes down on this learnable problem.
  CHECK(reference.losses.back() < reference.losses.front());
}

TEST_CASE("vectorized and per-replica reference execution agree") {
  checkClose(trainToy(4, 1, 2, 4, ExecutionMode::Vectorized),
             trainToy(4, 1, 2, 4, ExecutionMode::PerReplicaReference), 1e-6);
  checkClose(trainToy(2, 2, 2, 3, ExecutionMode::Vectorized),
             trainToy(2, 2, 2, 3, ExecutionMode::PerReplicaReference), 1e-6);
}

TEST_CASE("host input shapes follow [accumulationFactor, localReplicas, ...] with size-1 dims omitted") {
  const auto shapeFor = [](int64_t replicas, int64_t accumulation) {
    MlpGraph mlp = buildMlp(toyModel(), 4, replicas, 0);
    TrainingSession session(std::move(mlp.graph), mlp.loss, makeOptimizer(sgdMomentum()),
                            replicated(replicas, accumulation), makeSimDevice());
    return std::pair{session.inputHostShape("input"), session.inputHostShape("labels")};
  };
  CHECK(shapeFor(1, 1) == std::pair{Shape{4, 12}, Shape{4}});
  CHECK(shapeFor(2, 1) == std::pair{Shape{2, 4, 12}, Shape{2, 4}});
  CHECK(shapeFor(1, 3) == std::pair{Shape{3, 4, 12}, Shape{3, 4}});
  CHECK(shapeFor(2, 3) == std::pair{Shape{3, 2, 4, 12}, Shape{3, 2, 4}});
}

TEST_CASE("wrong host data names the stream, the expected shape and its derivation") {
  MlpGraph mlp = buildMlp(toyModel(), 4, 2, 0);
  TrainingSession session(std::move(mlp.graph), mlp.loss, makeOptimizer(sgdMomentum()), replicated(2),
                          makeSimDevice());
  const std::vector<float> images(4 * 12);  // one replica's worth only
  const std::vector<int32_t> labels(8);
  const auto error = test::catchError<GraphError>([&] {
    session.run({StepInput("input", images), StepInput("labels", labels)});
  });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::HostShapeMismatch);
  CHECK(error->subject() == "input");
  CHECK(error->detail().find("[2, 4, 12]") != std::string::npos);
  CHECK(error->detail().find("localReplicas=2") != std::string::npos);

  const std::vector<float> all(2 * 4 * 12);
  const auto unknown = test::catchError<GraphError>([&] {
    session.run({StepInput("inputs", all), StepInput("labels", labels)});
  });
  REQUIRE(unknown);
  CHECK(unknown->code() == ErrorCode::UnknownStream);
  const auto missing = test::catchError<GraphError>([&] { session.run({StepInput("input", all)}); });
  REQUIRE(missing);
  CHECK(missing->subject() == "labels");
}

TEST_CASE("a graph built for another replication factor is rejected") {
  MlpGraph mlp = buildMlp(toyModel(), 4, 1, 0);
  const auto error = test::catchError<GraphError>([&] {
    TrainingSession(std::move(mlp.graph), mlp.loss, makeOptimizer(sgdMomentum()), replicated(2),
                    makeSimDevice());
  });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::ReplicationFactorMismatch);
}

TEST_CASE("invalid options are rejected before compiling") {
  MlpGraph mlp = buildMlp(toyModel(), 4, 1, 0);
  SessionOptions options;
  options.replicatedGraphCount = 2;  // without enableReplicatedGraphs
  const auto error = test::catchError<ConfigError>([&] {
    TrainingSession(std::move(mlp.graph), mlp.loss, makeOptimizer(sgdMomentum()), options, makeSimDevice());
  });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::ReplicationDisabledButCount);
  CHECK(error->subject() == "/sessionOptions/replicatedGraphCount");
}

TEST_CASE("the learning rate changes between steps without recompiling") {
  const ToyData data = toyData(8, 12);
  const auto run = [&](double secondRate) {
    MlpGraph mlp = buildMlp(toyModel(), 8, 1, 3);
    TrainingSession session(std::move(mlp.graph), mlp.loss, makeOptimizer(sgdMomentum()), replicated(1),
                            makeSimDevice());
    session.run({StepInput("input", data.images), StepInput("labels", data.labels)});
    session.setLearningRate(secondRate);
    CHECK(session.learningRate() == secondRate);
    session.run({StepInput("input", data.images), StepInput("labels", data.labels)});
    return session.readVariable("W0").data;
  };
  const std::vector<float> same = run(0.1);
  const std::vector<float> zero = run(1e-12);
  const std::vector<float> big = run(0.5);
  CHECK(same != zero);
  CHECK(same != big);
}

TEST_CASE("grouped variables are read and written in host shape [numGroups, ...] and train per group") {
  // y = sum(x * w) per replica; each group of replicas has its own w.
  const int64_t replicas = 4;
  Graph g(replicas);
  Tensor x = ops::input(g, "x", {3});
  const ReplicaGrouping grouping(replicas, 1, 2);  // groups {0,1} and {2,3}
  Tensor w = ops::variable(g, "w", {1, 2, 3, 10, 20, 30}, {3}, grouping);
  Tensor loss = ops::reduceSum(ops::mul(x, w));
  OptimizerConfig sgd;
  sgd.sgd.learningRate = 1.0;
  TrainingSession session(std::move(g), loss.id(), makeOptimizer(sgd), replicated(replicas), makeSimDevice());

  HostTensor initial = session.readVariable("w");
  CHECK(initial.shape == Shape{2, 3});
  CHECK(initial.data == std::vector<float>{1, 2, 3, 10, 20, 30});
  HostTensor all = session.readVariable("w", RetrievalMode::AllReplicas);
  CHECK(all.shape == Shape{4, 3});
  CHECK(all.data == std::vector<float>{1, 2, 3, 1, 2, 3, 10, 20, 30, 10, 20, 30});

  // Replica r feeds x = (r+1) * [1, 1, 1]; the gradient of group {0,1} is the
  // mean of 1 and 2 = 1.5, of group {2,3} the mean of 3 and 4 = 3.5.
  std::vector<float> xs;
  for (int r = 0; r < replicas; ++r) xs.insert(xs.end(), 3, static_cast<float>(r + 1));
  session.run({StepInput("x", xs)});
  CHECK(session.readVariable("w").data == std::vector<float>{-0.5f, 0.5f, 1.5f, 6.5f, 16.5f, 26.5f});

  session.writeVariable("w", HostTensor{{2, 3}, {0, 0, 0, 1, 1, 1}});
  CHECK(session.readVariable("w").data == std::vector<float>{0, 0, 0, 1, 1, 1});
  const auto error = test::catchError<GraphError>([&] {
    session.writeVariable("w", HostTensor{{3}, {0, 0, 0}});
  });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::HostShapeMismatch);
  CHECK(error->subject() == "w");
  CHECK(error->detail().find("[2, 3]") != std::string::npos);
}

TEST_CASE("sharded variables are reassembled on the host") {
  const int64_t replicas = 4;
  Graph g(replicas);
  std::vector<float> data(30);
  std::iota(data.begin(), data.end(), 0.0f);
  const ShardedVariable w = ops::replicaShardedVariable(g, "w", data, {5, 2, 3});
  Tensor full = ops::replicatedAllGather(w.shard);
  Tensor x = ops::input(g, "x", {5, 2, 3});
  const std::string y = ops::reduceSum(ops::mul(full, x)).name();
  InferenceSession session(std::move(g), {y}, replicated(replicas), makeSimDevice());
  HostTensor host = session.readVariable("w");
  CHECK(host.shape == Shape{5, 2, 3});
  CHECK(host.data == data);
  std::vector<float> ones(static_cast<size_t>(replicas * 30), 1.0f);
  session.run({StepInput("x", ones)});
  // Every replica sees the whole weight: sum 0..29 = 435.
  CHECK(session.output(y).data == std::vector<float>(4, 435.0f));
}

TEST_CASE("inference sessions reject gradient accumulation") {
  Graph g(1);
  Tensor x = ops::input(g, "x", {2});
  const std::string y = ops::relu(x).name();
  SessionOptions options;
  options.enableGradientAccumulation = true;
  options.accumulationFactor = 2;
  const auto error =
      test::catchError<ConfigError>([&] { InferenceSession(std::move(g), {y}, options, makeSimDevice()); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::UnsupportedCombination);
}

TEST_CASE("replica-sharded weights and optimizer state train like replicated ones") {
  const ToyData data = toyData(8 * 4, 12);
  const auto run = [&](int64_t replicas, const SessionOptions& options, OptimizerConfig optimizer) {
    MlpGraph mlp = buildMlp(toyModel(), 8 / replicas, replicas, 3);
    TrainingSession session(std::move(mlp.graph), mlp.loss, makeOptimizer(optimizer), options,
                            makeSimDevice());
    RunResult result;
    for (int s = 0; s < 4; ++s) {
      session.run({StepInput("input", std::span<const float>(data.images).subspan(s * 8 * 12, 8 * 12)),
                   StepInput("labels", std::span<const int32_t>(data.labels).subspan(s * 8, 8))});
      result.losses.push_back(session.meanLoss());
    }
    result.weights = session.readWeights();
    return std::pair{result, session.memory()};
  };
  OptimizerConfig adam;
  adam.type = OptimizerType::Adam;
  adam.adam.learningRate = 0.01;
  for (const OptimizerConfig& optimizer : {sgdMomentum(), adam}) {
    const auto [reference, referenceMemory] = run(4, replicated(4), optimizer);
    for (const CommGroup domain : {CommGroup{}, CommGroup(CommGroupType::Consecutive, 2)}) {
      INFO(toString(optimizer.type) << " " << domain.str());
      SessionOptions options = replicated(4);
      for (TensorCategory category : {TensorCategory::Weight, TensorCategory::OptimizerState}) {
        TensorLocationSettings& settings = options.locationSettings(category);
        settings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
        settings.location.shardingDomain = domain;
        settings.minElementsForReplicatedTensorSharding = 4;
      }
      const auto [result, memory] = run(4, options, optimizer);
      checkClose(result, reference, 1e-5);
      // W0 (12x8 = 96 elements) is sharded: each replica holds fewer bytes.
      CHECK(memory.perReplica.front().variableBytes < referenceMemory.perReplica.front().variableBytes);
    }
  }
}

TEST_CASE("planning makes no initial values; a session makes each once, with the values it names") {
  // A model whose weights are generated on demand, counting each time they are made.
  int made = 0;
  const auto counted = [&made](int64_t elements, float value) {
    return InitialValues::generated(elements, fmt::format("counted {}", value),
                                    [&made, value](std::span<float> out) {
                                      ++made;
                                      std::fill(out.begin(), out.end(), value);
                                    });
  };
  Graph g(2);
  const Tensor x = ops::input(g, "x", {4, 12});
  const Tensor labels = ops::input(g, "labels", {4}, DType::Int32);
  const Tensor w = ops::variable(g, "w", counted(12 * 4, 0.25F), {12, 4});
  const Tensor b = ops::variable(g, "b", counted(4, -0.5F), {4});
  const Tensor loss = ops::softmaxCrossEntropy(ops::add(ops::matmul(x, w), b), labels, ReductionType::Mean);
  const Graph copy = g;  // copies share the generator: nothing is made
  CHECK(made == 0);

  const std::unique_ptr<Optimizer> sgd = makeOptimizer(sgdMomentum());
  SessionOptions options = replicated(2);
  options.weightTensorLocationSettings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
  options.weightTensorLocationSettings.minElementsForReplicatedTensorSharding = 1;
  const RunPlan plan = planTraining(g, loss.id(), *sgd, options, DeviceSpec{});
  CHECK(plan.memory.perReplica.size() == 2);
  requireTrainingFits(g, loss.id(), *sgd, options, DeviceSpec{});
  CHECK(made == 0);

  TrainingSession session(std::move(g), loss.id(), makeOptimizer(sgdMomentum()), options, makeSimDevice());
  CHECK(made == 2);
  // Named variables, not structured bindings: clang before 16 cannot capture those in a lambda
  // (CAPTURE makes one).
  for (const auto& weight : session.readWeights()) {
    const std::string& name = weight.first;
    CAPTURE(name);
    const float expected = name == "w" ? 0.25F : -0.5F;
    for (float v : weight.second.data) CHECK(v == expected);
  }
  CHECK(copy.tensor(copy.find("w")).initial.elements() == 48);
}

TEST_CASE("initial values: explicit ones are shared by copies, generated ones are checked for size") {
  const InitialValues values(std::vector<float>{1, 2, 3});
  const InitialValues copy = values;
  CHECK(copy.explicitValues() == values.explicitValues());
  CHECK(values.values() == std::vector<float>{1, 2, 3});
  const InitialValues zeros = InitialValues::filled(5, 0.0F);
  CHECK(zeros.explicitValues() == nullptr);
  CHECK(zeros.identity() == "zeros");
  CHECK(zeros.values() == std::vector<float>(5, 0.0F));
  std::vector<float> wrong(4);
  CHECK_THROWS_AS(zeros.fill(wrong), InternalError);
  CHECK(normalValues(7, 3, 0.5).values() == normalSamples(7, 3, 0.5));
  Graph g(1);
  CHECK_THROWS_AS(ops::variable(g, "v", InitialValues::filled(5, 1.0F), {2, 3}), GraphError);
}
