// Runs split over instances (threads connected by in-process communicators)
// against one instance running every replica: collectives whose groups span
// instances, host reads of shards that live elsewhere, whole training
// sessions, and the start-up check that instances run the same program.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "executor.hpp"
#include "tessera/popdist/communicator.hpp"
#include "tessera/app/dataset.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"
#include "simdevice/device_checks.hpp"
#include "support/instances.hpp"
#include "test_support.hpp"

using namespace tessera;
using namespace std::chrono_literals;

namespace {

using test::errorOf;
using test::pseudoRandom;

// Runs body(instance, communicator) for every instance on its own thread
// (one instance: no communicator) and returns what each threw.
std::vector<std::exception_ptr> onInstances(
    int64_t instances, const std::function<void(int64_t, std::shared_ptr<Communicator>)>& body) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(instances));
  if (instances == 1) {
    try {
      body(0, nullptr);
    } catch (...) {
      errors[0] = std::current_exception();
    }
    return errors;
  }
  return test::onInstances(instances, body, 20s);
}

void requireNoErrors(const std::vector<std::exception_ptr>& errors) {
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      FAIL(x.what());
    }
  }
}

// Every stored tensor's value on every global replica (empty for tensors
// the device does not store), after `runs` runs of `graph` split over
// `instances`; feeds are [replicas, ...] per input, sliced per instance.
struct DeviceResult {
  std::vector<std::vector<std::vector<float>>> values;  // [tensor][global replica]
  sim::PlanStats stats;
};

DeviceResult runSplit(const Graph& graph, int64_t instances, ExecutionMode mode,
                      const std::map<TensorId, std::vector<float>>& feeds, int runs = 2) {
  const int64_t replicas = graph.replicationFactor();
  const int64_t local = replicas / instances;
  DeviceResult result;
  result.values.assign(graph.tensors().size(),
                       std::vector<std::vector<float>>(static_cast<size_t>(replicas)));
  std::vector<sim::PlanStats> stats(static_cast<size_t>(instances));
  requireNoErrors(onInstances(instances, [&](int64_t instance, std::shared_ptr<Communicator> communicator) {
    Program program{graph};
    program.replicas.localReplicas = local;
    program.replicas.globalReplicas = replicas;
    program.replicas.replicaOffset = instance * local;
    sim::SimExecutable executable(std::move(program), DeviceSpec{}, mode, communicator);
    std::vector<std::vector<float>> mine;
    std::vector<Executable::Feed> list;
    for (const auto& [t, data] : feeds) {
      const auto n = data.size() / static_cast<size_t>(replicas);
      mine.emplace_back(
          data.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(instance * local) * n),
          data.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>((instance + 1) * local) * n));
      list.push_back({t, mine.back()});
    }
    for (int i = 0; i < runs; ++i) executable.run(list);
    stats[static_cast<size_t>(instance)] = executable.stats();
    for (std::size_t t = 0; t < graph.tensors().size(); ++t) {
      const ReplicaGrouping layout = executable.layout(static_cast<TensorId>(t));
      const auto n = static_cast<size_t>(numElements(graph.tensors()[t].shape));
      std::vector<float> groups(static_cast<size_t>(layout.numGroups()) * n);
      try {
        executable.read(static_cast<TensorId>(t), groups);
      } catch (const DeviceError&) {
        continue;  // computed inside a fused step
      }
      for (int64_t r = 0; r < local; ++r) {
        const auto first =
            groups.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(layout.groupAt(r)) * n);
        result.values[t][static_cast<size_t>(instance * local + r)].assign(
            first, first + static_cast<std::ptrdiff_t>(n));
      }
    }
  }));
  result.stats = stats.front();
  return result;
}

std::map<TensorId, std::vector<float>> feedsOf(const Graph& graph, uint64_t seed) {
  std::map<TensorId, std::vector<float>> feeds;
  for (const OpNode& op : graph.ops()) {
    if (op.kind != OpKind::Input) continue;
    const auto n =
        static_cast<size_t>(graph.replicationFactor() * numElements(graph.tensor(op.outputs[0]).shape));
    feeds[op.outputs[0]] = pseudoRandom(n, seed + static_cast<uint64_t>(op.outputs[0]));
  }
  return feeds;
}

// Bitwise: the split run gathers every member's value and reduces in the
// same replica order as one instance.
void checkSameAsOneInstance(const Graph& graph, int64_t instances, ExecutionMode mode) {
  const auto feeds = feedsOf(graph, 11);
  const DeviceResult one = runSplit(graph, 1, mode, feeds);
  const DeviceResult split = runSplit(graph, instances, mode, feeds);
  int64_t compared = 0;
  for (std::size_t t = 0; t < graph.tensors().size(); ++t) {
    for (std::size_t r = 0; r < one.values[t].size(); ++r) {
      if (one.values[t][r].empty() || split.values[t][r].empty()) continue;
      INFO("tensor " << graph.tensors()[t].name << " replica " << r);
      CHECK(one.values[t][r] == split.values[t][r]);
      ++compared;
    }
  }
  CHECK(compared > 0);
  CHECK(split.stats.fusedGemmAllReduces == one.stats.fusedGemmAllReduces);
}

}  // namespace

TEST_CASE("collectives across instances give one instance's bits, for every grouping") {
  // (replicas, instances, grouping): groups within an instance, across all,
  // consecutive pairs that straddle instances, and orthogonal ones.
  struct Row {
    int64_t instances;
    ReplicaGrouping grouping;
  };
  const std::vector<Row> rows = {
      {2, ReplicaGrouping(4, 1, 4)}, {2, ReplicaGrouping(4, 1, 2)}, {2, ReplicaGrouping(4, 2, 2)},
      {4, ReplicaGrouping(4, 1, 4)}, {4, ReplicaGrouping(4, 1, 2)}, {4, ReplicaGrouping(4, 2, 2)},
      {2, ReplicaGrouping(8, 1, 4)}, {4, ReplicaGrouping(8, 4, 2)}, {4, ReplicaGrouping(8, 2, 4)},
  };
  for (const Row& row : rows) {
    for (const ReductionType reduction : {ReductionType::Sum, ReductionType::Mean}) {
      const int64_t replicas = row.grouping.numReplicas();
      INFO(row.instances << " instances, " << row.grouping.str() << ", " << toString(reduction));
      Graph g(replicas);
      constexpr int64_t n = 30;  // 30 over 4 shards pads two of them
      const Tensor x = ops::input(g, "x", {n});
      const Tensor shared = ops::variable(g, "shared", pseudoRandom(n, 1), {n});
      const Tensor grouped =
          ops::variable(g, "grouped", pseudoRandom(static_cast<size_t>(n * replicas / 2), 2), {n},
                        ReplicaGrouping(replicas, 1, 2));
      ops::replicatedAllReduce(x, reduction, row.grouping);
      ops::replicatedAllReduce(shared, reduction, row.grouping);
      ops::replicatedAllReduce(grouped, reduction, row.grouping);
      const Tensor shard = ops::replicatedReduceScatter(x, reduction, row.grouping);
      ops::replicatedAllGather(shard, row.grouping);
      ops::replicatedReduceScatter(grouped, reduction, row.grouping);
      const Tensor own = ops::replicaShardedSlice(x, row.grouping);
      ops::replicatedAllGather(own, row.grouping, {n});
      const ShardedVariable w = ops::replicaShardedVariable(
          g, "w", pseudoRandom(static_cast<size_t>(n * row.grouping.numGroups()), 3), {n}, row.grouping);
      ops::replicatedAllGather(w.shard, row.grouping);
      for (const ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
        INFO(toString(mode));
        checkSameAsOneInstance(g, row.instances, mode);
      }
    }
  }
}

TEST_CASE("the fused gradient product and all-reduce or reduce-scatter runs across instances as on one") {
  for (const bool scatter : {false, true}) {
    for (const int64_t instances : {2, 4}) {
      for (const ReplicaGrouping grouping : {ReplicaGrouping(4, 1, 4), ReplicaGrouping(4, 1, 2)}) {
        // 5 x 3 = 15 elements: a reduce-scatter's shards carry padding.
        for (const int64_t columns : {4, 3}) {
          INFO(instances << " instances, " << grouping.str()
                         << (scatter ? ", reduce-scatter" : ", all-reduce") << ", 5 x " << columns);
          Graph g(4);
          const Tensor x = ops::input(g, "x", {8, 5});
          const Tensor dy = ops::input(g, "dy", {8, columns});
          const Tensor product = ops::matmul(ops::transpose(x), dy);
          if (scatter) {
            ops::replicatedReduceScatter(product, ReductionType::Mean, grouping);
          } else {
            ops::replicatedAllReduce(product, ReductionType::Mean, grouping);
          }
          const auto feeds = feedsOf(g, 5);
          const DeviceResult one = runSplit(g, 1, ExecutionMode::Vectorized, feeds);
          REQUIRE(one.stats.fusedGemmAllReduces == 1);
          checkSameAsOneInstance(g, instances, ExecutionMode::Vectorized);
        }
      }
    }
  }
}

TEST_CASE("collectives that do not depend on each other share one message between instances") {
  Graph g(4);
  const Tensor x = ops::input(g, "x", {6});
  const Tensor y = ops::input(g, "y", {6});
  // Two independent reductions share a message, which must leave before x
  // changes in place (else the instances would send the new x); the
  // reduce-scatter of their sum and the all-gather of that need one each.
  const Tensor a = ops::replicatedAllReduce(x);
  const Tensor b = ops::replicatedAllReduce(ops::mul(y, y), ReductionType::Mean);
  ops::scaledAddInplace(x, y, 1.0, 2.0);
  const Tensor c = ops::replicatedReduceScatter(ops::add(a, b));
  ops::replicatedAllGather(c);
  const auto feeds = feedsOf(g, 3);
  const DeviceResult split = runSplit(g, 2, ExecutionMode::Vectorized, feeds);
  CHECK(split.stats.exchanges == 3);
  checkSameAsOneInstance(g, 2, ExecutionMode::Vectorized);
}

TEST_CASE("a device without the run's instances refuses a program that needs them") {
  Graph g(4);
  const Tensor sum = ops::replicatedAllReduce(
      ops::matmul(ops::transpose(ops::input(g, "x", {3, 2})), ops::input(g, "dy", {3, 2})));
  ops::replicatedReduceScatter(ops::input(g, "z", {5}));
  Program program{g};
  program.replicas.localReplicas = 2;
  program.replicas.globalReplicas = 4;
  program.replicas.replicaOffset = 2;
  const auto check = [&](std::shared_ptr<Communicator> communicator, const std::string& subject,
                         const std::string& fragment) {
    const auto error = test::catchError<DeviceError>(
        [&] { makeSimDevice({}, ExecutionMode::Vectorized, communicator)->load(program); });
    REQUIRE(error.has_value());
    INFO(error->what());
    CHECK(error->code() == ErrorCode::InvalidProgram);
    CHECK(error->subject() == subject);
    CHECK(error->detail().find(fragment) != std::string::npos);
  };
  check(nullptr, sum.name(), "beyond the 2 replicas this device simulates");
  check(makeInProcessCommunicators(3)[1], "Program.globalReplicas",
        "the program runs replicas 2..3 of 4 as instance 1 of 2, but the device is instance 1 of 3");
  check(makeInProcessCommunicators(2)[0], "Program.globalReplicas", "but the device is instance 0 of 2");
}

// ---------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------

TEST_CASE("instances read contiguous parts of the same global batches whatever the split") {
  // A run of 4 replicas, batch 2, accumulation 3: a global batch of 24 samples.
  struct Row {
    int64_t instances;
    int64_t stepSamples;  // batch x local replicas x accumulation
  };
  for (const Row row : {Row{1, 24}, Row{2, 12}, Row{4, 6}}) {
    CAPTURE(row.instances);
    for (int64_t step = 0; step < 3; ++step) {
      std::vector<int64_t> positions;
      for (int64_t i = 0; i < row.instances; ++i) {
        const int64_t first = instanceStepOffset(step, row.stepSamples, row.instances, i);
        CHECK(first == (step * row.instances + i) * row.stepSamples);
        for (int64_t k = 0; k < row.stepSamples; ++k) positions.push_back(first + k);
      }
      std::vector<int64_t> global(24);
      std::iota(global.begin(), global.end(), step * 24);
      CHECK(positions == global);
    }
  }
  struct Bad {
    int64_t step, stepSamples, instances, index;
    std::string fragment;
  };
  for (const Bad& bad : {Bad{-1, 4, 2, 0, "step is -1"}, Bad{0, 0, 2, 0, "stepSamples is 0"},
                         Bad{0, 4, 0, 0, "numInstances is 0"}, Bad{0, 4, 2, 2, "instanceIndex is 2"}}) {
    CAPTURE(bad.fragment);
    const auto error = test::catchError<ConfigError>(
        [&] { instanceStepOffset(bad.step, bad.stepSamples, bad.instances, bad.index); });
    REQUIRE(error.has_value());
    CHECK(error->code() == ErrorCode::OutOfRange);
    CHECK(error->subject() == "instanceStepOffset");
    CHECK(error->detail().find(bad.fragment) != std::string::npos);
  }
}

// ---------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------

namespace {

constexpr int64_t kBatch = 4;
constexpr int64_t kInputs = 20;

SessionOptions mlpOptions(int64_t replicas, int64_t instances, int64_t instance, const std::string& domain) {
  SessionOptions o;
  const int64_t local = replicas / instances;
  o.enableReplicatedGraphs = local > 1;
  o.replicatedGraphCount = local;
  if (instances > 1) {
    o.enableDistributedReplicatedGraphs = true;
    o.globalReplicationFactor = replicas;
    o.globalReplicaOffset = instance * local;
  }
  o.accumulationAndReplicationReductionType = ReductionType::Mean;
  if (domain != "none") {
    CommGroup group;
    if (domain == "Consecutive(2)") group = CommGroup{CommGroupType::Consecutive, 2};
    for (const TensorCategory category : {TensorCategory::Weight, TensorCategory::OptimizerState}) {
      TensorLocationSettings& settings = o.locationSettings(category);
      settings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
      settings.location.shardingDomain = group;
      settings.minElementsForReplicatedTensorSharding = 2;
    }
    o.accumulatorTensorLocationSettings.location.shardingDomain = group;
  }
  return o;
}

struct Training {
  std::vector<float> losses;  // per step, then per global replica
  std::vector<std::pair<std::string, HostTensor>> weights;
  std::vector<std::pair<std::string, HostTensor>> momentum;
  bool sharded = false;
};

// Trains the MLP 20-16-10 for `steps` steps on `instances` instances; each
// instance's weights (read back on that instance) must be the same.
Training trainMlp(int64_t replicas, int64_t instances, const std::string& domain, int steps) {
  std::vector<Training> results(static_cast<size_t>(instances));
  requireNoErrors(onInstances(instances, [&](int64_t instance, std::shared_ptr<Communicator> communicator) {
    ModelConfig model;
    model.layers = {kInputs, 16, 10};
    MlpGraph mlp = buildMlp(model, kBatch, replicas, 0);
    OptimizerConfig sgd;
    sgd.sgd.learningRate = 0.05;
    sgd.sgd.momentum = 0.9;
    TrainingSession session(
        std::move(mlp.graph), mlp.loss, makeOptimizer(sgd), mlpOptions(replicas, instances, instance, domain),
        communicator ? makeSimDevice({}, ExecutionMode::Vectorized, communicator) : makeSimDevice());
    Training& out = results[static_cast<size_t>(instance)];
    const int64_t local = replicas / instances;
    for (int step = 0; step < steps; ++step) {
      const std::vector<float> all =
          pseudoRandom(static_cast<size_t>(replicas * kBatch * kInputs), 100 + step);
      const std::vector<float> x(all.begin() + instance * local * kBatch * kInputs,
                                 all.begin() + (instance + 1) * local * kBatch * kInputs);
      std::vector<int32_t> labels;
      for (int64_t i = 0; i < local * kBatch; ++i)
        labels.push_back(static_cast<int32_t>((instance * local * kBatch + i + step) % 10));
      session.run({StepInput("input", x), StepInput("labels", labels)});
      for (float v : session.loss().data) out.losses.push_back(v);
    }
    out.weights = session.readWeights();
    for (const auto& [name, value] : out.weights) {
      out.momentum.emplace_back(name, session.readVariable(name + ".momentum"));
      out.sharded = out.sharded || !session.graph().tensor(session.graph().find(name)).metaShape.empty();
    }
  }));
  Training merged = results.front();
  merged.losses.clear();
  // Losses come per instance per step; put them in global replica order.
  const int64_t local = replicas / instances;
  for (int step = 0; step < steps; ++step) {
    for (const Training& part : results) {
      merged.losses.insert(merged.losses.end(), part.losses.begin() + step * local,
                           part.losses.begin() + (step + 1) * local);
    }
  }
  for (const Training& part : results) {
    CHECK(part.weights == merged.weights);
    CHECK(part.momentum == merged.momentum);
  }
  return merged;
}

}  // namespace

TEST_CASE("training split over instances matches one instance with every replica") {
  for (const std::string domain : {"none", "All", "Consecutive(2)"}) {
    const Training one = trainMlp(4, 1, domain, 3);
    CHECK(one.sharded == (domain != "none"));
    for (const int64_t instances : {2, 4}) {
      INFO(domain << " on " << instances << " instances");
      const Training split = trainMlp(4, instances, domain, 3);
      if (instances == 2 || domain == "none") {
        // Bitwise: the same program, every collective in replica order.
        CHECK(split.losses == one.losses);
        CHECK(split.weights == one.weights);
        CHECK(split.momentum == one.momentum);
        CHECK(split.sharded == one.sharded);
      } else {
        // One replica per instance: PopART's rule turns RTS off without local
        // replication, so the numbers are those of a plain replicated run.
        CHECK_FALSE(split.sharded);
        REQUIRE(split.losses.size() == one.losses.size());
        for (std::size_t i = 0; i < one.losses.size(); ++i)
          CHECK(std::abs(split.losses[i] - one.losses[i]) <= 1e-6);
        for (std::size_t w = 0; w < one.weights.size(); ++w) {
          for (std::size_t k = 0; k < one.weights[w].second.data.size(); ++k) {
            CHECK(std::abs(split.weights[w].second.data[k] - one.weights[w].second.data[k]) <= 1e-6);
          }
        }
      }
    }
  }
}

TEST_CASE("instances that would run different programs fail alike before the first step") {
  struct Row {
    std::string name;
    std::function<void(int64_t instance, SessionOptions&, int64_t& seed)> change;
    std::string subject;
    std::string fragment;
  };
  const std::vector<Row> rows = {
      {"options",
       [](int64_t instance, SessionOptions& o, int64_t&) {
         if (instance == 1) o.accumulationAndReplicationReductionType = ReductionType::Sum;
       },
       "/sessionOptions/accumulationAndReplicationReductionType",
       "\"Mean\" on instance 0, \"Sum\" on instance 1"},
      {"initial weights",
       [](int64_t instance, SessionOptions&, int64_t& seed) { seed = instance == 1 ? 7 : 0; },
       "/graph/variables/W0", "on instance 0"},
  };
  for (const Row& row : rows) {
    CAPTURE(row.name);
    const auto errors = onInstances(2, [&](int64_t instance, std::shared_ptr<Communicator> communicator) {
      SessionOptions options = mlpOptions(4, 2, instance, "none");
      int64_t seed = 0;
      row.change(instance, options, seed);
      ModelConfig model;
      model.layers = {kInputs, 16, 10};
      MlpGraph mlp = buildMlp(model, kBatch, 4, seed);
      TrainingSession session(std::move(mlp.graph), mlp.loss, makeOptimizer(OptimizerConfig{}), options,
                              makeSimDevice({}, ExecutionMode::Vectorized, communicator));
    });
    for (const std::exception_ptr& e : errors) {
      const DistError error = errorOf<DistError>(e);
      INFO(error.what());
      CHECK(error.code() == ErrorCode::InstanceMismatch);
      CHECK(error.subject() == row.subject);
      CHECK(error.detail().find(row.fragment) != std::string::npos);
    }
  }
}

TEST_CASE("a session of several instances needs a device that reaches them") {
  ModelConfig model;
  model.layers = {kInputs, 10};
  MlpGraph mlp = buildMlp(model, kBatch, 4, 0);
  const auto error = test::catchError<ConfigError>([&] {
    TrainingSession(std::move(mlp.graph), mlp.loss, makeOptimizer(OptimizerConfig{}),
                    mlpOptions(4, 2, 1, "none"), makeSimDevice());
  });
  REQUIRE(error.has_value());
  CHECK(error->code() == ErrorCode::UnsupportedCombination);
  CHECK(error->subject() == "/sessionOptions/enableDistributedReplicatedGraphs");
  CHECK(error->detail().find("the device has no communicator") != std::string::npos);
}

TEST_CASE("reading a variable grouped or sharded across instances gathers it on every instance") {
  // Replicas 0-1 on instance 0, 2-3 on instance 1. "pairs" has a value per
  // consecutive pair (one on each instance), "odd" a value per orthogonal
  // pair (both on both), "sharded" is split over all four.
  std::vector<std::map<std::string, HostTensor>> seen(2);
  requireNoErrors(onInstances(2, [&](int64_t instance, std::shared_ptr<Communicator> communicator) {
    Graph g(4);
    const Tensor x = ops::input(g, "x", {1});
    ops::variable(g, "pairs", {1, 2, 3, 4, 5, 6}, {3}, ReplicaGrouping(4, 1, 2));
    ops::variable(g, "odd", {7, 8}, {1}, ReplicaGrouping(4, 2, 2));
    ops::variable(g, "perReplica", {1, 2, 3, 4}, {1}, ReplicaGrouping(4, 1, 1), RetrievalMode::AllReplicas);
    ops::replicaShardedVariable(g, "sharded", {1, 2, 3, 4, 5, 6, 7}, {7});
    ops::replicatedAllReduce(x);
    InferenceSession session(std::move(g), {}, mlpOptions(4, 2, instance, "none"),
                             makeSimDevice({}, ExecutionMode::Vectorized, communicator));
    for (const char* name : {"pairs", "odd", "perReplica", "sharded"}) {
      seen[static_cast<size_t>(instance)][name] = session.readVariable(name);
    }
  }));
  for (const auto& values : seen) {
    CHECK(values.at("pairs") == HostTensor{{2, 3}, {1, 2, 3, 4, 5, 6}});
    CHECK(values.at("odd") == HostTensor{{2, 1}, {7, 8}});
    CHECK(values.at("perReplica") == HostTensor{{4, 1}, {1, 2, 3, 4}});
    CHECK(values.at("sharded") == HostTensor{{7}, {1, 2, 3, 4, 5, 6, 7}});
  }
}

TEST_CASE("automatic loss scaling skips the same steps on every instance") {
  // loss = sum(w * x) over 4 replicas on 2 instances, w sharded over all 4;
  // step 1 overflows only in the last replica's x, on instance 1 and in the
  // last shard, yet both instances skip it and keep every shard. In float32
  // and with a float16 w and x (the loss cast to float32, w's float32 master
  // weight sharded like it).
  for (const DType dtype : {DType::Float32, DType::Float16}) {
  const bool half = dtype == DType::Float16;
  CAPTURE(half);
  struct Seen {
    std::vector<bool> skipped;
    std::vector<double> scales;
    std::vector<HostTensor> weights;
    std::vector<HostTensor> moments;
  };
  std::vector<Seen> seen(2);
  constexpr int64_t n = 8;
  requireNoErrors(onInstances(2, [&](int64_t instance, std::shared_ptr<Communicator> communicator) {
    Graph g(4);
    const Tensor x = ops::input(g, "x", {n}, dtype);
    const Tensor w = ops::variable(g, "w", pseudoRandom(static_cast<size_t>(n), 3), {n}, std::nullopt,
                                   RetrievalMode::OnePerGroup, TensorCategory::Weight, dtype);
    const Tensor product = ops::reduceSum(ops::mul(w, x));
    const Tensor loss = half ? ops::cast(product, DType::Float32) : product;
    SessionOptions options = mlpOptions(4, 2, instance, "All");
    options.weightTensorLocationSettings.minElementsForReplicatedTensorSharding = 0;
    options.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = 0;
    options.automaticLossScalingSettings.enabled = true;
    OptimizerConfig adam;
    adam.type = OptimizerType::Adam;
    adam.adam.lossScaling = 1024;
    TrainingSession session(std::move(g), loss.id(), makeOptimizer(adam), options,
                            makeSimDevice({}, ExecutionMode::Vectorized, communicator));
    Seen& out = seen[static_cast<size_t>(instance)];
    for (int step = 0; step < 3; ++step) {
      std::vector<float> local(static_cast<size_t>(2 * n), 0.5F);
      if (step == 1 && instance == 1)
        local[static_cast<size_t>(2 * n - 1)] = std::numeric_limits<float>::infinity();
      session.run({StepInput("x", local)});
      out.skipped.push_back(session.lastStepSkipped());
      out.scales.push_back(session.lossScale());
      out.weights.push_back(session.readVariable("w"));
      out.moments.push_back(session.readVariable("w.adamV"));
    }
    CHECK(session.skippedSteps() == 1);
    const TensorNode& weight = session.graph().tensor(session.graph().find("w"));
    CHECK(weight.dtype == dtype);
    CHECK(weight.shape == Shape{n / 4});  // sharded, float16 too
  }));
  for (const Seen& s : seen) {
    CHECK(s.skipped == std::vector<bool>{false, true, false});
    CHECK(s.scales == std::vector<double>{1024, 512, 512});
    CHECK(s.weights[1] == s.weights[0]);
    CHECK(s.moments[1] == s.moments[0]);
    CHECK(s.weights[2] != s.weights[1]);
    CHECK(s.weights == seen[0].weights);
    CHECK(s.moments == seen[0].moments);
  }
  }
}
