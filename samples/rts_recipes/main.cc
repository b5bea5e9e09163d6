// The replicated tensor sharding recipes of the PopART user guide (RTS, and
// RTS sharding domains for distributed instances), written in C++ against
// SessionOptions exactly as the guide writes them in Python, and checked:
//  - each recipe gives the same options as its JSON config
//    (samples/configs/rts_recipe.json, multipod_recipe.json);
//  - with the RTS recipe, an MLP trains with the same losses as plain
//    replication while each replica holds ceil(n/R) elements of every
//    sharded weight and momentum;
//  - the multi-pod recipe shards the optimizer state within each instance's
//    replicas, and its program is planned for 2 instances x 2 replicas.
// Usage: rts_recipes SOURCE_ROOT. Exits non-zero on a mismatch.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "tessera/lib/error.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/app/run_plan.hpp"
#include "tessera/sessions/session.hpp"

using namespace tessera;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  fmt::print("{} {}\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}

// Shard the weights, then the optimizer state as well, over all replicas.
void applyRtsRecipe(SessionOptions& opts, int64_t numReplicas) {
  opts.enableReplicatedGraphs = true;
  opts.replicatedGraphCount = numReplicas;
  opts.weightTensorLocationSettings.minElementsForReplicatedTensorSharding = numReplicas;
  opts.weightTensorLocationSettings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
  opts.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = numReplicas;
  opts.optimizerStateTensorLocationSettings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
}

// With several instances, shard only the optimizer state, within the
// replicas of one instance, and give every linked tensor that domain.
void applyMultiPodRecipe(SessionOptions& opts, int64_t numLocalReplicas, int64_t numTotalReplicas) {
  if (numTotalReplicas > numLocalReplicas) {
    opts.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = numLocalReplicas;
    opts.optimizerStateTensorLocationSettings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
    const CommGroup shardingDomain(CommGroupType::Consecutive, numLocalReplicas);
    opts.weightTensorLocationSettings.location.shardingDomain = shardingDomain;
    opts.optimizerStateTensorLocationSettings.location.shardingDomain = shardingDomain;
    opts.accumulatorTensorLocationSettings.location.shardingDomain = shardingDomain;
  }
}

struct Run {
  std::vector<double> losses;
  std::vector<std::pair<std::string, HostTensor>> weights;
  int64_t w0Elements = 0;
  int64_t momentumElements = 0;
};

Run train(const SessionOptions& options, int64_t replicas) {
  constexpr int64_t kGlobalBatch = 16;
  constexpr int64_t kFeatures = 64;
  ModelConfig model;
  model.layers = {kFeatures, 30, 10};
  MlpGraph mlp = buildMlp(model, kGlobalBatch / replicas, replicas, 1);
  OptimizerConfig sgd;
  sgd.sgd.learningRate = 0.05;
  sgd.sgd.momentum = 0.9;
  TrainingSession session(std::move(mlp.graph), mlp.loss, makeOptimizer(sgd), options, makeSimDevice());
  const std::vector<float> images = normalSamples(kGlobalBatch * kFeatures * 4, 11, 1.0);
  std::vector<int32_t> labels(kGlobalBatch * 4);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>(i % 10);
  Run run;
  for (int64_t s = 0; s < 4; ++s) {
    session.run({StepInput("input", std::span<const float>(images).subspan(
                                        static_cast<std::size_t>(s * kGlobalBatch * kFeatures), kGlobalBatch * kFeatures)),
                 StepInput("labels", std::span<const int32_t>(labels).subspan(static_cast<std::size_t>(s * kGlobalBatch),
                                                                           kGlobalBatch))});
    run.losses.push_back(session.meanLoss());
  }
  run.weights = session.readWeights();
  const Graph& g = session.graph();
  run.w0Elements = numElements(g.tensor(g.find("W0")).shape);
  run.momentumElements = numElements(g.tensor(g.find("W0.momentum")).shape);
  return run;
}

double worstDifference(const Run& a, const Run& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.losses.size(); ++i) worst = std::max(worst, std::abs(a.losses[i] - b.losses[i]));
  for (std::size_t w = 0; w < a.weights.size(); ++w) {
    for (std::size_t i = 0; i < a.weights[w].second.data.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(a.weights[w].second.data[i] - b.weights[w].second.data[i])));
    }
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: rts_recipes SOURCE_ROOT\n");
    return 2;
  }
  const std::string root = argv[1];
  try {
    constexpr int64_t numReplicas = 4;
    SessionOptions opts;
    applyRtsRecipe(opts, numReplicas);
    const LoadedRunConfig rtsJson = loadRunConfig(root + "/samples/configs/rts_recipe.json");
    expect(rtsJson.config.sessionOptions == opts, "the RTS recipe in C++ equals samples/configs/rts_recipe.json");

    SessionOptions plain;
    plain.enableReplicatedGraphs = true;
    plain.replicatedGraphCount = numReplicas;
    const Run reference = train(plain, numReplicas);
    const Run sharded = train(opts, numReplicas);
    const double difference = worstDifference(sharded, reference);
    expect(difference < 1e-5, fmt::format("RTS trains like plain replication (largest difference {:.2e})", difference));
    expect(sharded.w0Elements == (64 * 30 + 3) / 4,
           fmt::format("W0 [64, 30] holds ceil(1920/4) = 480 elements per replica ({})", sharded.w0Elements));
    expect(sharded.momentumElements == 480,
           fmt::format("its momentum is sharded the same way ({})", sharded.momentumElements));

    // The multi-pod recipe, as two instances of two replicas each would set it up.
    constexpr int64_t numLocalReplicas = 2;
    constexpr int64_t numTotalReplicas = 4;
    SessionOptions pod;
    pod.enableReplicatedGraphs = true;
    pod.replicatedGraphCount = numLocalReplicas;
    pod.enableDistributedReplicatedGraphs = true;
    pod.globalReplicationFactor = numTotalReplicas;
    pod.globalReplicaOffset = 0;
    applyMultiPodRecipe(pod, numLocalReplicas, numTotalReplicas);
    const LoadedRunConfig podJson = loadRunConfig(root + "/samples/configs/multipod_recipe.json");
    expect(podJson.config.sessionOptions == pod,
           "the multi-pod recipe in C++ equals samples/configs/multipod_recipe.json");
    RunConfig config = podJson.config;
    config.model.layers = {64, 30, 10};
    config.data.batchSize = 4;
    const RunPlan plan = planRun(config);
    bool stateSharded = false;
    bool weightsWhole = true;
    for (const TensorPlacement& t : plan.tensors) {
      if (t.name == "W0.momentum") {
        stateSharded = t.shardingDomain && *t.shardingDomain == ReplicaGrouping(4, 1, 2) && t.shardElements == 960;
      }
      if (t.category == TensorCategory::Weight && t.replicatedTensorSharding == ReplicatedTensorSharding::On) {
        weightsWhole = false;
      }
    }
    expect(stateSharded, "W0.momentum is sharded over Consecutive groups of 2 (960 elements per replica)");
    expect(weightsWhole, "the weights are not sharded (only their domain is set)");
    expect(plan.memory.perReplica.size() == 2, "the plan covers this instance's 2 replicas");
  } catch (const Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  fmt::print("{}\n", failures == 0 ? "all checks passed" : fmt::format("{} check(s) failed", failures));
  return failures == 0 ? 0 : 1;
}
