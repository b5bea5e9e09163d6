// Float16 weights: float32 master weights, optimizer state in float16 or
// float32, and loss scaling of float16 gradients.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "half.hpp"
#include "support/toy_data.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/loss_scaling.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

constexpr int64_t kFeatures = 12;
constexpr int64_t kHidden = 16;
constexpr int64_t kClasses = 4;
constexpr int64_t kSamplesPerStep = 8;

std::vector<float> initialValues(int64_t n, double phase) {
  std::vector<float> values;
  for (int64_t i = 0; i < n; ++i) values.push_back(static_cast<float>(0.4 * std::sin(1.7 * i + phase)));
  return values;
}

// An MLP 12-16-4 with float16 weights and activations and a float32 loss.
TrainingSession mlp16(const OptimizerConfig& optimizer, const SessionOptions& options) {
  const int64_t replicas = options.getGlobalReplicationFactor();
  const int64_t batch = kSamplesPerStep / replicas;
  Graph g(replicas);
  const Tensor x = ops::input(g, "input", {batch, kFeatures}, DType::Float16);
  const Tensor labels = ops::input(g, "labels", {batch}, DType::Int32);
  const Tensor w0 =
      ops::variable(g, "W0", initialValues(kFeatures * kHidden, 0.0), {kFeatures, kHidden}, std::nullopt,
                    RetrievalMode::OnePerGroup, TensorCategory::Weight, DType::Float16);
  const Tensor w1 =
      ops::variable(g, "W1", initialValues(kHidden * kClasses, 1.0), {kHidden, kClasses}, std::nullopt,
                    RetrievalMode::OnePerGroup, TensorCategory::Weight, DType::Float16);
  const Tensor logits = ops::cast(ops::matmul(ops::relu(ops::matmul(x, w0)), w1), DType::Float32);
  const Tensor loss = ops::softmaxCrossEntropy(logits, labels);
  return TrainingSession(std::move(g), loss.id(), makeOptimizer(optimizer), options, makeSimDevice());
}

// Runs `steps` steps over 4 batches of the toy problem; the mean loss of each.
std::vector<double> train(TrainingSession& session, int steps) {
  const test::ToyData data = test::toyData(4 * kSamplesPerStep, kFeatures, 5);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    const int64_t first = (s % 4) * kSamplesPerStep;
    const std::span<const float> images(data.images.data() + first * kFeatures, kSamplesPerStep * kFeatures);
    const std::span<const int32_t> labels(data.labels.data() + first, kSamplesPerStep);
    session.run({StepInput("input", images), StepInput("labels", labels)});
    losses.push_back(session.meanLoss());
  }
  return losses;
}

OptimizerConfig adam() {
  OptimizerConfig config;
  config.type = OptimizerType::Adam;
  config.adam.learningRate = 0.02;
  return config;
}

OptimizerConfig sgd() {
  OptimizerConfig config;
  config.sgd.learningRate = 0.2;
  config.sgd.momentum = 0.9;
  return config;
}

const TensorNode& node(const TrainingSession& session, const std::string& name) {
  return session.graph().tensor(session.graph().find(name));
}

// The weight is its master rounded to float16, element by element.
void checkWeightIsRoundedMaster(const TrainingSession& session, const std::string& weight) {
  const std::vector<float> w = session.readVariable(weight).data;
  const std::vector<float> master = session.readVariable(weight + ".master").data;
  REQUIRE(w.size() == master.size());
  for (std::size_t i = 0; i < w.size(); ++i) CHECK(w[i] == roundToHalf(master[i]));
}

}  // namespace

TEST_CASE("float16 weights train through float32 master weights") {
  for (const bool withAdam : {false, true}) {
    INFO((withAdam ? "adam" : "sgd"));
    TrainingSession session = mlp16(withAdam ? adam() : sgd(), test::replicated(1, ReductionType::Mean));
    for (const std::string weight : {"W0", "W1"}) {
      CHECK(node(session, weight).dtype == DType::Float16);
      const TensorNode& master = node(session, weight + ".master");
      CHECK(master.dtype == DType::Float32);
      CHECK(master.category == TensorCategory::OptimizerState);
      CHECK(node(session, weight + (withAdam ? ".adamM" : ".momentum")).dtype == DType::Float32);
    }
    // The master starts at the weight's float32 initial values exactly.
    CHECK(session.readVariable("W0.master").data == initialValues(kFeatures * kHidden, 0.0));
    checkWeightIsRoundedMaster(session, "W0");
    const std::vector<double> losses = train(session, 40);
    CHECK(losses.back() < 0.5 * losses.front());
    checkWeightIsRoundedMaster(session, "W0");
    checkWeightIsRoundedMaster(session, "W1");
    CHECK(session.readVariable("W1.master").data != initialValues(kHidden * kClasses, 1.0));
  }
}

TEST_CASE("optimizer state in float16, and float16 weights updated without master weights") {
  OptimizerConfig config = adam();
  config.adam.accl1Type = DType::Float16;
  config.adam.accl2Type = DType::Float16;
  config.adam.masterWeights = false;
  // (1 - beta2) g^2 underflows float16 for small gradients: an eps that
  // float16 holds keeps the step finite where v is 0.
  config.adam.eps = 1e-3;
  TrainingSession session = mlp16(config, test::replicated(1, ReductionType::Mean));
  CHECK_FALSE(session.graph().tryFind("W0.master").has_value());
  CHECK(node(session, "W0.adamM").dtype == DType::Float16);
  CHECK(node(session, "W0.adamV").dtype == DType::Float16);
  const std::vector<double> losses = train(session, 40);
  CHECK(losses.back() < 0.5 * losses.front());
  for (const float w : session.readVariable("W0").data) CHECK(w == roundToHalf(w));

  OptimizerConfig momentum = sgd();
  momentum.sgd.accl1Type = DType::Float16;
  TrainingSession withMomentum = mlp16(momentum, test::replicated(1, ReductionType::Mean));
  CHECK(node(withMomentum, "W0.momentum").dtype == DType::Float16);
  CHECK(node(withMomentum, "W0.master").dtype == DType::Float32);
  const std::vector<double> sgdLosses = train(withMomentum, 40);
  CHECK(sgdLosses.back() < 0.5 * sgdLosses.front());
}

TEST_CASE("master weights are optimizer state: sharded and in streaming memory like any") {
  const auto run = [](const SessionOptions& options, std::vector<float>& master, std::vector<float>& weight) {
    TrainingSession session = mlp16(adam(), options);
    train(session, 6);
    master = session.readVariable("W0.master").data;
    weight = session.readVariable("W0").data;
    return session.memory().perReplica.front().resident;
  };
  std::vector<float> plainMaster, plainWeight;
  run(test::replicated(2, ReductionType::Mean), plainMaster, plainWeight);

  SessionOptions sharded = test::replicated(2, ReductionType::Mean);
  TensorLocationSettings& state = sharded.optimizerStateTensorLocationSettings;
  state.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
  state.minElementsForReplicatedTensorSharding = 2;
  {
    TrainingSession session = mlp16(adam(), sharded);
    CHECK_FALSE(node(session, "W0.master").metaShape.empty());
    CHECK(node(session, "W0.master").shape == Shape{kFeatures * kHidden / 2});
  }
  SessionOptions offChip = sharded;
  offChip.optimizerStateTensorLocationSettings.location.storage = TensorStorage::OffChip;
  {
    TrainingSession session = mlp16(adam(), offChip);
    CHECK(node(session, "W0.master").remoteBuffer >= 0);
  }
  for (const SessionOptions& options : {sharded, offChip}) {
    std::vector<float> master, weight;
    const std::vector<CategoryMemory> resident = run(options, master, weight);
    const CategoryMemory& optimizerState = resident.at(static_cast<size_t>(TensorCategory::OptimizerState));
    // W0 and W1's master, m and v, halved by sharding (scalars aside).
    const int64_t stateBytes = 3 * 4 * (kFeatures * kHidden + kHidden * kClasses) / 2;
    const int64_t held =
        options.optimizerStateTensorLocationSettings.location.storage == TensorStorage::OffChip
            ? optimizerState.streamingBytes
            : optimizerState.computeTilesBytes;
    CHECK(held >= stateBytes);
    REQUIRE(master.size() == plainMaster.size());
    for (std::size_t i = 0; i < master.size(); ++i) {
      CHECK(master[i] == doctest::Approx(plainMaster[i]).epsilon(1e-6));
      CHECK(std::abs(weight[i] - plainWeight[i]) <= std::abs(plainWeight[i]) * 1e-3);
    }
  }
}

TEST_CASE("automatic loss scaling finds a scale that float16 gradients survive") {
  SessionOptions options = test::replicated(2, ReductionType::Mean);
  options.automaticLossScalingSettings.enabled = true;
  options.automaticLossScalingSettings.updatePeriod = 10;
  OptimizerConfig config = adam();
  // Far above float16's 65504: the first steps' gradients overflow.
  config.adam.lossScaling = 0x1p24;
  TrainingSession session = mlp16(config, options);
  const std::vector<float> before = session.readVariable("W0.master").data;
  const std::vector<double> losses = train(session, 40);
  CHECK(session.skippedSteps() > 0);
  CHECK(session.lossScale() < 0x1p24);
  CHECK(losses.back() < 0.5 * losses.front());
  checkWeightIsRoundedMaster(session, "W0");
  // The first step overflowed: it changed nothing.
  TrainingSession once = mlp16(config, options);
  train(once, 1);
  CHECK(once.lastStepSkipped());
  CHECK(once.readVariable("W0.master").data == before);
}

TEST_CASE("optimizer state is float32 or float16") {
  OptimizerConfig config = sgd();
  config.sgd.accl1Type = DType::Int32;
  bool threw = false;
  try {
    (void)makeOptimizer(config);
  } catch (const ConfigError& error) {
    threw = true;
    CHECK(error.code() == ErrorCode::InvalidOptimizer);
    CHECK(error.subject() == "/optimizer/accl1Type");
  }
  CHECK(threw);
}

TEST_CASE("float16 weights accumulate their gradients in the optimizer's accumType") {
  for (const DType accumType : {DType::Float32, DType::Float16}) {
    INFO(accumType);
    SessionOptions options = test::replicated(1, ReductionType::Mean);
    options.enableGradientAccumulation = true;
    options.accumulationFactor = 2;
    OptimizerConfig config = sgd();
    config.sgd.accumType = accumType;
    // Two micro-batches of 4 samples make the step's 8.
    const int64_t batch = kSamplesPerStep / 2;
    Graph g(1);
    const Tensor x = ops::input(g, "input", {batch, kFeatures}, DType::Float16);
    const Tensor labels = ops::input(g, "labels", {batch}, DType::Int32);
    const Tensor w0 =
        ops::variable(g, "W0", initialValues(kFeatures * kClasses, 0.0), {kFeatures, kClasses}, std::nullopt,
                      RetrievalMode::OnePerGroup, TensorCategory::Weight, DType::Float16);
    const Tensor loss = ops::softmaxCrossEntropy(ops::cast(ops::matmul(x, w0), DType::Float32), labels);
    TrainingSession session(std::move(g), loss.id(), makeOptimizer(config), options, makeSimDevice());
    CHECK(node(session, "W0.accum").dtype == accumType);
    const std::vector<double> losses = train(session, 40);
    CHECK(losses.back() < 0.7 * losses.front());
    checkWeightIsRoundedMaster(session, "W0");
  }
}
