// float16 weights, activations and optimizer state under replicated tensor
// sharding, streaming memory and sharding domains: the float16 MLP trains
// like its plain replicated run, and the memory report holds the halves.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "support/toy_training.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

constexpr int64_t kReplicas = 4;
constexpr int64_t kAccumulation = 2;
constexpr int64_t kSteps = 3;
constexpr int64_t kGlobalBatch = 16;
constexpr int64_t kFeatures = 12;
constexpr int64_t kHidden = 8;
constexpr int64_t kClasses = 4;

ModelConfig toyModel() {
  ModelConfig model;
  model.layers = {kFeatures, kHidden, kClasses};
  model.dtype = DType::Float16;
  return model;
}

OptimizerConfig sgdMomentum() {
  OptimizerConfig config;
  config.sgd.learningRate = 0.1;
  config.sgd.momentum = 0.9;
  return config;
}

OptimizerConfig adam() {
  OptimizerConfig config;
  config.type = OptimizerType::Adam;
  config.adam.learningRate = 0.01;
  return config;
}

// Adam with float16 moments and no master weights: every variable is float16.
OptimizerConfig adamHalfState() {
  OptimizerConfig config = adam();
  config.adam.accl1Type = DType::Float16;
  config.adam.accl2Type = DType::Float16;
  config.adam.masterWeights = false;
  config.adam.eps = 1e-3;
  return config;
}

SessionOptions plain(int64_t accumulation = kAccumulation) {
  SessionOptions options;
  options.enableReplicatedGraphs = true;
  options.replicatedGraphCount = kReplicas;
  options.enableGradientAccumulation = accumulation > 1;
  options.accumulationFactor = accumulation;
  options.accumulationAndReplicationReductionType = ReductionType::Mean;
  return options;
}

struct Trained {
  std::vector<double> losses;
  std::vector<std::pair<std::string, HostTensor>> variables;  // weights and optimizer state, by name
  Graph graph{1};
  MemoryReport memory;
};

Trained train(const SessionOptions& options, const OptimizerConfig& optimizer) {
  const test::ToyData data = test::toyData(kGlobalBatch * kSteps, kFeatures, 7);
  MlpGraph mlp = buildMlp(toyModel(), kGlobalBatch / (kReplicas * options.accumulationFactor), kReplicas, 5);
  TrainingSession session(std::move(mlp.graph), mlp.loss, makeOptimizer(optimizer), options, makeSimDevice());
  Trained result;
  result.losses = test::trainToySteps(session, data, kGlobalBatch, 0, kSteps);
  result.variables = test::trainedVariables(session);
  result.graph = session.graph();
  result.memory = session.memory();
  return result;
}

// The largest difference of a loss or variable element in ulps of float16
// at the tensor's scale: 2^(e - 10) for the largest magnitude m, 2^e <= m <
// 2^(e+1) (the loss: its own), and 2^-24 below float16's smallest normal
// 2^-14. float32 tensors (master weights, float32 moments) are measured in
// the same unit, as they follow float16 gradients.
double halfUlpsAtScale(double difference, double scale) {
  return difference / std::ldexp(1.0, std::max(std::ilogb(std::max(scale, 1e-30)), -14) - 10);
}

double worstUlps(const Trained& a, const Trained& b) {
  double worst = 0;
  for (size_t i = 0; i < a.losses.size(); ++i)
    worst = std::max(worst, halfUlpsAtScale(std::abs(a.losses[i] - b.losses[i]), std::abs(b.losses[i])));
  for (size_t v = 0; v < a.variables.size(); ++v) {
    const std::vector<float>& x = a.variables[v].second.data;
    const std::vector<float>& y = b.variables[v].second.data;
    double scale = 0;
    for (float value : y) scale = std::max(scale, static_cast<double>(std::abs(value)));
    for (size_t i = 0; i < x.size(); ++i)
      worst = std::max(worst, halfUlpsAtScale(std::abs(x[i] - y[i]), scale));
  }
  return worst;
}

void requireSameVariables(const Trained& a, const Trained& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  REQUIRE(a.variables.size() == b.variables.size());
  for (size_t v = 0; v < a.variables.size(); ++v) {
    REQUIRE(a.variables[v].first == b.variables[v].first);
    REQUIRE(a.variables[v].second.shape == b.variables[v].second.shape);
  }
}

const TensorNode& variableNode(const Graph& graph, std::string_view name) {
  return graph.tensor(graph.find(name));
}

constexpr std::array kCategories = {TensorCategory::Weight, TensorCategory::OptimizerState,
                                    TensorCategory::Accumulator};

}  // namespace

TEST_CASE("float16 weights, activations and optimizer state shard and stream like float32") {
  const SessionOptions base = plain();
  SessionOptions options = base;
  for (const TensorCategory category : kCategories) {
    TensorLocationSettings& settings = options.locationSettings(category);
    settings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
    settings.minElementsForReplicatedTensorSharding = 4;
  }
  options.optimizerStateTensorLocationSettings.location.storage = TensorStorage::OffChip;
  options.activationTensorLocationSettings.location.storage = TensorStorage::OffChip;
  const Trained trained = train(options, adamHalfState());
  const Graph& graph = trained.graph;
  // W0 (12 x 8, float16) is held as a quarter on each replica.
  const TensorNode& w0 = variableNode(graph, "W0");
  CHECK(w0.dtype == DType::Float16);
  CHECK(w0.shape == Shape{kFeatures * kHidden / kReplicas});
  CHECK(w0.metaShape == Shape{kFeatures, kHidden});
  // Its float16 moments: sharded the same way, in streaming memory.
  for (const char* name : {"W0.adamM", "W0.adamV"}) {
    const TensorNode& state = variableNode(graph, name);
    CAPTURE(name);
    CHECK(state.dtype == DType::Float16);
    CHECK(state.shape == Shape{kFeatures * kHidden / kReplicas});
    CHECK(state.remoteBuffer >= 0);
    CHECK(graph.remoteBuffer(state.remoteBuffer).dtype == DType::Float16);
  }
  // The float16 activations the backward pass reads go to streaming memory as halves.
  int64_t offloaded = 0;
  for (const OpNode& op : graph.ops()) {
    if (op.kind != OpKind::RemoteStore) continue;
    const TensorNode& stored = graph.tensor(op.inputs.back());
    if (stored.category != TensorCategory::Activation) continue;
    CHECK(graph.remoteBuffer(op.attributes.remoteBuffer).dtype == stored.dtype);
    offloaded += stored.dtype == DType::Float16 ? 1 : 0;
  }
  CHECK(offloaded > 0);
  // Streaming memory per replica: m and v of the four weights, as quarters of
  // halves (W0 96, b0 8, W1 32, b1 4 elements: 140 / 4 = 35 each, two bytes an
  // element), besides the activations.
  const ReplicaMemory& memory = trained.memory.perReplica.front();
  const CategoryMemory& state = memory.resident.at(static_cast<size_t>(TensorCategory::OptimizerState));
  const int64_t elements = kFeatures * kHidden + kHidden + kHidden * kClasses + kClasses;
  CHECK(state.streamingBytes == 2 * 2 * elements / kReplicas);
  const CategoryMemory& weights = memory.resident.at(static_cast<size_t>(TensorCategory::Weight));
  CHECK(weights.computeTilesBytes == 2 * elements / kReplicas);
}

// Every combination of RTS (weights, optimizer state, accumulators), streaming
// memory (those and the activations) and sharding domain, with and without
// gradient accumulation, trains the float16 MLP like its plain replicated run.
// A float16 gradient reduce-scattered to shards rounds its sum where the
// plain run's all-reduce rounds it, and an Orthogonal domain reduces in two
// stages (within the domain, then across), rounding twice: a value may move
// by an ulp of float16 at the tensor's scale, and the later steps carry it
// (seen: 1.0 ulp with SGD, 1.13 with Adam, float32 master weights and
// moments; accumulated in float32, the reduction is exact). Adam with
// float16 moments and no master weights divides by sqrt(v), whose one-ulp
// flips near float16's smallest normals move a weight by more (seen: 4.0
// ulps accumulated, 12.75 ulps in b0 with an Orthogonal domain and no
// accumulation). float32 runs of the same combinations agree within 1e-5 of
// the tensor's scale (locations_test).
TEST_CASE(
    "every RTS, streaming memory and sharding domain combination trains float16 like plain replication") {
  for (const OptimizerConfig& optimizer : {sgdMomentum(), adam(), adamHalfState()}) {
    const bool halfState = optimizer.type == OptimizerType::Adam && !optimizer.adam.masterWeights;
    int combinations = 0;
    double worst = 0;
    for (const int64_t accumulation : {1, 2}) {
      const Trained reference = train(plain(accumulation), optimizer);
      for (const CommGroup domain :
           {CommGroup{}, CommGroup(CommGroupType::Consecutive, 2), CommGroup(CommGroupType::Orthogonal, 2)}) {
        for (const int rts : {1, 2, 4, 7}) {
          for (const int offChip : {0, 1, 2, 8, 15}) {
            SessionOptions options = plain(accumulation);
            for (size_t c = 0; c < kCategories.size(); ++c) {
              TensorLocationSettings& settings = options.locationSettings(kCategories[c]);
              settings.location.replicatedTensorSharding =
                  (rts >> c & 1) != 0 ? ReplicatedTensorSharding::On : ReplicatedTensorSharding::Off;
              settings.location.shardingDomain = domain;
              settings.minElementsForReplicatedTensorSharding = 4;
            }
            for (int c = 0; c < 4; ++c) {
              TensorLocationSettings& settings = options.locationSettings(
                  c < 3 ? kCategories[static_cast<size_t>(c)] : TensorCategory::Activation);
              settings.location.storage =
                  (offChip >> c & 1) != 0 ? TensorStorage::OffChip : TensorStorage::OnChip;
            }
            const std::string what =
                fmt::format("{} accumulation {} domain {} rts {} offChip {}", toString(optimizer.type),
                            accumulation, domain.str(), rts, offChip);
            INFO(what);
            const Trained located = train(options, optimizer);
            requireSameVariables(located, reference);
            // The weights really are held as float16 shards when RTS is on.
            if ((rts & 1) != 0) CHECK_FALSE(variableNode(located.graph, "W0").metaShape.empty());
            const double difference = worstUlps(located, reference);
            CHECK(difference <= (halfState ? 16.0 : 2.0));
            worst = std::max(worst, difference);
            ++combinations;
          }
        }
      }
    }
    const std::string what = fmt::format(
        "{}{}: {} combinations, worst difference {:.3f} ulp of float16 at "
        "the tensor's scale",
        toString(optimizer.type), halfState ? " (float16 state)" : "", combinations, worst);
    MESSAGE(what);
    CHECK(combinations == 2 * 3 * 4 * 5);
  }
}
