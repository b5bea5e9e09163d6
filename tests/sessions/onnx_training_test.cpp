// Training imported ONNX models from a run config: the MLP, LeNet and
// GPT-block exports of tests/data/onnx (loss inside the graph, dynamic batch
// axis) on their tensors datasets (*_train.safetensors). Per-step losses
// equal PyTorch's training of the same module on the same batches under
// tessera's optimizer formulas (*_training_reference.json, written by
// tests/data/onnx/generate.py), and every session option that changes where
// tensors live or how a step is split gives the losses of one replica.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "half.hpp"
#include "support/onnx_models.hpp"
#include "support/process.hpp"
#include "tessera/app/checkpoint.hpp"
#include "tessera/app/config_notes.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/app/run_plan.hpp"
#include "tessera/app/trainer.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::relativeDifference;
using test::worstRelativeDifference;

// An exported model of tests/data/onnx with its tensors datasets and
// PyTorch's training of it.
struct Fixture {
  std::string name;
  std::string model;  // the .onnx file
  std::string
      prefix;  // of <prefix>_train.safetensors, <prefix>_test.safetensors, <prefix>_training_reference.json

  std::string file(const std::string& suffix) const {
    return test::sourcePath("tests/data/onnx/" + prefix + suffix);
  }
  const json& reference() const;
};

const Fixture kMlp{"MLP", "mlp.onnx", "mlp"};
const Fixture kLeNet{"LeNet", "lenet.onnx", "lenet"};
const Fixture kGpt{"GPT block", "gpt_block.onnx", "gpt"};
const std::vector<Fixture> kFixtures = {kMlp, kLeNet, kGpt};

const json& Fixture::reference() const {
  static std::map<std::string, json> loaded;
  auto it = loaded.find(prefix);
  if (it == loaded.end())
    it = loaded.emplace(prefix, json::parse(test::readText(file("_training_reference.json")))).first;
  return it->second;
}

// The run config of `fixture`'s export on its committed tensors dataset,
// with the optimizer of reference run `run`, R = 1 x batch 8, the reference's
// steps as passes in file order, then `overrides`.
RunConfig onnxConfig(const Fixture& fixture, const std::string& run,
                     const std::vector<std::string>& overrides = {}) {
  const json& reference = fixture.reference();
  const int64_t samplesPerPass = reference.at("trainSamples").get<int64_t>();
  const int64_t samples = reference.at("steps").get<int64_t>() * reference.at("globalBatch").get<int64_t>();
  REQUIRE(samples % samplesPerPass == 0);
  const json document = {
      {"model",
       {{"type", "Onnx"}, {"path", test::sourcePath("tests/data/onnx/" + fixture.model)}, {"loss", "loss"}}},
      {"optimizer", reference.at("runs").at(run).at("optimizer")},
      {"data",
       {{"dataset", "Tensors"},
        {"path", fixture.file("_train.safetensors")},
        {"test", fixture.file("_test.safetensors")},
        {"batchSize", 8},
        {"testBatchSize", 8},
        {"epochs", samples / samplesPerPass},
        {"shuffle", false}}}};
  return parseRunConfig(document.dump(), fixture.prefix + "_onnx.json", overrides).config;
}

RunConfig mlpConfig(const std::string& run, const std::vector<std::string>& overrides = {}) {
  return onnxConfig(kMlp, run, overrides);
}

double worstRelative(const std::vector<double>& got, const std::vector<double>& want) {
  return worstRelativeDifference(got, want);
}

const std::vector<std::string> kRuns = {"sgd", "sgd-momentum", "adam"};

TEST_CASE("per-step losses equal PyTorch's training of the module for SGD, SGD with momentum and Adam") {
  for (const Fixture& fixture : kFixtures) {
    CAPTURE(fixture.name);
    const json& reference = fixture.reference();
    CHECK(reference.at("steps").get<int>() >= 20);
    for (const std::string& run : kRuns) {
      CAPTURE(run);
      const json& expected = reference.at("runs").at(run);
      const TrainSummary summary = train(onnxConfig(fixture, run));
      REQUIRE(summary.steps == reference.at("steps").get<int64_t>());
      const double worst = worstRelative(summary.losses, expected.at("losses").get<std::vector<double>>());
      INFO("largest relative difference of a step's loss: ", worst);
      CHECK(worst <= 1e-4);
      // The test loss is the mean over the test set with the final weights
      // (whole batches of 8).
      CHECK(relativeDifference(summary.testLoss, expected.at("testLoss").get<double>()) <= 1e-4);
      CHECK(summary.testAccuracy == 0.0);
      // The final weights keep their ONNX names and PyTorch's values (the
      // reference holds every parameter of the MLP, and a few of the others).
      std::set<std::string> names;
      for (const auto& weight : summary.weights) {
        const std::string& name = weight.first;
        names.insert(name);
        if (!expected.at("weights").contains(name)) continue;
        CAPTURE(name);
        const std::vector<double> want = expected.at("weights").at(name).get<std::vector<double>>();
        REQUIRE(weight.second.size() == want.size());
        double worstWeight = 0;
        for (std::size_t i = 0; i < want.size(); ++i)
          worstWeight = std::max(worstWeight, std::fabs(weight.second[i] - want[i]));
        CHECK(worstWeight <= 1e-4);
      }
      for (const auto& item : expected.at("weights").items()) CHECK(names.count(item.key()) == 1);
      if (&fixture == &kMlp) {
        CHECK(names == std::set<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
      }
    }
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

// Every variant trains `fixture` with optimizer `run` to the losses of one
// replica.
void checkEquivalentVariants(const Fixture& fixture, const std::string& run) {
  CAPTURE(fixture.name);
  CAPTURE(run);
  const TrainSummary single = train(onnxConfig(fixture, run));
  for (const Variant& variant : equivalentVariants()) {
    CAPTURE(variant.name);
    const TrainSummary summary = train(onnxConfig(fixture, run, variant.overrides));
    REQUIRE(summary.steps == single.steps);
    const double worst = worstRelative(summary.losses, single.losses);
    INFO("largest relative difference of a step's loss: ", worst);
    CHECK(worst <= 1e-5);
    CHECK(relativeDifference(summary.testLoss, single.testLoss) <= 1e-5);
    CHECK(summary.globalBatch == 8);
  }
}

TEST_CASE("replication, RTS, streaming and accumulation train the losses of one replica") {
  for (const std::string run : {"sgd-momentum", "adam"}) checkEquivalentVariants(kMlp, run);
}

// Adam: the optimizer with the most state to shard and stream.
TEST_CASE("LeNet: replication, RTS, streaming and accumulation train the losses of one replica") {
  checkEquivalentVariants(kLeNet, "adam");
}

TEST_CASE("GPT block: replication, RTS, streaming and accumulation train the losses of one replica") {
  checkEquivalentVariants(kGpt, "adam");
}

// Recomputation clones forward ops into the backward pass: the same
// computation on the same values, so every step's loss and every final
// weight are the same bits, alone and with the splits of a step.
TEST_CASE("every recomputation type trains the MLP, LeNet and GPT block to the same bits") {
  const std::string option = "/sessionOptions/autoRecomputation=";
  for (const Fixture& fixture : kFixtures) {
    CAPTURE(fixture.name);
    const TrainSummary plain = train(onnxConfig(fixture, "adam"));
    for (const std::string type : {"None", "Standard", "NormOnly", "RecomputeAll"}) {
      CAPTURE(type);
      const TrainSummary summary = train(onnxConfig(fixture, "adam", {option + type}));
      CHECK(summary.losses == plain.losses);
      CHECK(summary.weights == plain.weights);
      CHECK(summary.testLoss == plain.testLoss);
      CHECK(summary.memory.perReplica.at(0).peakActivationBytes <=
            plain.memory.perReplica.at(0).peakActivationBytes);
    }
    const std::vector<Variant> splits = {
        {"R=2 x batch 4, RTS over All", with(replicas(2, 4), rts(R"({"type": "All"})"))},
        {"R=2 x batch 4, optimizer state OffChip through IO tiles", with(replicas(2, 4), kOffChipThroughIo)},
        {"accumulation 2 x R=2 x batch 2",
         with(replicas(2, 2), {"/sessionOptions/enableGradientAccumulation=true",
                               "/sessionOptions/accumulationFactor=2", "/data/testBatchSize=4"})}};
    for (const Variant& split : splits) {
      CAPTURE(split.name);
      const TrainSummary base = train(onnxConfig(fixture, "adam", split.overrides));
      const TrainSummary recomputed =
          train(onnxConfig(fixture, "adam", with(split.overrides, {option + "Standard"})));
      CHECK(recomputed.losses == base.losses);
      CHECK(recomputed.weights == base.weights);
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
  const std::string checkpoint = (dir.path() / "model.safetensors").string();
  // LeNet stops in its second pass over the data.
  const std::vector<std::pair<const Fixture*, std::string>> runs = {
      {&kMlp, "sgd-momentum"}, {&kMlp, "adam"}, {&kLeNet, "adam"}, {&kGpt, "adam"}};
  for (const auto& fixtureRun : runs) {
    const Fixture& fixture = *fixtureRun.first;
    const std::string& run = fixtureRun.second;
    CAPTURE(fixture.name);
    CAPTURE(run);
    const TrainSummary whole = train(onnxConfig(fixture, run));
    constexpr int64_t kStopAt = 10;
    int64_t steps = 0;
    TrainControl stop;
    stop.stopRequested = [&steps] { return steps++ == kStopAt; };
    const std::vector<std::string> sharded =
        with(with(replicas(2, 4), rts(R"({"type": "All"})")), {"/output/checkpoint=" + checkpoint});
    const TrainSummary first = train(onnxConfig(fixture, run, sharded), {}, stop);
    REQUIRE(first.interrupted);
    REQUIRE(first.checkpointStep == kStopAt);
    CHECK(readCheckpoint(checkpoint).step == kStopAt);

    TrainControl resume;
    resume.resumeFrom = checkpoint;
    std::vector<std::string> warnings;
    resume.onWarning = [&warnings](const std::string& warning) { warnings.push_back(warning); };
    const TrainSummary rest = train(onnxConfig(fixture, run), {}, resume);
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
      {"an IDX dataset for an ONNX model whose input does not take 28 x 28 images",
       {"/data/dataset=Synthetic", "/data/test="},
       ErrorCode::InvalidModel,
       "/model/images"},
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

namespace tessera {
namespace {

// LeNet on the synthetic IDX dataset (28 x 28 images, 10 classes): the
// images bind to the float32 input "image" [batch, 1, 28, 28] and the labels
// to the integer input "labels" without naming them.
RunConfig lenetOnIdx(const std::vector<std::string>& overrides = {}) {
  const json document = {
      {"model",
       {{"type", "Onnx"}, {"path", test::sourcePath("tests/data/onnx/lenet.onnx")}, {"loss", "loss"}}},
      {"optimizer", {{"type", "Adam"}, {"learningRate", 0.002}}},
      {"data",
       {{"dataset", "Synthetic"},
        {"batchSize", 16},
        {"testBatchSize", 16},
        {"limitTrainSamples", 320},
        {"limitTestSamples", 100},
        {"seed", 3}}}};
  return parseRunConfig(document.dump(), "lenet.json", overrides).config;
}

TEST_CASE("an IDX dataset feeds an ONNX model's image and label inputs; logits give the test accuracy") {
  const TrainSummary bound = train(lenetOnIdx({"/model/logits=logits"}));
  CHECK(bound.steps == 20);
  CHECK(bound.testSamples == 100);
  // The synthetic classes are prototypes plus noise: 20 steps take the
  // accuracy well above chance (0.1).
  CHECK(bound.losses.back() < bound.losses.front());
  CHECK(bound.testAccuracy >= 0.3);
  // The loss over the whole test batches is reported too (6 of 16).
  CHECK(bound.testLoss > 0.0);
  // Naming the inputs and the logits binds the same tensors; without logits
  // there is no accuracy.
  const TrainSummary named = train(lenetOnIdx({"/model/images=image", "/model/labels=labels"}));
  CHECK(named.losses == bound.losses);
  CHECK(named.testAccuracy == 0.0);
  CHECK(named.testLoss == bound.testLoss);
  // Two replicas with RTS give the same accuracy.
  const TrainSummary replicated = train(lenetOnIdx(with(with(replicas(2, 8), rts(R"({"type": "All"})")),
                                                        {"/model/logits=logits", "/data/testBatchSize=16"})));
  CHECK(worstRelative(replicated.losses, bound.losses) <= 1e-5);
  CHECK(replicated.testAccuracy == bound.testAccuracy);
}

TEST_CASE("the test accuracy from logits equals PyTorch's") {
  for (const std::string& run : kRuns) {
    CAPTURE(run);
    const TrainSummary summary = train(onnxConfig(kLeNet, run, {"/model/logits=logits"}));
    const json& expected = kLeNet.reference().at("runs").at(run);
    CHECK(summary.testAccuracy == doctest::Approx(expected.at("testAccuracy").get<double>()).epsilon(1e-12));
    CHECK(relativeDifference(summary.testLoss, expected.at("testLoss").get<double>()) <= 1e-4);
  }
}

TEST_CASE("bindings of data and logits that do not fit the model name the setting") {
  struct Case {
    std::string name;
    std::string model;
    std::vector<std::string> overrides;
    ErrorCode code;
    std::string subject;
    std::string detail;
  };
  const std::vector<Case> cases = {
      {"an images input the graph does not have",
       "lenet.onnx",
       {"/model/images=imag"},
       ErrorCode::InvalidModel,
       "/model/images",
       "did you mean \"image\"?"},
      {"images bound to the integer input",
       "lenet.onnx",
       {"/model/images=labels"},
       ErrorCode::InvalidModel,
       "/model/images",
       "cannot hold the images"},
      {"labels bound to the float input",
       "lenet.onnx",
       {"/model/labels=image"},
       ErrorCode::InvalidModel,
       "/model/labels",
       "cannot hold the class labels"},
      {"logits the graph does not output",
       "lenet.onnx",
       {"/model/logits=logit"},
       ErrorCode::InvalidModel,
       "/model/logits",
       "did you mean \"logits\"?"},
      {"logits that are the scalar loss",
       "lenet.onnx",
       {"/model/logits=loss"},
       ErrorCode::InvalidModel,
       "/model/logits",
       "logits are float32 (the model's dtype) [batch, classes]"},
      {"images of 28 x 28 for an input of 2 x 3",
       "mlp.onnx",
       {},
       ErrorCode::InvalidModel,
       "/model/images",
       "6 elements per sample, but the dataset's images have 784"},
      {"no float input for the images",
       "gpt_block.onnx",
       {},
       ErrorCode::InvalidModel,
       "/model/images",
       "has 0 float32 inputs"},
      {"two float inputs for the images",
       "three_inputs.onnx",
       {},
       ErrorCode::InvalidModel,
       "/model/images",
       "has 2 float32 inputs"},
      {"a third input that an IDX dataset does not feed",
       "three_inputs.onnx",
       {"/model/images=image"},
       ErrorCode::InvalidData,
       "/data/dataset",
       "but the graph has input \"weight\" (float32 [16]) too"},
      {"images bound to an integer input of the GPT block",
       "gpt_block.onnx",
       {"/model/images=tokens"},
       ErrorCode::InvalidModel,
       "/model/images",
       "cannot hold the images"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    std::vector<std::string> overrides = {"/model/path=" + test::sourcePath("tests/data/onnx/" + c.model)};
    overrides.insert(overrides.end(), c.overrides.begin(), c.overrides.end());
    const auto error = test::catchError<Error>([&overrides] { (void)train(lenetOnIdx(overrides)); });
    REQUIRE(error.has_value());
    INFO(error->what());
    CHECK(error->code() == c.code);
    CHECK(error->subject() == c.subject);
    CHECK(std::string(error->what()).find(c.detail) != std::string::npos);
  }
  // A tensors dataset needs no image binding, but accuracy needs the labels.
  const auto gptLogits = test::catchError<Error>([] {
    (void)train(onnxConfig(kGpt, "sgd", {"/model/logits=logits", "/data/limitTrainSamples=8"}));
  });
  REQUIRE(gptLogits.has_value());
  INFO(gptLogits->what());
  CHECK(gptLogits->subject() == "/model/labels");
  CHECK(std::string(gptLogits->what()).find("has 2 int32 inputs") != std::string::npos);
  const auto gptRank = test::catchError<Error>([] {
    (void)train(onnxConfig(kGpt, "sgd",
                           {"/model/logits=logits", "/model/labels=targets", "/data/limitTrainSamples=8"}));
  });
  REQUIRE(gptRank.has_value());
  INFO(gptRank->what());
  CHECK(gptRank->subject() == "/model/labels");
  // The onnx-only keys are explained for an mlp model.
  const auto mlpKey = test::catchError<Error>(
      [] { (void)parseRunConfig(R"({"model": {"type": "Mlp", "logits": "logits"}})", "mlp.json", {}); });
  REQUIRE(mlpKey.has_value());
  CHECK(std::string(mlpKey->what()).find("model type \"Onnx\"") != std::string::npos);
}

TEST_CASE("/model/dtype float16 imports the model as float16 and trains it close to float32") {
  // SGD with momentum at a static loss scale of 128, float32 master weights.
  const std::vector<std::string> half = {"/model/dtype=\"float16\"", "/optimizer/lossScaling=128"};
  for (const Fixture& fixture : kFixtures) {
    CAPTURE(fixture.name);
    const RunConfig config = onnxConfig(fixture, "sgd-momentum", half);
    CHECK(config.model.dtype == DType::Float16);
    // explain: float16 weights at 2 bytes, float32 master weights.
    const RunPlan plan = planRun(config);
    int64_t weights = 0;
    int64_t masters = 0;
    for (const TensorPlacement& t : plan.tensors) {
      if (t.category == TensorCategory::Weight) {
        ++weights;
        CHECK(t.dtype == DType::Float16);
      }
      if (t.name.ends_with(".master")) {
        ++masters;
        CHECK(t.dtype == DType::Float32);
        CHECK(t.category == TensorCategory::OptimizerState);
      }
    }
    CHECK(weights > 0);
    CHECK(masters == weights);
    CHECK(configNotes(config).empty());

    const TrainSummary summary = train(config);
    const TrainSummary single = train(onnxConfig(fixture, "sgd-momentum"));
    REQUIRE(summary.losses.size() == single.losses.size());
    const double worst = worstRelative(summary.losses, single.losses);
    INFO("largest relative difference of a step's loss to float32's: ", worst);
    // Seen over 24 steps: 2.7e-4 (the MLP), 2.2e-4 (LeNet), 4.3e-5 (the GPT
    // block); the test losses within 2.2e-4.
    CHECK(worst <= 1e-3);
    CHECK(worst > 0.0);
    CHECK(relativeDifference(summary.testLoss, single.testLoss) <= 1e-3);
  }
  // Without master weights the float16 weights are updated directly: note 801.
  const RunConfig direct =
      onnxConfig(kMlp, "sgd-momentum", {"/model/dtype=\"float16\"", "/optimizer/masterWeights=false"});
  const std::vector<ConfigNote> notes = configNotes(direct);
  REQUIRE(notes.size() == 1);
  CHECK(notes.front().code == NoteCode::Float16WeightsWithoutMasterWeights);
  // Loss scaling on the float32 import: note 802.
  const std::vector<ConfigNote> scaled = configNotes(onnxConfig(kMlp, "sgd", {"/optimizer/lossScaling=128"}));
  REQUIRE(scaled.size() == 1);
  CHECK(scaled.front().code == NoteCode::LossScalingWithoutFloat16);
  // A model whose loss is not one of the loss ops stays float16: refused.
  const auto error = test::catchError<ConfigError>([] {
    (void)train(mlpConfig("sgd", {"/model/dtype=\"float16\"", "/model/loss=logits"}));
  });
  REQUIRE(error.has_value());
  CHECK(error->code() == ErrorCode::InvalidModel);
  CHECK(error->subject() == "/model/loss");
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// The initializer `name` of the ONNX model in `path`, as imported (batch 8).
std::vector<float> onnxInitializer(const std::string& path, const std::string& name) {
  OnnxImportOptions options;
  options.dimensions = {{"batch", 8}};
  const OnnxModel model = importOnnx(path, options);
  return model.graph.tensor(model.graph.find(name)).initial.values();
}

TEST_CASE("/output/onnx writes the model with the trained weights; float16 runs write the master weights") {
  const test::TempDir folder;
  const std::string written = (folder.path() / "trained.onnx").string();
  const TrainSummary summary = train(mlpConfig("sgd-momentum", {"/output/onnx=\"" + written + "\""}));
  REQUIRE(summary.weights.size() == 4);
  for (const auto& weight : summary.weights) {
    const std::string& name = weight.first;
    CAPTURE(name);
    CHECK(onnxInitializer(written, name) == weight.second);
  }

  // float16 with float32 master weights: the file holds the masters, whose
  // halves are the float16 weights the run ended with.
  const TrainSummary half = train(mlpConfig(
      "sgd-momentum", {"/model/dtype=\"float16\"", "/optimizer/lossScaling=128", "/output/onnx=\"" + written + "\""}));
  int64_t notHalves = 0;
  for (const auto& weight : half.weights) {
    const std::string& name = weight.first;
    CAPTURE(name);
    const std::vector<float> master = onnxInitializer(written, name);
    REQUIRE(master.size() == weight.second.size());
    for (std::size_t i = 0; i < master.size(); ++i) {
      CHECK(roundToHalf(master[i]) == weight.second[i]);
      if (roundToHalf(master[i]) != master[i]) ++notHalves;
    }
  }
  CHECK(notHalves > 0);

  // A model not imported from ONNX has no ONNX model to write into.
  RunConfig mlp;
  mlp.output.onnx = written;
  const auto error = test::catchError<ConfigError>([&mlp] { validate(mlp); });
  REQUIRE(error.has_value());
  CHECK(error->code() == ErrorCode::InvalidOutput);
  CHECK(error->subject() == "/output/onnx");
}

}  // namespace
}  // namespace tessera
