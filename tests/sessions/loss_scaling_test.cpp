// Loss scaling: static scaling leaves the numbers as they were; automatic
// scaling skips the steps whose gradients overflow, on every replica alike,
// and grows and shrinks the scale.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/toy_data.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/lib/loss_scaling.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/sessions/session.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

OptimizerConfig sgd(double lossScaling, double momentum = 0.9, double dampening = 0.0) {
  OptimizerConfig config;
  config.type = OptimizerType::Sgd;
  config.sgd.learningRate = 0.125;
  config.sgd.momentum = momentum;
  config.sgd.dampening = dampening;
  config.sgd.lossScaling = lossScaling;
  return config;
}

OptimizerConfig adam(double lossScaling) {
  OptimizerConfig config;
  config.type = OptimizerType::Adam;
  config.adam.learningRate = 0.01;
  config.adam.lossScaling = lossScaling;
  return config;
}

SessionOptions automatic(SessionOptions options, int64_t updatePeriod = 2000) {
  options.automaticLossScalingSettings.enabled = true;
  options.automaticLossScalingSettings.updatePeriod = updatePeriod;
  return options;
}

// Every weight and optimizer state variable of the session, by name.
std::vector<std::pair<std::string, HostTensor>> modelState(const TrainingSession& session) {
  std::vector<std::pair<std::string, HostTensor>> state;
  for (const OpNode& op : session.graph().ops()) {
    if (op.kind != OpKind::Variable) continue;
    const TensorNode& node = session.graph().tensor(op.outputs[0]);
    if (node.category != TensorCategory::Weight && node.category != TensorCategory::OptimizerState) continue;
    // The loss scaling state and the hyper-parameters change on a skipped step.
    if (node.name.starts_with("lossScaling.") || node.name.starts_with("optimizer.")) continue;
    state.emplace_back(node.name, session.readVariable(node.name));
  }
  return state;
}

// The toy MLP 12-8-4 trained for `steps` steps of 8 samples.
std::vector<std::pair<std::string, HostTensor>> trainToy(const OptimizerConfig& optimizer,
                                                         const SessionOptions& options, int steps) {
  const test::ToyData data = test::toyData(8 * steps, 12, 99);
  ModelConfig model;
  model.layers = {12, 8, 4};
  const int64_t replicas = options.getGlobalReplicationFactor();
  MlpGraph mlp = buildMlp(model, 8 / replicas, replicas, 3);
  TrainingSession session(std::move(mlp.graph), mlp.loss, makeOptimizer(optimizer), options, makeSimDevice());
  for (int s = 0; s < steps; ++s) {
    const std::span<const float> images(data.images.data() + s * 8 * 12, 8 * 12);
    const std::span<const int32_t> labels(data.labels.data() + s * 8, 8);
    session.run({StepInput("input", images), StepInput("labels", labels)});
  }
  CHECK(session.skippedSteps() == 0);
  return modelState(session);
}

// loss = sum(w * x) with w of n elements: the gradient of w is the loss
// scale times x, summed over the replicas.
struct Linear {
  Graph graph;
  TensorId loss = kNoTensor;
};

Linear linear(int64_t replicas, int64_t n) {
  Graph graph(replicas);
  const Tensor x = ops::input(graph, "x", {n});
  std::vector<float> initial;
  for (int64_t i = 0; i < n; ++i) initial.push_back(0.5F + 0.25F * static_cast<float>(i));
  const Tensor w = ops::variable(graph, "w", initial, {n});
  const Tensor loss = ops::reduceSum(ops::mul(w, x));
  return {std::move(graph), loss.id()};
}

TrainingSession linearSession(int64_t n, const OptimizerConfig& optimizer, const SessionOptions& options) {
  Linear model = linear(options.getGlobalReplicationFactor(), n);
  return TrainingSession(std::move(model.graph), model.loss, makeOptimizer(optimizer), options,
                         makeSimDevice());
}

void run(TrainingSession& session, const std::vector<float>& x) { session.run({StepInput("x", x)}); }

double variableValue(const TrainingSession& session, std::string_view name) {
  return session.readVariable(name).data.at(0);
}

}  // namespace

TEST_CASE("static loss scaling by a power of two gives the unscaled run's bits") {
  for (const bool withAdam : {false, true}) {
    for (const int64_t replicas : {1, 2}) {
      INFO((withAdam ? "adam" : "sgd") << ", " << replicas << " replica(s)");
      const SessionOptions options = test::replicated(replicas);
      const auto reference = trainToy(withAdam ? adam(1) : sgd(1), options, 4);
      CHECK(trainToy(withAdam ? adam(1024) : sgd(1024), options, 4) == reference);
      // Other scales round differently, within float32 rounding.
      const auto other = trainToy(withAdam ? adam(1000) : sgd(1000), options, 4);
      REQUIRE(other.size() == reference.size());
      for (std::size_t v = 0; v < other.size(); ++v) {
        for (std::size_t i = 0; i < other[v].second.data.size(); ++i) {
          CHECK(other[v].second.data[i] == doctest::Approx(reference[v].second.data[i]).epsilon(1e-4));
        }
      }
    }
  }
}

TEST_CASE("static loss scaling seeds the loss gradient and divides the gradients by the scale") {
  Linear model = linear(1, 4);
  TrainingSession session(std::move(model.graph), model.loss, makeOptimizer(sgd(8, 0.0)), SessionOptions{},
                          makeSimDevice());
  // Nothing of automatic scaling is in the program.
  CHECK_FALSE(session.graph().tryFind(std::string(kLossScaleTensor)).has_value());
  CHECK(session.lossScale() == 8);
  run(session, {1, 2, 3, 4});
  const std::vector<float> w = session.readVariable("w").data;
  for (int i = 0; i < 4; ++i) CHECK(w[static_cast<size_t>(i)] == 0.5F + 0.25F * i - 0.125F * (i + 1));
  CHECK_FALSE(session.lastStepSkipped());
}

TEST_CASE(
    "automatic loss scaling shrinks the scale on an overflow and grows it after updatePeriod clean steps") {
  SessionOptions options = automatic(SessionOptions{}, 2);
  options.automaticLossScalingSettings.maxLossScale = 0x1p127;
  TrainingSession session = linearSession(4, sgd(0x1p126, 0.0), options);
  for (const char* name :
       {kLossScaleTensor.data(), kLossScaleCleanStepsTensor.data(), kLossScaleSkippedStepsTensor.data()}) {
    const TensorNode& node = session.graph().tensor(session.graph().find(name));
    CHECK(node.category == TensorCategory::OptimizerState);
    CHECK(node.dtype == DType::Float32);
    CHECK(node.shape.empty());
  }
  const std::vector<float> initial = session.readVariable("w").data;
  const std::vector<float> x{1, 2, 3, 4};
  // The largest gradient is 4 x scale: it overflows float32 at 2^126, not at 2^125.
  struct Expected {
    bool skipped;
    double scale;  // after the step
    double clean;
    int64_t skippedSteps;
  };
  const std::vector<Expected> expected = {
      {true, 0x1p125, 0, 1}, {false, 0x1p125, 1, 1}, {false, 0x1p126, 0, 1},
      {true, 0x1p125, 0, 2}, {false, 0x1p125, 1, 2}, {false, 0x1p126, 0, 2},
  };
  std::vector<float> w = initial;
  for (std::size_t step = 0; step < expected.size(); ++step) {
    INFO("step " << step);
    run(session, x);
    const Expected e = expected[step];
    CHECK(session.lastStepSkipped() == e.skipped);
    CHECK(session.lossScale() == e.scale);
    CHECK(variableValue(session, kLossScaleTensor) == e.scale);
    CHECK(variableValue(session, kLossScaleCleanStepsTensor) == e.clean);
    CHECK(session.skippedSteps() == e.skippedSteps);
    // Power-of-two scales unscale exactly: an applied step is w -= 0.125 x.
    if (!e.skipped) {
      for (std::size_t i = 0; i < w.size(); ++i) w[i] -= 0.125F * x[i];
    }
    CHECK(session.readVariable("w").data == w);
  }
  CHECK(session.step() == 6);
}

TEST_CASE("the scale stays within minLossScale and maxLossScale") {
  SessionOptions options = automatic(SessionOptions{}, 1);
  options.automaticLossScalingSettings.minLossScale = 4;
  options.automaticLossScalingSettings.maxLossScale = 16;
  TrainingSession session = linearSession(4, sgd(4, 0.0), options);
  for (const double scale : {8.0, 16.0, 16.0}) {
    run(session, {1, 2, 3, 4});
    CHECK(session.lossScale() == scale);
  }
  for (int i = 0; i < 4; ++i) {
    run(session, {1, kInf, 3, 4});
    CHECK(session.lastStepSkipped());
  }
  CHECK(session.lossScale() == 4);
  CHECK(session.skippedSteps() == 4);
}

TEST_CASE("a skipped step leaves weights and optimizer state bit-unchanged and does not count as a step") {
  const std::vector<float> overflow{1, 2, kInf, 4};
  const std::vector<float> x1{1, -2, 3, 0.5F};
  const std::vector<float> x2{-1, 2, 0.25F, 4};
  // Dampening makes SGD's first step differ from the others; Adam's bias
  // correction depends on the step count.
  for (const bool withAdam : {false, true}) {
    INFO((withAdam ? "adam" : "sgd"));
    const OptimizerConfig optimizer = withAdam ? adam(1024) : sgd(1024, 0.9, 0.5);
    TrainingSession skipping = linearSession(4, optimizer, automatic(SessionOptions{}));
    const auto before = modelState(skipping);
    CHECK(before.size() == (withAdam ? 3 : 2));
    run(skipping, overflow);
    CHECK(skipping.lastStepSkipped());
    CHECK(skipping.skippedSteps() == 1);
    CHECK(skipping.lossScale() == 512);
    CHECK(modelState(skipping) == before);
    run(skipping, x1);
    run(skipping, x2);
    CHECK_FALSE(skipping.lastStepSkipped());

    TrainingSession clean = linearSession(4, optimizer, automatic(SessionOptions{}));
    run(clean, x1);
    run(clean, x2);
    CHECK(modelState(skipping) == modelState(clean));
    CHECK(modelState(skipping) != before);
  }
}

TEST_CASE("every replica skips the same step: replicated, sharded and accumulated gradients") {
  struct Case {
    std::string name;
    int64_t replicas;
    int64_t accumulation;
    bool shardWeights;
    bool shardState;
    CommGroup domain;
  };
  const std::vector<Case> cases = {
      {"R=2", 2, 1, false, false, {}},
      {"R=2, RTS weights", 2, 1, true, false, {}},
      {"R=2, RTS weights and state", 2, 1, true, true, {}},
      {"R=4, RTS over Consecutive(2)", 4, 1, true, true, CommGroup(CommGroupType::Consecutive, 2)},
      {"R=2, RTS state, OffChip state", 2, 1, false, true, {}},
      {"R=2 x accumulation 2", 2, 2, false, false, {}},
  };
  constexpr int64_t n = 8;
  for (const Case& c : cases) {
    INFO(c.name);
    SessionOptions options = automatic(test::replicated(c.replicas));
    options.enableGradientAccumulation = c.accumulation > 1;
    options.accumulationFactor = c.accumulation;
    if (c.shardWeights) {
      options.weightTensorLocationSettings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
      options.weightTensorLocationSettings.location.shardingDomain = c.domain;
      options.weightTensorLocationSettings.minElementsForReplicatedTensorSharding = 0;
    }
    if (c.shardState) {
      options.optimizerStateTensorLocationSettings.location.replicatedTensorSharding =
          ReplicatedTensorSharding::On;
      options.optimizerStateTensorLocationSettings.location.shardingDomain = c.domain;
      // Scalars (the loss scale, the learning rate) stay whole.
      options.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = 2;
      if (!c.shardWeights)
        options.optimizerStateTensorLocationSettings.location.storage = TensorStorage::OffChip;
    }
    TrainingSession session = linearSession(n, adam(1024), options);
    if (c.shardWeights) CHECK_FALSE(session.graph().tensor(session.graph().find("w")).metaShape.empty());
    const auto before = modelState(session);
    // One element of the last replica's last micro-batch overflows: it lies
    // in the last shard only.
    const int64_t values = c.accumulation * c.replicas * n;
    std::vector<float> x(static_cast<size_t>(values), 1.0F);
    x[static_cast<size_t>(values - 2)] = kInf;
    run(session, x);
    CHECK(session.lastStepSkipped());
    CHECK(session.skippedSteps() == 1);
    CHECK(modelState(session) == before);
    // Every replica's copy of the weight is the old one.
    const HostTensor all = session.readVariable("w", RetrievalMode::AllReplicas);
    for (int64_t r = 0; r < c.replicas; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        CHECK(all.data[static_cast<size_t>(r * n + i)] == before.front().second.data[static_cast<size_t>(i)]);
      }
    }
    std::fill(x.begin(), x.end(), 1.0F);
    run(session, x);
    CHECK_FALSE(session.lastStepSkipped());
    CHECK(modelState(session) != before);
  }
}

TEST_CASE("loss scaling settings are checked, with their JSON paths") {
  SUBCASE("lossScaling must be > 0") {
    OptimizerConfig config = sgd(0);
    const auto error = test::catchError<ConfigError>([&] { (void)makeOptimizer(config); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::OutOfRange);
    CHECK(error->subject() == "/optimizer/lossScaling");
  }
  SUBCASE("the automatic settings' ranges") {
    const auto check = [](const char* json, const char* path, ErrorCode code) {
      SessionOptions options = nlohmann::json::parse(json).get<SessionOptions>();
      const auto error = test::catchError<ConfigError>([&] { validate(options); });
      REQUIRE(error);
      CHECK(error->code() == code);
      CHECK(error->subject() == path);
    };
    check(R"({"automaticLossScalingSettings": {"minLossScale": 8, "maxLossScale": 4}})",
          "/sessionOptions/automaticLossScalingSettings/maxLossScale", ErrorCode::InvalidLossScaling);
    SessionOptions options;
    options.automaticLossScalingSettings.updatePeriod = 0;
    const auto error = test::catchError<ConfigError>([&] { validate(options); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::OutOfRange);
    CHECK(error->subject() == "/sessionOptions/automaticLossScalingSettings/updatePeriod");
    options = SessionOptions{};
    options.automaticLossScalingSettings.backoffFactor = 1;
    CHECK(test::catchError<ConfigError>([&] { validate(options); })->subject() ==
          "/sessionOptions/automaticLossScalingSettings/backoffFactor");
    const auto read = test::catchError<ConfigError>([] {
      (void)nlohmann::json::parse(R"({"automaticLossScalingSettings": {"growthFactor": 1}})")
          .get<SessionOptions>();
    });
    REQUIRE(read);
    CHECK(read->code() == ErrorCode::OutOfRange);
    CHECK(read->subject() == "/automaticLossScalingSettings/growthFactor");
  }
  SUBCASE("the initial scale must lie within the automatic bounds") {
    SessionOptions options = automatic(SessionOptions{});
    const auto error = test::catchError<ConfigError>([&] { linearSession(4, sgd(0.5), options); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::InvalidLossScaling);
    CHECK(error->subject() == "/optimizer/lossScaling");
    CHECK(std::string(error->what()).find("[1, 16777216]") != std::string::npos);
    // Static scaling takes any positive scale.
    CHECK_NOTHROW(linearSession(4, sgd(0.5), SessionOptions{}));
  }
  SUBCASE("the run config checks it too") {
    const auto error = test::catchError<ConfigError>([] {
      validate(
          parseRunConfig(
              R"({"sessionOptions": {"automaticLossScalingSettings": {"enabled": true, "maxLossScale": 64}},
                       "optimizer": {"type": "Adam", "lossScaling": 128}})",
              "run.json")
              .config);
    });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::InvalidLossScaling);
    CHECK(error->subject() == "/optimizer/lossScaling");
  }
}
