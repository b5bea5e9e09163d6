// evaluate(): the test set of a run config with a checkpoint's weights (or
// the initial ones), without training. It reports what train() reported for
// the same weights, on any replica count, and refuses what it cannot do.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/process.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/app/trainer.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

RunConfig config(const std::string& sample, std::vector<std::string> overrides) {
  return loadRunConfig(test::sourcePath("samples/configs/" + sample), overrides).config;
}

// The MLP sample on a small synthetic set.
const std::vector<std::string> kSmallMlp = {
    "/data/dataset=\"Synthetic\"", "/data/limitTrainSamples=512", "/data/limitTestSamples=300",
    "/data/batchSize=32",          "/data/epochs=1",              "/model/layers=[784, 16, 10]"};

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

TEST_CASE("a checkpoint evaluates to the accuracy train reported, on one replica and on four") {
  const test::TempDir folder;
  const std::string checkpoint = (folder.path() / "mlp.safetensors").string();
  const TrainSummary trained =
      train(config("mnist.json", with(kSmallMlp, {"/output/checkpoint=\"" + checkpoint + "\""})));
  REQUIRE(trained.steps == 16);

  EvaluateControl control;
  control.checkpoint = checkpoint;
  // The checkpoint's learning rate (the sample's cosine schedule) and the four
  // replicas below are the training's business, not the evaluation's.
  std::vector<std::string> warnings;
  control.onWarning = [&warnings](const std::string& warning) { warnings.push_back(warning); };
  const EvaluateSummary one = evaluate(config("mnist.json", kSmallMlp), control);
  CHECK(one.hasAccuracy);
  CHECK_FALSE(one.hasLoss);
  CHECK(one.testAccuracy == trained.testAccuracy);
  CHECK(one.testSamples == 300);
  CHECK(one.checkpoint == checkpoint);
  CHECK(one.checkpointStep == 16);

  // Four replicas (batch 8 each: the same global batch) read the same weights.
  const EvaluateSummary four = evaluate(
      config("mnist.json", with(kSmallMlp, {"/sessionOptions/enableReplicatedGraphs=true",
                                            "/sessionOptions/replicatedGraphCount=4", "/data/batchSize=8"})),
      control);
  CHECK(four.testAccuracy == one.testAccuracy);
  CHECK(warnings.empty());

  // The initial weights are not the trained ones.
  const EvaluateSummary initial = evaluate(config("mnist.json", kSmallMlp));
  CHECK(initial.checkpoint.empty());
  CHECK(initial.testAccuracy != one.testAccuracy);

  const nlohmann::json summary = summaryJson(one);
  CHECK(summary["testAccuracy"] == one.testAccuracy);
  CHECK(summary["testLoss"].is_null());
  CHECK(summary["checkpointStep"] == 16);
}

TEST_CASE("an ONNX model's checkpoint evaluates to the test loss train reported, with or without RTS") {
  const test::TempDir folder;
  const std::string checkpoint = (folder.path() / "onnx.safetensors").string();
  const std::vector<std::string> base = {"/data/epochs=1"};
  const TrainSummary trained =
      train(config("mlp_onnx.json", with(base, {"/output/checkpoint=\"" + checkpoint + "\""})));
  EvaluateControl control;
  control.checkpoint = checkpoint;
  const EvaluateSummary sharded = evaluate(config("mlp_onnx.json", base), control);
  CHECK(sharded.hasLoss);
  CHECK_FALSE(sharded.hasAccuracy);
  CHECK(sharded.testLoss == trained.testLoss);
  // One replica of the same global batch, no sharding.
  const EvaluateSummary plain = evaluate(
      config("mlp_onnx.json", with(base, {"/sessionOptions/enableReplicatedGraphs=false",
                                          "/sessionOptions/replicatedGraphCount=1", "/data/batchSize=8",
                                          "/data/testBatchSize=8",
                                          "/sessionOptions/weightTensorLocationSettings/location/"
                                          "replicatedTensorSharding=\"Off\"",
                                          "/sessionOptions/optimizerStateTensorLocationSettings/location/"
                                          "replicatedTensorSharding=\"Off\""})),
      control);
  CHECK(plain.testLoss == doctest::Approx(sharded.testLoss).epsilon(1e-6));
}

TEST_CASE("evaluate refuses a missing checkpoint, one of another model, and a run without a test set") {
  EvaluateControl control;
  control.checkpoint = "no-such-checkpoint.safetensors";
  CHECK_THROWS_AS(evaluate(config("mnist.json", kSmallMlp), control), IoError);

  const test::TempDir folder;
  const std::string checkpoint = (folder.path() / "wide.safetensors").string();
  (void)train(config("mnist.json", with(kSmallMlp, {"/model/layers=[784, 24, 10]",
                                                      "/output/checkpoint=\"" + checkpoint + "\""})));
  control.checkpoint = checkpoint;
  CHECK_THROWS_AS(evaluate(config("mnist.json", kSmallMlp), control), IoError);

  try {
    (void)evaluate(config("mlp_onnx.json", {"/data/test=\"\""}));
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK(e.code() == ErrorCode::InvalidData);
  }
}

}  // namespace
}  // namespace tessera
