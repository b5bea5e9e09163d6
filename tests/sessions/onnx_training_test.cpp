// Training an imported ONNX model from a run config: the MLP export of
// tests/data/onnx (loss inside the graph, dynamic batch axis) on the tensors
// dataset mlp_train.safetensors. Per-step losses equal PyTorch's training of
// the same module on the same batches under tessera's optimizer formulas
// (mlp_training_reference.json, written by tests/data/onnx/generate.py), and
// every session option that changes where tensors live or how a step is
// split gives the losses of one replica.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/process.hpp"
#include "tessera/checkpoint.hpp"
#include "tessera/error.hpp"
#include "tessera/placement.hpp"
#include "tessera/run_config.hpp"
#include "tessera/trainer.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

const json& reference() {
  static const json value =
      json::parse(readText(test::sourcePath("tests/data/onnx/mlp_training_reference.json")));
  return value;
}

// The run config of the MLP export on the committed tensors dataset, with
// the optimizer of reference run `run`, R = 1 x batch 8, one epoch in file
// order (24 steps), then `overrides`.
RunConfig mlpConfig(const std::string& run, const std::vector<std::string>& overrides = {}) {
  const json document = {
      {"model", {{"type", "onnx"}, {"path", test::sourcePath("tests/data/onnx/mlp.onnx")}, {"loss", "loss"}}},
      {"optimizer", reference().at("runs").at(run).at("optimizer")},
      {"data",
       {{"dataset", "tensors"},
        {"path", test::sourcePath("tests/data/onnx/mlp_train.safetensors")},
        {"test", test::sourcePath("tests/data/onnx/mlp_test.safetensors")},
        {"batchSize", 8},
        {"testBatchSize", 8},
        {"shuffle", false}}}};
  return parseRunConfig(document.dump(), "mlp_onnx.json", overrides).config;
}

double relative(double got, double want) { return std::fabs(got - want) / std::max(std::fabs(want), 1e-30); }

double worstRelative(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, relative(got[i], want[i]));
  return worst;
}

const std::vector<std::string> kRuns = {"sgd", "sgd-momentum", "adam"};

TEST_CASE("per-step losses equal PyTorch's training of the module for SGD, SGD with momentum and Adam") {
  CHECK(reference().at("steps").get<int>() >= 20);
  for (const std::string& run : kRuns) {
    CAPTURE(run);
    const json& expected = reference().at("runs").at(run);
    const TrainSummary summary = train(mlpConfig(run));
    REQUIRE(summary.steps == reference().at("steps").get<int64_t>());
    const double worst = worstRelative(summary.losses, expected.at("losses").get<std::vector<double>>());
    INFO("largest relative difference of a step's loss: ", worst);
    CHECK(worst <= 1e-4);
    // The test loss is the mean over the test set with the final weights
    // (40 samples: 5 whole batches of 8).
    CHECK(relative(summary.testLoss, expected.at("testLoss").get<double>()) <= 1e-4);
    CHECK(summary.testAccuracy == 0.0);
    // The final weights keep their ONNX names and PyTorch's values.
    std::set<std::string> names;
    for (const auto& [name, values] : summary.weights) {
      names.insert(name);
      const std::vector<double> want = expected.at("weights").at(name).get<std::vector<double>>();
      REQUIRE(values.size() == want.size());
      for (std::size_t i = 0; i < want.size(); ++i) CHECK(std::fabs(values[i] - want[i]) <= 1e-4);
    }
    CHECK(names == std::set<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  }
}

// Settings of a session that must not change a step's numbers.
struct Variant {
  std::string name;
  std::vector<std::string> overrides;
};

std::vector<std::string> replicas(int64_t count, int64_t batch) {
  return {"/sessionOptions/enableReplicatedGraphs=" + std::string(count > 1 ? "true" : "false"),
          fmt::format("/sessionOptions/replicatedGraphCount={}", count),
          "/sessionOptions/accumulationAndReplicationReductionType=Mean",
          fmt::format("/data/batchSize={}", batch), fmt::format("/data/testBatchSize={}", batch)};
}

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// RTS of the weights and the optimizer state over `domain`, for every size.
std::vector<std::string> rts(const std::string& domain) {
  std::vector<std::string> out;
  for (const char* category : {"weightTensorLocationSettings", "optimizerStateTensorLocationSettings"}) {
    const std::string at = fmt::format("/sessionOptions/{}", category);
    out.push_back(at + "/location/replicatedTensorSharding=On");
    out.push_back(at + "/location/shardingDomain=" + domain);
    out.push_back(at + "/minElementsForReplicatedTensorSharding=0");
  }
  return out;
}

const std::vector<std::string> kOffChipThroughIo = {
    "/sessionOptions/numIOTiles=32",
    "/sessionOptions/optimizerStateTensorLocationSettings/location/storage=OffChip",
    "/sessionOptions/optimizerStateTensorLocationSettings/location/loadTileSet=IO",
    "/sessionOptions/optimizerStateTensorLocationSettings/location/storageTileSet=IO",
    "/sessionOptions/optimizerStateTensorLocationSettings/minElementsForOffChip=0"};

std::vector<Variant> equivalentVariants() {
  std::vector<Variant> variants;
  for (const auto& [count, batch] : std::vector<std::pair<int64_t, int64_t>>{{2, 4}, {4, 2}}) {
    const std::string at = fmt::format("R={} x batch {}", count, batch);
    const std::vector<std::string> base = replicas(count, batch);
    variants.push_back({at, base});
    variants.push_back({at + ", RTS over All", with(base, rts(R"({"type": "All"})"))});
    variants.push_back({at + ", RTS over Consecutive(2)",
                        with(base, rts(R"({"type": "Consecutive", "replicaGroupSize": 2})"))});
    variants.push_back({at + ", optimizer state OffChip through IO tiles", with(base, kOffChipThroughIo)});
  }
  const std::vector<std::string> accumulation =
      with(replicas(2, 2), {"/sessionOptions/enableGradientAccumulation=true",
                            "/sessionOptions/accumulationFactor=2", "/data/testBatchSize=4"});
  variants.push_back({"accumulation 2 x R=2 x batch 2", accumulation});
  // Accumulators sharded too, and a threshold that shards only the initializers of 40 elements or more
  // (fc1.weight, 48) while fc1.bias, fc2.weight and fc2.bias stay whole.
  std::vector<std::string> accumulators = with(accumulation, rts(R"({"type": "All"})"));
  accumulators.insert(
      accumulators.end(),
      {"/sessionOptions/accumulatorTensorLocationSettings/location/replicatedTensorSharding=On",
       "/sessionOptions/accumulatorTensorLocationSettings/minElementsForReplicatedTensorSharding=0"});
  variants.push_back(
      {"accumulation 2 x R=2 x batch 2, RTS of weights, optimizer state and accumulators", accumulators});
  variants.push_back(
      {"R=4 x batch 2, RTS from 40 elements",
       with(with(replicas(4, 2), rts(R"({"type": "All"})")),
            {"/sessionOptions/weightTensorLocationSettings/minElementsForReplicatedTensorSharding=40",
             "/sessionOptions/optimizerStateTensorLocationSettings/"
             "minElementsForReplicatedTensorSharding=40"})});
  return variants;
}

TEST_CASE("replication, RTS, streaming and accumulation train the losses of one replica") {
  for (const std::string run : {"sgd-momentum", "adam"}) {
    CAPTURE(run);
    const TrainSummary single = train(mlpConfig(run));
    for (const Variant& variant : equivalentVariants()) {
      CAPTURE(variant.name);
      const TrainSummary summary = train(mlpConfig(run, variant.overrides));
      REQUIRE(summary.steps == single.steps);
      const double worst = worstRelative(summary.losses, single.losses);
      INFO("largest relative difference of a step's loss: ", worst);
      CHECK(worst <= 1e-5);
      CHECK(summary.globalBatch == 8);
    }
  }
}

TEST_CASE("explain lists every initializer with its category, location, shard sizes and reason") {
  const RunConfig config = mlpConfig(
      "sgd-momentum",
      with(with(replicas(4, 2), rts(R"({"type": "Consecutive", "replicaGroupSize": 2})")),
           {R"(/sessionOptions/tensorLocationSettingsOverride={"fc2.weight": {"storage": "OffChip"}})"}));
  const RunPlan plan = planRun(config);
  const auto find = [&plan](const std::string& name) {
    const auto it = std::find_if(plan.tensors.begin(), plan.tensors.end(),
                                 [&name](const TensorPlacement& t) { return t.name == name; });
    REQUIRE_MESSAGE(it != plan.tensors.end(), name);
    return *it;
  };
  for (const std::string name : {"fc1.weight", "fc1.bias", "fc2.bias"}) {
    CAPTURE(name);
    const TensorPlacement weight = find(name);
    CHECK(weight.category == TensorCategory::Weight);
    CHECK(weight.replicatedTensorSharding == ReplicatedTensorSharding::On);
    CHECK(weight.storage == TensorStorage::OnChip);
    CHECK(weight.shardElements == (weight.elements + 1) / 2);
    CHECK(weight.reason.starts_with("/sessionOptions/weightTensorLocationSettings"));
    const TensorPlacement momentum = find(name + ".momentum");
    CHECK(momentum.category == TensorCategory::OptimizerState);
    CHECK(momentum.replicatedTensorSharding == ReplicatedTensorSharding::On);
  }
  // The override names the initializer as the exporter did.
  const TensorPlacement overridden = find("fc2.weight");
  CHECK(overridden.category == TensorCategory::Weight);
  CHECK(overridden.storage == TensorStorage::OffChip);
  CHECK(overridden.replicatedTensorSharding == ReplicatedTensorSharding::Off);
  CHECK(overridden.shardElements == 32);
  CHECK(overridden.reason.starts_with("/sessionOptions/tensorLocationSettingsOverride/fc2.weight"));
}

TEST_CASE("a location override by ONNX initializer name trains the same losses") {
  const TrainSummary single = train(mlpConfig("adam"));
  const TrainSummary overridden = train(mlpConfig(
      "adam", with(replicas(2, 4),
                   {R"(/sessionOptions/tensorLocationSettingsOverride={"fc1.weight": {"storage": "OffChip"},
                       "fc1.weight.adamM": {"storage": "OffChip", "loadTileSet": "IO", "storageTileSet": "IO"}})",
                    "/sessionOptions/numIOTiles=32"})));
  CHECK(worstRelative(overridden.losses, single.losses) <= 1e-5);
  const RunPlan plan = planRun(mlpConfig(
      "adam", {R"(/sessionOptions/tensorLocationSettingsOverride={"fc1.weight": {"storage": "OffChip"}})"}));
  const auto weight = std::find_if(plan.tensors.begin(), plan.tensors.end(),
                                   [](const TensorPlacement& t) { return t.name == "fc1.weight"; });
  REQUIRE(weight != plan.tensors.end());
  CHECK(weight->storage == TensorStorage::OffChip);
}

TEST_CASE("a checkpoint saved at R=2 with RTS resumes at R=1 with the uninterrupted losses") {
  const test::TempDir dir;
  const std::string checkpoint = (dir.path() / "mlp.safetensors").string();
  for (const std::string run : {"sgd-momentum", "adam"}) {
    CAPTURE(run);
    const TrainSummary whole = train(mlpConfig(run));
    constexpr int64_t kStopAt = 10;
    int64_t steps = 0;
    TrainControl stop;
    stop.stopRequested = [&steps] { return steps++ == kStopAt; };
    const std::vector<std::string> sharded =
        with(with(replicas(2, 4), rts(R"({"type": "All"})")), {"/output/checkpoint=" + checkpoint});
    const TrainSummary first = train(mlpConfig(run, sharded), {}, stop);
    REQUIRE(first.interrupted);
    REQUIRE(first.checkpointStep == kStopAt);
    CHECK(readCheckpoint(checkpoint).step == kStopAt);

    TrainControl resume;
    resume.resumeFrom = checkpoint;
    std::vector<std::string> warnings;
    resume.onWarning = [&warnings](const std::string& warning) { warnings.push_back(warning); };
    const TrainSummary rest = train(mlpConfig(run), {}, resume);
    CHECK(rest.firstStep == kStopAt);
    std::vector<double> losses = first.losses;
    losses.insert(losses.end(), rest.losses.begin(), rest.losses.end());
    CHECK(worstRelative(losses, whole.losses) <= 1e-5);
    // The replication and sharding differ, which resuming reports.
    CHECK_FALSE(warnings.empty());
  }
}

TEST_CASE("config errors of an ONNX model name the setting") {
  struct Case {
    std::string name;
    std::vector<std::string> overrides;
    ErrorCode code;
    std::string subject;
  };
  const std::vector<Case> cases = {
      {"a loss the graph does not have", {"/model/loss=los"}, ErrorCode::InvalidModel, "/model/loss"},
      {"a loss that is not a scalar", {"/model/loss=logits"}, ErrorCode::InvalidModel, "/model/loss"},
      {"no loss with two outputs", {"/model/loss="}, ErrorCode::InvalidModel, "/model/loss"},
      {"a dimension the model does not have",
       {R"(/model/dimensions={"batchsize": "batchSize"})"},
       ErrorCode::InvalidModel,
       "/model/dimensions/batchsize"},
      {"a model file that does not exist",
       {"/model/path=missing.onnx"},
       ErrorCode::FileUnreadable,
       "missing.onnx"},
      {"an IDX dataset for an ONNX model",
       {"/data/dataset=synthetic", "/data/test="},
       ErrorCode::InvalidData,
       "/data/dataset"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const auto error = test::catchError<Error>([&] { (void)train(mlpConfig("sgd", c.overrides)); });
    REQUIRE(error.has_value());
    INFO(error->what());
    CHECK(error->code() == c.code);
    CHECK(error->subject() == c.subject);
  }
  // The message of a mistyped loss suggests the output.
  const auto typo = test::catchError<ConfigError>([] { (void)train(mlpConfig("sgd", {"/model/loss=los"})); });
  REQUIRE(typo.has_value());
  CHECK(typo->detail().find("did you mean \"loss\"?") != std::string::npos);
}

TEST_CASE("an explicit dimension binding trains as the default one") {
  const TrainSummary bound =
      train(mlpConfig("sgd", {R"(/model/dimensions={"batch": "batchSize"})", "/data/limitTrainSamples=32"}));
  const TrainSummary fixed = train(mlpConfig("sgd", {"/data/limitTrainSamples=32"}));
  CHECK(bound.losses == fixed.losses);
  CHECK(bound.steps == 4);
  // A number binds the test batch too, so it must match both batch sizes.
  const TrainSummary number =
      train(mlpConfig("sgd", {R"(/model/dimensions={"batch": "8"})", "/data/limitTrainSamples=32"}));
  CHECK(number.losses == fixed.losses);
}

}  // namespace
}  // namespace tessera
