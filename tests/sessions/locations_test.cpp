// Tensor locations decided by the options: every combination of RTS,
// streaming memory and IO tiles trains exactly like the plain replicated run.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>
#include <cmath>
#include <string>
#include <vector>

#include "mnist_rts/program.hpp"
#include "tessera/lib/autodiff.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/sessions/session.hpp"
#include "support/toy_training.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

constexpr int64_t kReplicas = 4;
constexpr int64_t kAccumulation = 2;
constexpr int64_t kSteps = 3;
constexpr int64_t kGlobalBatch = 8;
constexpr int64_t kFeatures = 12;

using test::ToyData;

ToyData toyData(int64_t samples) { return test::toyData(samples, kFeatures, 7); }

ModelConfig toyModel() {
  ModelConfig model;
  model.layers = {kFeatures, 8, 4};
  return model;
}

OptimizerConfig sgdMomentum() {
  OptimizerConfig config;
  config.type = OptimizerType::Sgd;
  config.sgd.learningRate = 0.1;
  config.sgd.momentum = 0.9;
  config.sgd.weightDecay = 0.01;
  return config;
}

OptimizerConfig adam() {
  OptimizerConfig config;
  config.type = OptimizerType::Adam;
  config.adam.learningRate = 0.01;
  return config;
}

SessionOptions plain() {
  SessionOptions options;
  options.enableReplicatedGraphs = true;
  options.replicatedGraphCount = kReplicas;
  options.enableGradientAccumulation = true;
  options.accumulationFactor = kAccumulation;
  options.accumulationAndReplicationReductionType = ReductionType::Mean;
  return options;
}

struct Trained {
  std::vector<double> losses;
  std::vector<std::pair<std::string, HostTensor>> variables;  // weights, then optimizer state
  Graph graph{1};
};

Trained train(const SessionOptions& options, const OptimizerConfig& optimizer) {
  const ToyData data = toyData(kGlobalBatch * kSteps);
  const int64_t batch = kGlobalBatch / (kReplicas * kAccumulation);
  MlpGraph mlp = buildMlp(toyModel(), batch, kReplicas, 5);
  TrainingSession session(std::move(mlp.graph), mlp.loss, makeOptimizer(optimizer), options, makeSimDevice());
  Trained result;
  result.losses = test::trainToySteps(session, data, kGlobalBatch, 0, kSteps);
  result.variables = test::trainedVariables(session);
  result.graph = session.graph();
  return result;
}

double worstRelative(const Trained& a, const Trained& b) {
  double worst = 0;
  const auto relative = [](double x, double y) { return std::abs(x - y) / std::max(1e-3, std::abs(y)); };
  for (size_t i = 0; i < a.losses.size(); ++i) worst = std::max(worst, relative(a.losses[i], b.losses[i]));
  for (size_t v = 0; v < a.variables.size(); ++v) {
    const std::vector<float>& x = a.variables[v].second.data;
    const std::vector<float>& y = b.variables[v].second.data;
    // Tiny values (Adam's second moments) compare against the tensor's scale.
    double scale = 1e-6;
    for (float value : y) scale = std::max(scale, static_cast<double>(std::abs(value)));
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]) / scale);
  }
  return worst;
}

void requireSameShape(const Trained& a, const Trained& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  REQUIRE(a.variables.size() == b.variables.size());
  for (size_t v = 0; v < a.variables.size(); ++v) {
    REQUIRE(a.variables[v].first == b.variables[v].first);
    REQUIRE(a.variables[v].second.shape == b.variables[v].second.shape);
  }
}

constexpr std::array kCategories = {TensorCategory::Weight, TensorCategory::OptimizerState,
                                    TensorCategory::Accumulator};

int64_t count(const Graph& graph, OpKind kind) {
  return std::count_if(graph.ops().begin(), graph.ops().end(), [&](const OpNode& op) { return op.kind == kind; });
}

const TensorNode& variableNode(const Graph& graph, std::string_view name) { return graph.tensor(graph.find(name)); }

}  // namespace

TEST_CASE("every combination of RTS, streaming memory, IO tiles and sharding domain trains like plain replication") {
  for (const OptimizerConfig& optimizer : {sgdMomentum(), adam()}) {
    const Trained reference = train(plain(), optimizer);
    int combinations = 0;
    double worst = 0;
    for (const CommGroup domain : {CommGroup{}, CommGroup(CommGroupType::Consecutive, 2),
                                   CommGroup(CommGroupType::Orthogonal, 2)}) {
      for (const bool io : {false, true}) {
        for (int rts = 0; rts < 8; ++rts) {
          for (int offChip = 0; offChip < 16; ++offChip) {
            SessionOptions options = plain();
            options.numIOTiles = io ? 32 : 0;
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
              settings.location.storage = (offChip >> c & 1) != 0 ? TensorStorage::OffChip : TensorStorage::OnChip;
              if (io) {
                settings.location.loadTileSet = TileSet::IO;
                settings.location.storageTileSet = TileSet::IO;
              }
            }
            INFO(toString(optimizer.type) << " domain " << domain.str() << (io ? std::string(" IO tiles") : std::string()) << " rts " << rts
                                          << " offChip " << offChip);
            const Trained located = train(options, optimizer);
            requireSameShape(located, reference);
            const double difference = worstRelative(located, reference);
            CHECK(difference <= 1e-5);
            worst = std::max(worst, difference);
            ++combinations;
          }
        }
      }
    }
    MESSAGE(toString(optimizer.type) << ": " << combinations << " combinations, worst relative difference "
                                     << worst);
    CHECK(combinations == 3 * 2 * 8 * 16);
  }
}

TEST_CASE("the transforms place tensors where the options say") {
  SessionOptions options = plain();
  options.numIOTiles = 32;
  TensorLocationSettings& weights = options.weightTensorLocationSettings;
  weights.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
  weights.location.shardingDomain = CommGroup(CommGroupType::Orthogonal, 2);
  weights.minElementsForReplicatedTensorSharding = 4;
  TensorLocationSettings& state = options.optimizerStateTensorLocationSettings;
  state.location = TensorLocation(TensorStorage::OffChip, TileSet::IO, TileSet::IO);
  options.accumulatorTensorLocationSettings.location.storageTileSet = TileSet::IO;
  options.accumulatorTensorLocationSettings.location.loadTileSet = TileSet::IO;
  options.activationTensorLocationSettings.location.storage = TensorStorage::OffChip;
  const Trained trained = train(options, sgdMomentum());
  const Graph& graph = trained.graph;

  // W0 (12x8) is sharded over the Orthogonal groups {0,2} {1,3}.
  const TensorNode& w0 = variableNode(graph, "W0");
  CHECK(w0.shape == Shape{48});
  CHECK(w0.metaShape == Shape{12, 8});
  REQUIRE(w0.shardDomain);
  CHECK(*w0.shardDomain == ReplicaGrouping(4, 2, 2));
  // Its momentum is unsharded (optimizer state RTS Off), in streaming memory.
  const TensorNode& momentum = variableNode(graph, "W0.momentum");
  CHECK(momentum.shape == Shape{12, 8});
  CHECK(momentum.metaShape.empty());
  CHECK(momentum.remoteBuffer >= 0);
  // The accumulator lives on the IO tiles, copied to the compute tiles around its use.
  const TensorNode& accumulator = variableNode(graph, "W0.accum");
  CHECK(accumulator.tileSet == TileSet::IO);
  CHECK(accumulator.shape == Shape{12, 8});
  // Loads and stores: one per optimizer state tensor (4) and per offloaded activation.
  CHECK(count(graph, OpKind::RemoteLoad) == count(graph, OpKind::RemoteStore));
  CHECK(count(graph, OpKind::RemoteLoad) > 4);
  // A weight's gradient is reduce-scattered within the domain and all-reduced across it.
  CHECK(count(graph, OpKind::ReplicatedReduceScatter) >= 2 * kAccumulation);
}

TEST_CASE("activations read by the backward pass are kept on the IO tiles or in streaming memory") {
  const ModelConfig model = toyModel();
  const int64_t batch = kGlobalBatch / kReplicas;
  SessionOptions options;
  options.enableReplicatedGraphs = true;
  options.replicatedGraphCount = kReplicas;
  options.numIOTiles = 32;
  TensorLocation& activations = options.activationTensorLocationSettings.location;
  activations.loadTileSet = TileSet::IO;
  const auto plan = [&] {
    MlpGraph mlp = buildMlp(model, batch, kReplicas, 5);
    return planTraining(std::move(mlp.graph), mlp.loss, *makeOptimizer(sgdMomentum()), options, DeviceSpec{});
  };
  const auto placement = [](const RunPlan& p, std::string_view name) {
    const auto it = std::find_if(p.tensors.begin(), p.tensors.end(),
                                 [&](const TensorPlacement& t) { return t.name == name; });
    REQUIRE(it != p.tensors.end());
    return *it;
  };
  // The forward values the backward pass reads: Add, Relu (8 x 2 each) and
  // Add.1 (4 x 2, the logits).
  const int64_t keptBytes = (2 * batch * 8 + batch * 4) * 4;

  activations.storageTileSet = TileSet::IO;
  const RunPlan onIo = plan();
  CHECK(placement(onIo, "Relu").storage == TensorStorage::OnChip);
  CHECK(placement(onIo, "Relu").storageTileSet == TileSet::IO);
  CHECK(placement(onIo, "Add.1").storageTileSet == TileSet::IO);
  // Read only by the forward pass: stays on the compute tiles, and says why.
  CHECK(placement(onIo, "MatMul").storageTileSet == TileSet::Compute);
  CHECK(placement(onIo, "MatMul").reason.find("storageTileSet IO -> Compute") != std::string::npos);
  // The copies on the IO tiles are part of their tensor's placement.
  CHECK(std::none_of(onIo.tensors.begin(), onIo.tensors.end(), [](const TensorPlacement& t) {
    return t.name.ends_with(".onIo") || t.name.ends_with(".onCompute");
  }));
  CHECK(onIo.memory.perReplica.front().ioTilesBytes == keptBytes);
  CHECK(onIo.memory.perReplica.front().streamingBytes == 0);

  activations.storageTileSet = TileSet::Compute;
  activations.storage = TensorStorage::OffChip;
  const RunPlan offChip = plan();
  // Staged through the IO tiles on the way out and back, still OffChip.
  CHECK(placement(offChip, "Relu").storage == TensorStorage::OffChip);
  CHECK(placement(offChip, "MatMul").storage == TensorStorage::OnChip);
  CHECK(offChip.memory.perReplica.front().streamingBytes == keptBytes);
}

TEST_CASE("a sharding domain that splits a variable's groups is rejected, naming the setting") {
  Graph g(kReplicas);
  Tensor x = ops::input(g, "x", {2, 6});
  // Two groups of two consecutive replicas hold different values.
  Tensor w = ops::variable(g, "w", std::vector<float>(2 * 6 * 3, 0.5f), {6, 3}, ReplicaGrouping(4, 1, 2));
  Tensor loss = ops::reduceSum(ops::matmul(x, w));
  SessionOptions options = plain();
  options.enableGradientAccumulation = false;
  options.accumulationFactor = 1;
  options.weightTensorLocationSettings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
  options.weightTensorLocationSettings.minElementsForReplicatedTensorSharding = 1;
  const auto error = test::catchError<ConfigError>([&] {
    TrainingSession(std::move(g), loss.id(), makeOptimizer(sgdMomentum()), options, makeSimDevice());
  });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::UnsupportedCombination);
  CHECK(error->subject() == "/sessionOptions/weightTensorLocationSettings/location/shardingDomain");
  CHECK(error->detail().find("w: the sharding domain") != std::string::npos);
}

namespace {

// The edges that show how a weight is held and updated: where its full value
// comes from (a load from its buffer, an all-gather of its shard) and goes
// (the matmul), how its update gets a sharded gradient (a reduce-scatter, or
// an all-reduce then a sharded slice: the same reduction) and where the
// updated shard goes (back to its buffer).
std::set<std::string> weightStructure(const Graph& g, std::string_view name) {
  std::set<std::string> edges;
  const TensorNode& variable = variableNode(g, name);
  const TensorId var = g.find(name);
  const auto kindOf = [&](TensorId t) { return g.op(g.tensor(t).producer).kind; };
  // The tensor the program computes with: the variable, or its load.
  std::vector<TensorId> held{var};
  for (const OpNode& op : g.ops()) {
    if (op.kind == OpKind::RemoteLoad && op.attributes.remoteBuffer == variable.remoteBuffer &&
        variable.remoteBuffer >= 0) {
      held.push_back(op.outputs[0]);
      edges.insert("RemoteLoad(buffer)");
    }
  }
  for (const OpNode& op : g.ops()) {
    if (op.kind == OpKind::ReplicatedAllGather && std::count(held.begin(), held.end(), op.inputs[0]) != 0) {
      edges.insert(fmt::format("{}->ReplicatedAllGather", toString(kindOf(op.inputs[0]))));
      for (OpId consumer : g.tensor(op.outputs[0]).consumers) {
        edges.insert(fmt::format("ReplicatedAllGather->{}", toString(g.op(consumer).kind)));
      }
    }
    if (op.kind == OpKind::ScaledAddInplace && std::count(held.begin(), held.end(), g.storageOf(op.inputs[0])) != 0) {
      edges.insert("ScaledAddInplace(shard)");
      // Up from the update's operand to the reduction that made it a shard.
      TensorId t = op.inputs[1];
      while (g.tensor(t).producer != kNoOp) {
        const OpNode& producer = g.op(g.tensor(t).producer);
        if (producer.kind == OpKind::ReplicatedReduceScatter || producer.kind == OpKind::ReplicaShardedSlice) {
          edges.insert("sharded gradient");
          break;
        }
        if (producer.inputs.empty()) break;
        t = producer.inputs[0];
      }
    }
    // The updated storage goes back to the buffer (the store runs after the
    // update whether it names the update's output or the storage it modified).
    if (op.kind == OpKind::RemoteStore && op.attributes.remoteBuffer == variable.remoteBuffer &&
        std::count(held.begin(), held.end(), g.storageOf(op.inputs[0])) != 0) {
      edges.insert("ScaledAddInplace->RemoteStore(buffer)");
    }
  }
  return edges;
}

}  // namespace

TEST_CASE("from a plain graph, the transforms make the structure the mnist_rts sample writes by hand") {
  using namespace mnist_rts;
  Options opts;
  opts.replicationFactor = 2;
  opts.batchSize = 4;
  opts.rts = true;
  const InitialWeights init = initialWeights(0);
  const TrainProgram sample = buildTrainProgram(opts, init);

  // The same model as a plain graph; where its weights live comes from the options.
  Graph g(2);
  Tensor x = ops::input(g, "x", {4, 28, 28});
  Tensor labels = ops::input(g, "labels", {4}, DType::Int32);
  Tensor w0 = ops::variable(g, "W0", init.w0, {kPixels, kHidden});
  Tensor b0 = ops::variable(g, "b0", init.b0, {kHidden});
  Tensor w1 = ops::variable(g, "W1", init.w1, {kHidden, kClasses});
  Tensor b1 = ops::variable(g, "b1", init.b1, {kClasses});
  Tensor h = ops::gelu(ops::add(ops::matmul(ops::reshape(x, {4, kPixels}), w0), b0));
  Tensor loss = ops::softmaxCrossEntropy(ops::add(ops::matmul(h, w1), b1), labels);
  SessionOptions options = sessionOptions(opts);
  options.accumulationAndReplicationReductionType = ReductionType::Mean;
  options.tensorLocationSettingsOverride["W0"] =
      TensorLocation(TensorStorage::OnChip, ReplicatedTensorSharding::On);
  options.tensorLocationSettingsOverride["W1"] =
      TensorLocation(TensorStorage::OffChip, ReplicatedTensorSharding::On);
  OptimizerConfig sgd;
  sgd.sgd.learningRate = opts.lr;
  TrainingSession session(std::move(g), loss.id(), makeOptimizer(sgd), options, makeSimDevice());

  for (const std::string name : {"W0", "W1"}) {
    INFO(name);
    const std::set<std::string> handWritten = weightStructure(sample.graph, name);
    const std::set<std::string> transformed = weightStructure(session.graph(), name);
    CHECK(fmt::format("{}", fmt::join(handWritten, ", ")) == fmt::format("{}", fmt::join(transformed, ", ")));
    CHECK(transformed.count("sharded gradient") == 1);
    CHECK(transformed.count("ReplicatedAllGather->MatMul") == 1);
  }
  CHECK(weightStructure(session.graph(), "W1").count("ScaledAddInplace->RemoteStore(buffer)") == 1);
  CHECK(weightStructure(session.graph(), "W1").count("RemoteLoad->ReplicatedAllGather") == 1);
  CHECK(weightStructure(session.graph(), "W0").count("Variable->ReplicatedAllGather") == 1);
}
