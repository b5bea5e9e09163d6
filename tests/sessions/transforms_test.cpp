// The training transforms and their pipeline: structure of the rewritten
// graphs, and numbers through the reference evaluator (double precision):
// R replicas x af micro-batches x batch B must train exactly as one replica
// on the whole batch R*af*B.
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "derived_grouping.hpp"
#include "support/reference_evaluator.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/optimizers/sgd.hpp"
#include "tessera/simdevice/time_model.hpp"
#include "tessera/sessions/transform.hpp"
#include "test_support.hpp"
#include "training_pipeline.hpp"
#include "transforms/locations.hpp"
#include "transforms/recompute.hpp"

namespace tessera {
namespace {

constexpr int64_t kFeatures = 4;
constexpr int64_t kHidden = 5;
constexpr int64_t kClasses = 3;
constexpr int64_t kSteps = 3;

SessionOptions trainingOptions(int64_t replicas, int64_t accumulation, ReductionType reduction,
                               MeanReductionStrategy strategy = MeanReductionStrategy::Post) {
  SessionOptions options;
  options.enableReplicatedGraphs = replicas > 1;
  options.replicatedGraphCount = replicas;
  options.enableGradientAccumulation = accumulation > 1;
  options.accumulationFactor = accumulation;
  options.accumulationAndReplicationReductionType = reduction;
  options.meanAccumulationAndReplicationReductionStrategy = strategy;
  return options;
}

// Host data of one weight for each group: a fixed pattern plus the group's offset.
std::vector<float> weightData(int64_t elements, int64_t salt, const std::vector<double>& groupOffsets) {
  std::vector<float> data;
  for (double offset : groupOffsets) {
    for (int64_t i = 0; i < elements; ++i) {
      data.push_back(static_cast<float>(
          0.5 * std::sin(0.9 * static_cast<double>(i) + 1.7 * static_cast<double>(salt)) + offset));
    }
  }
  return data;
}

// x [B, 4] -> relu(x W0 + b0) W1 + b1 -> mean softmax cross-entropy.
TrainingGraph buildMlp(int64_t replicas, int64_t batch,
                       std::optional<ReplicaGrouping> grouping = std::nullopt,
                       const std::vector<double>& groupOffsets = {0.0}) {
  TrainingGraph training{Graph(replicas)};
  Graph& g = training.graph;
  const Tensor x = ops::input(g, "x", {batch, kFeatures});
  const Tensor labels = ops::input(g, "labels", {batch}, DType::Int32);
  const auto weight = [&](const std::string& name, Shape shape, int64_t salt) {
    return ops::variable(g, name, weightData(numElements(shape), salt, groupOffsets), shape, grouping);
  };
  const Tensor w0 = weight("W0", {kFeatures, kHidden}, 1);
  const Tensor b0 = weight("b0", {kHidden}, 2);
  const Tensor w1 = weight("W1", {kHidden, kClasses}, 3);
  const Tensor b1 = weight("b1", {kClasses}, 4);
  const Tensor hidden = ops::relu(ops::add(ops::matmul(x, w0), b0));
  const Tensor logits = ops::add(ops::matmul(hidden, w1), b1);
  const Tensor loss = ops::softmaxCrossEntropy(logits, labels, ReductionType::Mean);
  g.rename(loss.id(), "loss");
  training.tensors.loss = loss.id();
  return training;
}

std::vector<double> sampleFeatures(int64_t sample) {
  std::vector<double> values;
  for (int64_t j = 0; j < kFeatures; ++j) {
    values.push_back(std::cos(0.37 * static_cast<double>(sample) + 1.1 * static_cast<double>(j)));
  }
  return values;
}

double sampleLabel(int64_t sample) { return static_cast<double>((sample * 7 + 1) % kClasses); }

// The first sample of (step, replica, micro-batch).
using Sampler = std::function<int64_t(int64_t step, int64_t replica, int64_t microBatch)>;

Sampler contiguousSampler(int64_t replicas, int64_t accumulation, int64_t batch) {
  return [=](int64_t step, int64_t replica, int64_t microBatch) {
    return (step * replicas * accumulation + replica * accumulation + microBatch) * batch;
  };
}

void writeHyperParameters(test::ReferenceEvaluator& evaluator, const Optimizer& optimizer, int64_t step) {
  for (const HyperParameter& h : optimizer.hyperParameters(step)) {
    for (int64_t r = 0; r < evaluator.replicas(); ++r) evaluator.state(h.tensor, r).assign(1, h.value);
  }
}

struct Trained {
  TrainingGraph training;
  std::vector<double> losses;  // per step: the mean over replicas and micro-batches
  // After the last step, per replica, per weight.
  std::vector<std::vector<std::vector<double>>> weights;
  // The gradient the update consumed in the first step, per replica, per weight.
  std::vector<std::vector<std::vector<double>>> firstGradients;
};

Trained train(TrainingGraph training, const SessionOptions& options, const OptimizerConfig& config,
              int64_t batch, const Sampler& sampler) {
  const auto optimizer = makeOptimizer(config);
  runTrainingPipeline(training, options, *optimizer);
  const int64_t accumulation = options.getAccumulationFactor();
  const Graph& g = training.graph;
  test::ReferenceEvaluator evaluator(g);
  Trained result;
  for (int64_t step = 0; step < kSteps; ++step) {
    writeHyperParameters(evaluator, *optimizer, step);
    for (int64_t r = 0; r < evaluator.replicas(); ++r) {
      std::vector<double> x;
      std::vector<double> labels;
      for (int64_t i = 0; i < accumulation; ++i) {
        for (int64_t b = 0; b < batch; ++b) {
          const int64_t sample = sampler(step, r, i) + b;
          const std::vector<double> features = sampleFeatures(sample);
          x.insert(x.end(), features.begin(), features.end());
          labels.push_back(sampleLabel(sample));
        }
      }
      evaluator.feed(g.find("x"), r, x);
      evaluator.feed(g.find("labels"), r, labels);
    }
    evaluator.run();
    double sum = 0;
    int64_t count = 0;
    for (int64_t r = 0; r < evaluator.replicas(); ++r) {
      for (double value : evaluator.value(training.tensors.loss, r)) {
        sum += value;
        ++count;
      }
    }
    result.losses.push_back(sum / static_cast<double>(count));
    if (step == 0) {
      for (int64_t r = 0; r < evaluator.replicas(); ++r) {
        result.firstGradients.emplace_back();
        for (TensorId gradient : training.tensors.gradients) {
          result.firstGradients.back().push_back(evaluator.value(gradient, r));
        }
      }
    }
  }
  for (int64_t r = 0; r < evaluator.replicas(); ++r) {
    result.weights.emplace_back();
    for (TensorId w : training.tensors.weights) result.weights.back().push_back(evaluator.value(w, r));
  }
  result.training = std::move(training);
  return result;
}

void checkClose(const std::vector<double>& actual, const std::vector<double>& expected, double scale = 1.0) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(actual[i] - scale * expected[i]) <= 1e-9);
  }
}

void checkSameTraining(const Trained& actual, const Trained& expected, int64_t replica,
                       int64_t expectedReplica = 0) {
  checkClose(actual.losses, expected.losses);
  const auto& weights = actual.weights[static_cast<std::size_t>(replica)];
  const auto& reference = expected.weights[static_cast<std::size_t>(expectedReplica)];
  REQUIRE(weights.size() == reference.size());
  for (std::size_t k = 0; k < weights.size(); ++k) {
    CAPTURE(k);
    checkClose(weights[k], reference[k]);
  }
}

OptimizerConfig sgdConfig() {
  OptimizerConfig config;
  config.sgd = {.learningRate = 0.5, .momentum = 0.75, .weightDecay = 0.01};
  return config;
}

OptimizerConfig adamConfig() {
  OptimizerConfig config;
  config.type = OptimizerType::AdamW;
  config.adam = {.learningRate = 0.05, .weightDecay = 0.1};
  return config;
}

struct Split {
  std::string name;
  int64_t replicas;
  int64_t accumulation;
  int64_t batch;
  MeanReductionStrategy strategy;
};

TEST_CASE("replicas and micro-batches with Mean reduction train as one replica on the whole batch") {
  const std::vector<Split> splits{
      {"R=2 x batch 4", 2, 1, 4, MeanReductionStrategy::Post},
      {"R=4 x batch 2", 4, 1, 2, MeanReductionStrategy::Post},
      {"accumulation 2 x R=2 x batch 2, Post", 2, 2, 2, MeanReductionStrategy::Post},
      {"accumulation 2 x R=2 x batch 2, Running", 2, 2, 2, MeanReductionStrategy::Running},
      {"accumulation 4 x R=1 x batch 2, Running", 1, 4, 2, MeanReductionStrategy::Running},
  };
  for (const auto& named :
       std::vector<std::pair<std::string, OptimizerConfig>>{{"sgd", sgdConfig()}, {"adamw", adamConfig()}}) {
    const std::string& optimizerName = named.first;
    const OptimizerConfig& config = named.second;
    const Trained reference = train(buildMlp(1, 8), trainingOptions(1, 1, ReductionType::Mean), config, 8,
                                    contiguousSampler(1, 1, 8));
    // The losses must move, or the comparison proves nothing.
    CHECK(std::abs(reference.losses.back() - reference.losses.front()) > 1e-3);
    for (const Split& s : splits) {
      CAPTURE(optimizerName);
      CAPTURE(s.name);
      const Trained split =
          train(buildMlp(s.replicas, s.batch),
                trainingOptions(s.replicas, s.accumulation, ReductionType::Mean, s.strategy), config, s.batch,
                contiguousSampler(s.replicas, s.accumulation, s.batch));
      for (int64_t r = 0; r < s.replicas; ++r) checkSameTraining(split, reference, r);
    }
  }
}

TEST_CASE("the reduced gradient is the whole-batch mean gradient times the reduction's multiple") {
  struct Case {
    std::string name;
    int64_t replicas;
    int64_t accumulation;
    ReductionType reduction;
    MeanReductionStrategy strategy;
    double multiple;
  };
  const std::vector<Case> cases{
      {"R=2 Sum", 2, 1, ReductionType::Sum, MeanReductionStrategy::Post, 2.0},
      {"accumulation 2 Sum", 1, 2, ReductionType::Sum, MeanReductionStrategy::Post, 2.0},
      {"accumulation 2 x R=2 Sum", 2, 2, ReductionType::Sum, MeanReductionStrategy::Post, 4.0},
      {"accumulation 4 x R=2 Sum", 2, 4, ReductionType::Sum, MeanReductionStrategy::Running, 8.0},
      {"accumulation 2 x R=2 Mean Post", 2, 2, ReductionType::Mean, MeanReductionStrategy::Post, 1.0},
      {"accumulation 2 x R=2 Mean Running", 2, 2, ReductionType::Mean, MeanReductionStrategy::Running, 1.0},
  };
  constexpr int64_t kGlobalBatch = 16;
  const Trained reference = train(buildMlp(1, kGlobalBatch), trainingOptions(1, 1, ReductionType::Mean),
                                  sgdConfig(), kGlobalBatch, contiguousSampler(1, 1, kGlobalBatch));
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const int64_t batch = kGlobalBatch / (c.replicas * c.accumulation);
    const Trained split = train(buildMlp(c.replicas, batch),
                                trainingOptions(c.replicas, c.accumulation, c.reduction, c.strategy),
                                sgdConfig(), batch, contiguousSampler(c.replicas, c.accumulation, batch));
    for (int64_t r = 0; r < c.replicas; ++r) {
      for (std::size_t k = 0; k < reference.firstGradients[0].size(); ++k) {
        CAPTURE(k);
        checkClose(split.firstGradients[static_cast<std::size_t>(r)][k], reference.firstGradients[0][k],
                   c.multiple);
      }
    }
  }
}

TEST_CASE("grouped weights train per group: each group's gradients are reduced within the group") {
  for (const ReplicaGrouping grouping : {ReplicaGrouping(4, 1, 2), ReplicaGrouping(4, 2, 2)}) {
    CAPTURE(grouping.str());
    constexpr int64_t kBatch = 2;
    const std::vector<double> offsets{0.0, 0.25};
    const SessionOptions options = trainingOptions(4, 1, ReductionType::Mean);
    const Trained grouped = train(buildMlp(4, kBatch, grouping, offsets), options, sgdConfig(), kBatch,
                                  contiguousSampler(4, 1, kBatch));

    int64_t allReduces = 0;
    for (const OpNode& op : grouped.training.graph.ops()) {
      if (op.kind != OpKind::ReplicatedAllReduce) continue;
      ++allReduces;
      CHECK(op.attributes.grouping == grouping);
      CHECK(op.attributes.reduction == ReductionType::Mean);
    }
    CHECK(allReduces == 4);

    for (int64_t group = 0; group < grouping.numGroups(); ++group) {
      CAPTURE(group);
      const std::vector<int64_t> members = grouping.replicasAt(group);
      // Two replicas training the group's weights on the group's samples.
      const Sampler groupSamples = [&](int64_t step, int64_t replica, int64_t) {
        return (step * 4 + members[static_cast<std::size_t>(replica)]) * kBatch;
      };
      const Trained alone =
          train(buildMlp(2, kBatch, std::nullopt, {offsets[static_cast<std::size_t>(group)]}),
                trainingOptions(2, 1, ReductionType::Mean), sgdConfig(), kBatch, groupSamples);
      for (std::size_t j = 0; j < members.size(); ++j) {
        const auto& weights = grouped.weights[static_cast<std::size_t>(members[j])];
        for (std::size_t k = 0; k < weights.size(); ++k) {
          CAPTURE(k);
          checkClose(weights[k], alone.weights[j][k]);
        }
      }
    }
  }
}

TEST_CASE("the pipeline lists its transforms in order") {
  Sgd sgd({});
  TrainingTensors tensors;
  const auto pipeline = buildTrainingPipeline(trainingOptions(2, 2, ReductionType::Mean), sgd, tensors);
  std::vector<std::string> names;
  for (const auto& transform : pipeline) names.emplace_back(transform->name());
  CHECK(names == std::vector<std::string>{"virtualGraph", "pipelineStages", "executionPhases", "weightSharding",
                                          "autodiff", "pipelineBackward", "executionPhaseBackward", "recompute",
                                          "gradientAccumulation", "replication", "optimizerUpdate", "locations",
                                          "ipuCopy", "pipelineCycles", "executionPhaseFill"});
}

TEST_CASE("the training graph's structure") {
  TrainingGraph training = buildMlp(2, 3);
  const auto optimizer = makeOptimizer(sgdConfig());
  runTrainingPipeline(training, trainingOptions(2, 3, ReductionType::Mean, MeanReductionStrategy::Running),
                      *optimizer);
  const Graph& g = training.graph;
  const TrainingTensors& t = training.tensors;

  CHECK(g.tensor(g.find("x")).shape == Shape{3, 3, kFeatures});
  CHECK(g.tensor(g.find("labels")).shape == Shape{3, 3});
  CHECK(g.tensor(t.loss).name == "loss");
  CHECK(g.tensor(t.loss).shape == Shape{3});
  for (const char* micro : {"x.mb0", "x.mb1", "x.mb2", "loss.mb0", "loss.mb2"}) {
    CAPTURE(micro);
    CHECK(g.tryFind(micro).has_value());
  }

  const std::vector<std::string> weightNames{"W0", "b0", "W1", "b1"};
  REQUIRE(t.weights.size() == weightNames.size());
  REQUIRE(t.gradients.size() == weightNames.size());
  // The forward and backward passes are unrolled once per micro-batch.
  const auto countMatMuls = [](const Graph& graph) {
    int64_t count = 0;
    for (const OpNode& op : graph.ops()) count += op.kind == OpKind::MatMul ? 1 : 0;
    return count;
  };
  TrainingGraph single = buildMlp(2, 3);
  runTrainingPipeline(single, trainingOptions(2, 1, ReductionType::Mean), *makeOptimizer(sgdConfig()));
  CHECK(countMatMuls(single.graph) > 0);
  CHECK(countMatMuls(g) == 3 * countMatMuls(single.graph));

  for (std::size_t k = 0; k < weightNames.size(); ++k) {
    CAPTURE(weightNames[k]);
    const TensorNode& weight = g.tensor(t.weights[k]);
    CHECK(weight.name == weightNames[k]);
    CHECK(weight.category == TensorCategory::Weight);

    const TensorNode& accumulator = g.tensor(g.find(weightNames[k] + ".accum"));
    CHECK(accumulator.category == TensorCategory::Accumulator);
    CHECK(accumulator.shape == weight.shape);
    CHECK(accumulator.grouping == weight.grouping);
    const TensorNode& momentum = g.tensor(g.find(weightNames[k] + ".momentum"));
    CHECK(momentum.category == TensorCategory::OptimizerState);
    CHECK(momentum.grouping == weight.grouping);

    // The one all-reduce of this gradient reduces the accumulator over all replicas.
    std::vector<const OpNode*> reductions;
    for (const OpNode& op : g.ops()) {
      if (op.kind == OpKind::ReplicatedAllReduce &&
          g.storageOf(op.inputs[0]) == g.find(weightNames[k] + ".accum")) {
        reductions.push_back(&op);
      }
    }
    REQUIRE(reductions.size() == 1);
    CHECK(reductions[0]->attributes.grouping.value_or(ReplicaGrouping(2)) == ReplicaGrouping(2));
    CHECK(reductions[0]->attributes.reduction == ReductionType::Mean);
    CHECK(reductions[0]->outputs[0] == t.gradients[k]);

    // Accumulation: one copy and two running-mean steps per step.
    int64_t writes = 0;
    for (const OpNode& op : g.ops()) {
      if (isInplace(op.kind) && g.storageOf(op.inputs[0]) == g.find(weightNames[k] + ".accum")) ++writes;
    }
    CHECK(writes == 3);
    // The update: exactly one in-place write of the weight, after the all-reduce.
    int64_t updates = 0;
    for (const OpNode& op : g.ops()) {
      if (op.kind == OpKind::ScaledAddInplace && g.storageOf(op.inputs[0]) == t.weights[k]) ++updates;
    }
    CHECK(updates == 1);
  }
  int64_t allReduces = 0;
  for (const OpNode& op : g.ops()) allReduces += op.kind == OpKind::ReplicatedAllReduce ? 1 : 0;
  CHECK(allReduces == 4);
  CHECK_NOTHROW(g.schedule());
}

TEST_CASE("without replication or accumulation the pipeline adds no collective and no accumulator") {
  TrainingGraph training = buildMlp(1, 4);
  const auto optimizer = makeOptimizer(OptimizerConfig{});
  runTrainingPipeline(training, SessionOptions{}, *optimizer);
  const Graph& g = training.graph;
  for (const OpNode& op : g.ops()) CHECK_FALSE(isCollective(op.kind));
  for (const TensorNode& tensor : g.tensors()) CHECK(tensor.category != TensorCategory::Accumulator);
  CHECK(g.tensor(training.tensors.loss).shape.empty());
  CHECK(g.tensor(training.tensors.gradients[0]).name == "W0.grad");
}

TEST_CASE("a replica-sharded weight's gradient is reduced only over the replicas holding the same shard") {
  TrainingGraph training{Graph(4)};
  Graph& g = training.graph;
  // Shards over consecutive pairs: replicas 0 and 2 hold shard 0, 1 and 3 shard 1.
  const ShardedVariable w = ops::replicaShardedVariable(g, "W0", {1, 2, 3, 4}, {4}, std::nullopt, 2);
  const Tensor x = ops::input(g, "x", {4});
  const Tensor full = ops::replicatedAllGather(w.shard, ReplicaGrouping(4, 1, 2));
  training.tensors.loss = ops::reduceSum(ops::mul(x, full)).id();
  const auto optimizer = makeOptimizer(OptimizerConfig{});
  runTrainingPipeline(training, trainingOptions(4, 1, ReductionType::Mean), *optimizer);
  std::vector<ReplicaGrouping> allReduces;
  for (const OpNode& op : g.ops()) {
    if (op.kind == OpKind::ReplicatedAllReduce) allReduces.push_back(op.attributes.grouping.value());
  }
  REQUIRE(allReduces.size() == 1);
  CHECK(allReduces[0] == ReplicaGrouping(4, 2, 2));
  const TensorNode& gradient = g.tensor(training.tensors.gradients[0]);
  CHECK(gradient.name == "W0.grad.reduced");
  CHECK(gradient.shape == Shape{2});
  CHECK(g.op(gradient.producer).kind == OpKind::Mul);
}

TEST_CASE("transform errors name the transform") {
  SUBCASE("the graph's replication factor must be the options' one") {
    // Checked once, before the pipeline runs (checkReplicationFactor), as a
    // session does: tessera.graph.210, no longer the replication transform's
    // tessera.graph.208.
    TrainingGraph training = buildMlp(2, 4);
    const auto optimizer = makeOptimizer(OptimizerConfig{});
    const auto error = test::catchError<GraphError>([&] {
      planTraining(training.graph, training.tensors.loss, *optimizer, SessionOptions{}, DeviceSpec{});
    });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::ReplicationFactorMismatch);
    CHECK(error->subject() == "Graph");
    CHECK(
        error->detail().starts_with("the graph was built for 2 replica(s) but the session options give a "
                                    "global replication factor of 1"));
  }
  SUBCASE("a training graph needs a loss") {
    TrainingGraph training = buildMlp(1, 4);
    training.tensors.loss = kNoTensor;
    const auto optimizer = makeOptimizer(OptimizerConfig{});
    const auto error =
        test::catchError<GraphError>([&] { runTrainingPipeline(training, SessionOptions{}, *optimizer); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::UnknownTensor);
    CHECK(error->subject() == "loss");
    CHECK(error->detail().starts_with("autodiff: "));
  }
  SUBCASE("the loss must be a scalar") {
    TrainingGraph training = buildMlp(1, 4);
    training.tensors.loss = training.graph.find("x");
    const auto optimizer = makeOptimizer(OptimizerConfig{});
    const auto error =
        test::catchError<AutodiffError>([&] { runTrainingPipeline(training, SessionOptions{}, *optimizer); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::LossNotScalar);
    CHECK(error->subject() == "x");
    CHECK(error->detail().starts_with("autodiff: "));
  }
  SUBCASE("a taken accumulator name") {
    TrainingGraph training = buildMlp(1, 4);
    ops::constant(training.graph, "b1.accum", {0}, {});
    const auto optimizer = makeOptimizer(OptimizerConfig{});
    const auto error = test::catchError<GraphError>(
        [&] { runTrainingPipeline(training, trainingOptions(1, 2, ReductionType::Sum), *optimizer); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::DuplicateTensorName);
    CHECK(error->subject() == "b1.accum");
    CHECK(error->detail().starts_with("gradientAccumulation: "));
  }
  SUBCASE("accumulation disabled with a factor") {
    SessionOptions options;
    options.accumulationFactor = 2;
    Sgd sgd({});
    TrainingTensors tensors;
    const auto error = test::catchError<ConfigError>([&] { buildTrainingPipeline(options, sgd, tensors); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::AccumulationDisabledButFactor);
    CHECK(error->subject() == "/sessionOptions/accumulationFactor");
  }
}

TEST_CASE("shardHolders groups the replicas holding the same shard, as comparing every pair would") {
  // (variable groups, sharding domain) over 8 and 12 replicas: one value on
  // every replica (the transpose of the domain), and per-group values.
  struct Case {
    ReplicaGrouping variableGroups;
    ReplicaGrouping domain;
  };
  // Sharding domains and variable groups that tessera derives need not
  // follow PopXL's rule for the groupings a user gives.
  const auto derived = detail::derivedGrouping;
  const std::vector<Case> cases = {
      {ReplicaGrouping(8), ReplicaGrouping(8, 1, 2)},
      {ReplicaGrouping(8), ReplicaGrouping(8, 1, 4)},
      {ReplicaGrouping(8), ReplicaGrouping(8, 2, 4)},
      {ReplicaGrouping(8), ReplicaGrouping(8, 4, 2)},
      {ReplicaGrouping(8), ReplicaGrouping(8, 1, 8)},
      {ReplicaGrouping(8), derived(8, 2, 2)},
      {ReplicaGrouping(8, 1, 4), ReplicaGrouping(8, 1, 2)},
      {ReplicaGrouping(8, 2, 4), derived(8, 2, 2)},
      {ReplicaGrouping(12, 1, 6), ReplicaGrouping(12, 1, 3)},
      {ReplicaGrouping(12), derived(12, 2, 3)},
  };
  for (const Case& c : cases) {
    CAPTURE(c.variableGroups.str());
    CAPTURE(c.domain.str());
    const int64_t n = c.domain.numReplicas();
    const auto together = [&](int64_t a, int64_t b) {
      return c.variableGroups.groupAt(a) == c.variableGroups.groupAt(b) &&
             c.domain.indexInGroupAt(a) == c.domain.indexInGroupAt(b);
    };
    std::optional<ReplicaGrouping> holders;
    try {
      holders = shardHolders(c.variableGroups, c.domain, "W");
    } catch (const GraphError& e) {
      CHECK(e.code() == ErrorCode::InvalidCollective);
    }
    // Refused exactly when no grouping of the holders' size matches.
    bool exists = false;
    const int64_t size = c.variableGroups.groupSize() / c.domain.groupSize();
    for (int64_t stride = 1; stride <= n && !exists; ++stride) {
      if (n % (stride * size) != 0) continue;
      const ReplicaGrouping candidate = derived(n, stride, size);
      bool matches = true;
      for (int64_t a = 0; a < n; ++a)
        for (int64_t b = 0; b < n; ++b)
          matches = matches && (candidate.groupAt(a) == candidate.groupAt(b)) == together(a, b);
      exists = matches;
    }
    CHECK(holders.has_value() == exists);
    if (!holders) continue;
    for (int64_t a = 0; a < n; ++a) {
      for (int64_t b = 0; b < n; ++b) {
        CAPTURE(a);
        CAPTURE(b);
        CHECK((holders->groupAt(a) == holders->groupAt(b)) == together(a, b));
      }
    }
  }
}

// x [B, width] -> `layers` x tanh(h W_k) (the middle one a layer norm's
// ops) -> softmax cross-entropy: a chain whose activations the backward
// pass reads.
TrainingGraph buildDeepChain(int64_t layers, int64_t batch, int64_t width) {
  TrainingGraph training{Graph(1)};
  Graph& g = training.graph;
  Tensor h = ops::input(g, "x", {batch, width});
  const Tensor labels = ops::input(g, "labels", {batch}, DType::Int32);
  for (int64_t k = 0; k < layers; ++k) {
    const Tensor w = ops::variable(g, "W" + std::to_string(k), weightData(width * width, k, {0.0}), {width, width});
    h = ops::tanh(ops::matmul(h, w));
    if (k == layers / 2) {
      const auto first = static_cast<OpId>(g.ops().size());
      const Tensor centred = ops::sub(h, ops::reduceMean(h, {-1}, true));
      h = ops::div(centred, ops::sqrt(ops::add(ops::reduceMean(ops::mul(centred, centred), {-1}, true),
                                               ops::scalar(g, 1e-5, DType::Float32))));
      g.markNormalisation(first);
    }
  }
  const Tensor loss = ops::softmaxCrossEntropy(h, labels, ReductionType::Mean);
  g.rename(loss.id(), "loss");
  training.tensors.loss = loss.id();
  return training;
}

struct Planned {
  int64_t recomputedOps = 0;
  int64_t peakActivationBytes = 0;
  double stepSeconds = 0.0;
};

Planned planChain(RecomputationType type, const std::function<void(TrainingGraph&)>& annotate = {}) {
  TrainingGraph training = buildDeepChain(12, 512, 32);
  if (annotate) annotate(training);
  SessionOptions options;
  options.autoRecomputation = type;
  Sgd sgd({});
  runTrainingPipeline(training, options, sgd);
  Planned planned;
  for (const OpNode& op : training.graph.ops()) {
    if (op.recompute != RecomputeType::Recomputed) continue;
    ++planned.recomputedOps;
    CHECK(op.name.ends_with(".recomputed"));
  }
  Program program{training.graph};
  planned.peakActivationBytes = planMemory(program, DeviceSpec{}).perReplica.at(0).peakActivationBytes;
  planned.stepSeconds = modelTime(program, DeviceSpec{}).stepSeconds;
  return planned;
}

TEST_CASE("recomputation clones forward ops into the backward pass: the peak falls, the modelled step grows") {
  const Planned none = planChain(RecomputationType::None);
  CHECK(none.recomputedOps == 0);
  const Planned standard = planChain(RecomputationType::Standard);
  INFO("peak activation bytes: None ", none.peakActivationBytes, ", Standard ", standard.peakActivationBytes);
  CHECK(standard.recomputedOps > 0);
  CHECK(standard.peakActivationBytes < none.peakActivationBytes);
  CHECK(standard.stepSeconds > none.stepSeconds);
  // The layer norm's ops only.
  const Planned norm = planChain(RecomputationType::NormOnly);
  CHECK(norm.recomputedOps > 0);
  CHECK(norm.recomputedOps <= 7);
  // Without pipeline stages or hand-marked checkpoints the segment ending at
  // the loss is the whole forward pass: PopART's RecomputeAll keeps it.
  CHECK(planChain(RecomputationType::RecomputeAll).recomputedOps == 0);
}

TEST_CASE("per-op marks override the automatic choice") {
  // One tanh marked Recompute under None: it alone is cloned.
  const Planned one = planChain(RecomputationType::None, [](TrainingGraph& training) {
    ops::recomputeOutputInBackwardPass(Tensor{&training.graph, training.graph.find("Tanh.3")});
  });
  CHECK(one.recomputedOps == 1);
  // RecomputeAll with a checkpoint by hand: the ops before it are recomputed.
  const Planned all = planChain(RecomputationType::RecomputeAll, [](TrainingGraph& training) {
    for (const OpNode& op : training.graph.ops()) {
      if (op.kind == OpKind::Tanh && op.name == "Tanh.8") {
        ops::recomputeOutputInBackwardPass(Tensor{&training.graph, op.outputs.front()}, RecomputeType::Checkpoint);
      }
    }
  });
  CHECK(all.recomputedOps > 0);
  // Every op marked Checkpoint: Standard recomputes nothing.
  const Planned kept = planChain(RecomputationType::Standard, [](TrainingGraph& training) {
    for (std::size_t id = 0; id < training.graph.ops().size(); ++id) {
      training.graph.setRecompute(static_cast<OpId>(id), RecomputeType::Checkpoint);
    }
  });
  CHECK(kept.recomputedOps == 0);
}

TEST_CASE("recomputation errors: Pipeline without pipelining, a source marked Recompute") {
  SessionOptions options;
  options.autoRecomputation = RecomputationType::Pipeline;
  const auto pipeline = test::catchError<ConfigError>([&] { validate(options); });
  REQUIRE(pipeline.has_value());
  CHECK(pipeline->id() == "tessera.config.160");
  CHECK(pipeline->subject() == "/sessionOptions/autoRecomputation");
  TrainingGraph training = buildDeepChain(2, 4, 8);
  const auto source = test::catchError<GraphError>(
      [&] { ops::recomputeOutputInBackwardPass(Tensor{&training.graph, training.graph.find("W0")}); });
  REQUIRE(source.has_value());
  CHECK(source->id() == "tessera.graph.220");
  CHECK(std::string(source->what()).find("W0 is a Variable, which cannot be recomputed") != std::string::npos);
  const auto recomputed = test::catchError<GraphError>([&] {
    training.graph.setRecompute(training.graph.tensor(training.graph.find("loss")).producer,
                                RecomputeType::Recomputed);
  });
  REQUIRE(recomputed.has_value());
  CHECK(recomputed->id() == "tessera.graph.220");
}

}  // namespace
}  // namespace tessera
