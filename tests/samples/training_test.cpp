// End-to-end training through the programs users run: `tessera train` on the
// sample configs and the mnist_rts sample, on bounded subsets of the data
// (the full runs are recorded in docs/training.md and docs/onnx.md).
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/process.hpp"
#include "tessera/onnx/onnx.hpp"
#include "test_support.hpp"

namespace {

using nlohmann::json;
using tessera::test::ProcessResult;
using tessera::test::TempDir;

std::string program(const char* variable) {
  const char* path = std::getenv(variable);
  REQUIRE_MESSAGE(path != nullptr, variable, " must name the program");
  return path;
}

// `tessera train CONFIG --set ...` on the first 3200 training and 1000 test
// samples; returns its JSON summary.
json train(const std::string& config, std::vector<std::string> sets) {
  const TempDir dir;
  const std::string summary = (dir.path() / "summary.json").string();
  std::vector<std::string> args{"train", tessera::test::sourcePath(config), "--quiet", "--json-summary", summary,
                                "--set",  "/data/limitTrainSamples=3200",   "--set",   "/data/limitTestSamples=1000",
                                "--set",  "/data/epochs=1"};
  for (const std::string& set : sets) {
    args.push_back("--set");
    args.push_back(set);
  }
  const ProcessResult result = tessera::test::runProgram(program("TESSERA_CLI"), args);
  INFO("stderr: " << result.err);
  REQUIRE(result.exitCode == 0);
  return json::parse(tessera::test::readFile(summary));
}

void checkSameTraining(const json& a, const json& b, double tolerance) {
  REQUIRE(a["losses"].size() == b["losses"].size());
  for (size_t i = 0; i < a["losses"].size(); ++i) {
    INFO("step " << i);
    CHECK(a["losses"][i].get<double>() == doctest::Approx(b["losses"][i].get<double>()).epsilon(tolerance));
  }
  CHECK(std::abs(a["testAccuracy"].get<double>() - b["testAccuracy"].get<double>()) <= 0.005);
}

double mnistRtsAccuracy(const std::vector<std::string>& extra) {
  const TempDir dir;
  const std::string summary = (dir.path() / "summary.json").string();
  std::vector<std::string> args{"--limit-train-samples", "2400", "--limit-test-samples", "800", "--epochs", "1",
                                "--json-summary", summary};
  args.insert(args.end(), extra.begin(), extra.end());
  const ProcessResult result = tessera::test::runProgram(program("TESSERA_MNIST_RTS"), args);
  INFO("stdout: " << result.out << "stderr: " << result.err);
  REQUIRE(result.exitCode == 0);
  return json::parse(tessera::test::readFile(summary))["testAccuracy"].get<double>();
}

}  // namespace

TEST_CASE("tessera train learns the sample MLP config and writes its summary") {
  const json summary = train("samples/configs/mnist.json", {});
  CHECK(summary["steps"] == 3200 / 64);
  CHECK(summary["globalBatch"] == 64);
  REQUIRE(summary["losses"].size() == 50);
  CHECK(summary["finalLoss"].get<double>() < summary["losses"][0].get<double>());
  CHECK(summary["testAccuracy"].get<double>() > 0.6);
  CHECK(summary["samplesPerSecond"].get<double>() > 0);
  CHECK(summary["setupSeconds"].get<double>() > 0);
  CHECK(summary["testGlobalBatch"] == 100);
}

TEST_CASE("tessera train reports the loss scale and the steps automatic loss scaling skipped") {
  // SGD at learning rate 1000 diverges: its gradients soon overflow at a
  // scale of 1e30, and those steps are skipped.
  const TempDir dir;
  const std::string summaryPath = (dir.path() / "summary.json").string();
  const std::vector<std::string> args{"train",
                                      tessera::test::sourcePath("samples/configs/mnist.json"),
                                      "--quiet",
                                      "--json-summary",
                                      summaryPath,
                                      "--set",
                                      "/data/limitTrainSamples=640",
                                      "--set",
                                      "/data/limitTestSamples=100",
                                      "--set",
                                      "/data/epochs=1",
                                      "--set",
                                      "/optimizer/type=SGD",
                                      "--set",
                                      "/optimizer/learningRate=1000",
                                      "--set",
                                      "/optimizer/lossScaling=1e30",
                                      "--set",
                                      "/sessionOptions/automaticLossScalingSettings/enabled=true",
                                      "--set",
                                      "/sessionOptions/automaticLossScalingSettings/maxLossScale=1e30"};
  const ProcessResult result = tessera::test::runProgram(program("TESSERA_CLI"), args);
  INFO("stderr: " << result.err);
  REQUIRE(result.exitCode == 0);
  // Loss scaling on a float32 model: train warns before it starts, as validate does.
  CHECK(result.err.find("warning: [tessera.note.802] /sessionOptions/automaticLossScalingSettings/enabled: "
                        "automatic loss scaling is enabled") != std::string::npos);
  const json summary = json::parse(tessera::test::readFile(summaryPath));
  const auto skipped = summary["skippedSteps"].get<int64_t>();
  CHECK(skipped > 0);
  REQUIRE(summary["skippedStepIndices"].size() == static_cast<size_t>(skipped));
  // Step 0 sees the initial weights; the indices rise.
  CHECK(summary["skippedStepIndices"][0].get<int64_t>() > 0);
  // No growth within the default updatePeriod: each skip halved the scale.
  CHECK(summary["lossScale"].get<double>() ==
        static_cast<double>(static_cast<float>(1e30)) * std::pow(0.5, static_cast<double>(skipped)));
  CHECK(result.out.find(fmt::format("loss scale: {:g} ({} step(s) skipped)",
                                    summary["lossScale"].get<double>(), skipped)) != std::string::npos);

  // Without loss scaling the summary says scale 1, nothing skipped, and the
  // text says nothing.
  const json plain = train("samples/configs/mnist.json", {"/data/limitTrainSamples=640"});
  CHECK(plain["lossScale"] == 1.0);
  CHECK(plain["skippedSteps"] == 0);
  CHECK(plain["skippedStepIndices"].empty());
}

TEST_CASE("on many replicas a test step is at most the test set, with the accuracy of smaller steps") {
  // 256 replicas x testBatchSize 100 would make steps of 25,600 samples for
  // 1,000 test samples; each replica takes its share, ceil(1000 / 256) = 4.
  const std::vector<std::string> wide{"/sessionOptions/replicatedGraphCount=256", "/data/batchSize=1"};
  const json capped = train("samples/configs/mnist_rts.json", wide);
  CHECK(capped["globalBatch"] == 256);
  CHECK(capped["testGlobalBatch"] == 256 * 4);
  std::vector<std::string> small = wide;
  small.push_back("/data/testBatchSize=1");
  const json one = train("samples/configs/mnist_rts.json", small);
  CHECK(one["testGlobalBatch"] == 256);
  // The same training; a sample's prediction does not depend on its batch.
  CHECK(one["losses"] == capped["losses"]);
  CHECK(one["testAccuracy"].get<double>() == capped["testAccuracy"].get<double>());
  CHECK(capped["testAccuracy"].get<double>() > 0.3);
}

TEST_CASE("the summary has the test accuracy after every epoch, the last one the final accuracy") {
  const json summary = train("samples/configs/mnist.json", {"/data/epochs=3", "/data/limitTrainSamples=640"});
  CHECK(summary["steps"] == 3 * 640 / 64);
  const json& epochs = summary["epochTestAccuracies"];
  REQUIRE(epochs.size() == 3);
  for (const json& accuracy : epochs) {
    CHECK(accuracy.get<double>() > 0.0);
    CHECK(accuracy.get<double>() <= 1.0);
  }
  CHECK(epochs.back().get<double>() == summary["testAccuracy"].get<double>());
}

// The ONNX sample: the MLP export on its tensors dataset, whose files the
// config names relative to its own folder; two replicas with RTS train the
// losses of one replica with the whole batch.
TEST_CASE("tessera train trains the ONNX sample config like one replica with the whole batch") {
  if (!tessera::onnxSupported()) {
    MESSAGE("this build has no ONNX support; nothing to run");
    return;
  }
  const json sharded = train("samples/configs/mlp_onnx.json", {"/data/epochs=2"});
  CHECK(sharded["steps"] == 2 * 192 / 8);
  CHECK(sharded["globalBatch"] == 8);
  CHECK(sharded["trainSamples"] == 192);
  CHECK(sharded["testSamples"] == 40);
  CHECK(sharded["testLoss"].get<double>() > 0.0);
  CHECK(sharded["testLoss"].get<double>() < sharded["losses"][0].get<double>());
  REQUIRE(sharded["epochTestLosses"].size() == 2);
  const json single =
      train("samples/configs/mlp_onnx.json",
            {"/data/epochs=2", "/sessionOptions/enableReplicatedGraphs=false",
             "/sessionOptions/replicatedGraphCount=1", "/data/batchSize=8", "/data/testBatchSize=8"});
  checkSameTraining(sharded, single, 1e-5);
  CHECK(std::abs(sharded["testLoss"].get<double>() - single["testLoss"].get<double>()) <= 1e-5);

  const ProcessResult printed = tessera::test::runProgram(
      program("TESSERA_CLI"), {"train", tessera::test::sourcePath("samples/configs/mlp_onnx.json"), "--quiet",
                               "--set", "/data/epochs=1"});
  INFO("stderr: " << printed.err);
  CHECK(printed.exitCode == 0);
  CHECK(printed.out.find("test loss: ") != std::string::npos);
  CHECK(printed.out.find("test accuracy") == std::string::npos);
}

TEST_CASE("tessera train learns the LeNet and tiny GPT sample configs") {
  if (!tessera::onnxSupported()) {
    MESSAGE("this build has no ONNX support; nothing to run");
    return;
  }
  // Fashion-MNIST through the LeNet export: the IDX images feed its input
  // [batch, 1, 28, 28], and its logits give the accuracy. 50 steps of 64.
  const json lenet = train("samples/configs/lenet.json", {});
  CHECK(lenet["steps"] == 3200 / 64);
  CHECK(lenet["testSamples"] == 1000);
  CHECK(lenet["testAccuracy"].get<double>() > 0.5);  // chance: 0.1
  CHECK(lenet["testLoss"].get<double>() > 0.0);
  CHECK(lenet["testLoss"].get<double>() < lenet["losses"][0].get<double>());
  const ProcessResult printed = tessera::test::runProgram(
      program("TESSERA_CLI"),
      {"train", tessera::test::sourcePath("samples/configs/lenet.json"), "--quiet", "--set",
       "/data/limitTrainSamples=640", "--set", "/data/limitTestSamples=200", "--set", "/data/epochs=1"});
  INFO("stderr: " << printed.err);
  CHECK(printed.exitCode == 0);
  CHECK(printed.out.find("test accuracy: ") != std::string::npos);
  CHECK(printed.out.find("test loss: ") != std::string::npos);

  // The tiny decoder on its generated token set: one pass over the 2048
  // training sequences (64 steps of 32, the cosine schedule over that pass)
  // lowers the loss.
  const json gpt = train("samples/configs/gpt_tiny.json", {});
  CHECK(gpt["steps"] == 2048 / 32);
  CHECK(gpt["testSamples"] == 256);
  CHECK(gpt["testLoss"].get<double>() < gpt["losses"][0].get<double>() - 0.2);
}

TEST_CASE("replicated configs train like one replica with the whole batch") {
  const std::vector<std::string> mean{"/sessionOptions/accumulationAndReplicationReductionType=Mean"};
  const json reference = train("samples/configs/mnist.json", mean);
  SUBCASE("R = 2 x batch 32") {
    checkSameTraining(train("samples/configs/mnist.json",
                            {mean[0], "/sessionOptions/enableReplicatedGraphs=true",
                             "/sessionOptions/replicatedGraphCount=2", "/data/batchSize=32"}),
                      reference, 1e-5);
  }
  SUBCASE("accumulation 2 x R = 2 x batch 16") {
    checkSameTraining(train("samples/configs/mnist.json",
                            {mean[0], "/sessionOptions/enableReplicatedGraphs=true",
                             "/sessionOptions/replicatedGraphCount=2", "/sessionOptions/enableGradientAccumulation=true",
                             "/sessionOptions/accumulationFactor=2", "/data/batchSize=16"}),
                      reference, 1e-5);
  }
}

TEST_CASE("the RTS config shards its weights and trains like the replicated run") {
  const json sharded = train("samples/configs/mnist_rts.json", {});
  const json replicated = train("samples/configs/mnist_rts.json",
                                {"/sessionOptions/weightTensorLocationSettings/location/replicatedTensorSharding=Off",
                                 "/sessionOptions/optimizerStateTensorLocationSettings/location/"
                                 "replicatedTensorSharding=Off"});
  checkSameTraining(sharded, replicated, 1e-5);
}

TEST_CASE("gathering each batch a step ahead on a feed thread trains the same bits as gathering in place") {
  // A device of one host thread gathers in place; of two, the feed gathers step k + 1 while step k runs.
  // Two epochs: the feed must not gather across the reshuffle between them.
  const json inPlace = train("samples/configs/mnist_rts.json", {"/device/numThreads=1", "/data/epochs=2"});
  const json ahead = train("samples/configs/mnist_rts.json", {"/device/numThreads=2", "/data/epochs=2"});
  REQUIRE(inPlace["losses"].size() == 100);
  CHECK(ahead["losses"] == inPlace["losses"]);
  CHECK(ahead["epochTestAccuracies"] == inPlace["epochTestAccuracies"]);
}

TEST_CASE("the RTS recipe config trains like plain replication") {
  // The recipe sums gradients over the 4 replicas (PopART's default reduction): a smaller step keeps
  // training stable, so that float rounding is all that differs.
  const json sharded = train("samples/configs/rts_recipe.json", {"/data/batchSize=8", "/optimizer/learningRate=0.01"});
  const json replicated = train("samples/configs/rts_recipe.json",
                                {"/data/batchSize=8", "/optimizer/learningRate=0.01",
                                 "/sessionOptions/weightTensorLocationSettings/location/replicatedTensorSharding=Off",
                                 "/sessionOptions/optimizerStateTensorLocationSettings/location/"
                                 "replicatedTensorSharding=Off"});
  checkSameTraining(sharded, replicated, 1e-5);
}

TEST_CASE("tessera train keeps tensors where the config says and trains the same") {
  const json reference = train("samples/configs/mnist_rts.json", {});
  const json located = train("samples/configs/mnist_rts.json",
                             {"/sessionOptions/numIOTiles=64",
                              "/sessionOptions/optimizerStateTensorLocationSettings/location/storage=OffChip",
                              "/sessionOptions/optimizerStateTensorLocationSettings/location/loadTileSet=IO",
                              "/sessionOptions/activationTensorLocationSettings/location/storage=OffChip",
                              "/sessionOptions/weightTensorLocationSettings/location/shardingDomain/type=Orthogonal",
                              "/sessionOptions/weightTensorLocationSettings/location/shardingDomain/replicaGroupSize=2"});
  checkSameTraining(located, reference, 1e-5);
}

TEST_CASE("a device too small for the MLP is an OOM error whose fastest fitting levers make it fit") {
  // The MLP 784-256-128-10 with Adam at batch 64 peaks at about 5.9 MiB on the compute tiles; its
  // optimizer state (two moments per weight, about 1 MiB) is the part that can move off chip.
  const std::vector<std::string> device{"--set", "/device/tilesPerIpu=10", "--set", "/device/bytesPerTile=560000"};
  std::vector<std::string> args{"train", tessera::test::sourcePath("samples/configs/mnist.json"), "--quiet",
                                "--set", "/data/limitTrainSamples=640", "--set", "/data/limitTestSamples=64",
                                "--set", "/data/epochs=1"};
  args.insert(args.end(), device.begin(), device.end());
  const ProcessResult tooSmall = tessera::test::runProgram(program("TESSERA_CLI"), args);
  INFO("stderr: " << tooSmall.err);
  CHECK(tooSmall.exitCode == 1);
  CHECK(tooSmall.err.find("[tessera.device.401] replica 0") != std::string::npos);
  CHECK(tooSmall.err.find("W0") != std::string::npos);  // among the largest tensors at the peak
  // The fastest combination of levers that fits, as `tessera explain` finds them, with its --set
  // arguments on the line after it.
  const std::string marker = "\nlevers that make it fit (each combination planned, the fastest modelled step first; ";
  const std::size_t at = tooSmall.err.find(marker);
  REQUIRE(at != std::string::npos);
  const std::size_t first = tooSmall.err.find("\n  1. ", at);
  REQUIRE(first != std::string::npos);
  const std::size_t setsStart = tooSmall.err.find('\n', first + 1);
  const std::size_t setsEnd = tooSmall.err.find('\n', setsStart + 1);
  REQUIRE(setsEnd != std::string::npos);
  CHECK(tooSmall.err.substr(first, setsStart - first).find(", fits; modelled step ") != std::string::npos);
  CHECK(tooSmall.err.find("`tessera explain CONFIG`", setsEnd) != std::string::npos);
  std::istringstream sets(tooSmall.err.substr(setsStart + 1, setsEnd - setsStart - 1));
  std::string word;
  int64_t settings = 0;
  while (sets >> word) {
    if (word == "--set") continue;
    // A value with quotes or braces is quoted for a shell, without spaces here.
    if (word.size() > 1 && word.front() == '\'' && word.back() == '\'') word = word.substr(1, word.size() - 2);
    args.emplace_back("--set");
    args.push_back(word);
    ++settings;
  }
  CHECK(settings > 0);
  const ProcessResult fits = tessera::test::runProgram(program("TESSERA_CLI"), args);
  INFO("stderr: " << fits.err);
  CHECK(fits.exitCode == 0);
}

TEST_CASE("mnist_rts: two replicas of 4 match one replica of 8, with and without RTS") {
  const double single = mnistRtsAccuracy({"--replication-factor", "1", "--batch-size", "8"});
  const double replicated = mnistRtsAccuracy({"--replication-factor", "2", "--batch-size", "4"});
  const double sharded = mnistRtsAccuracy({"--replication-factor", "2", "--batch-size", "4", "--rts"});
  CHECK(std::abs(single - replicated) <= 0.005);
  CHECK(std::abs(single - sharded) <= 0.005);
  CHECK(single > 0.5);
}

TEST_CASE("mnist_rts tests every sample, also of a test set smaller than one test step") {
  // 40 test samples against test steps of 80 (one replica) and 160 (two).
  for (const char* replicas : {"1", "2"}) {
    CAPTURE(replicas);
    const ProcessResult result = tessera::test::runProgram(
        program("TESSERA_MNIST_RTS"), {"--dataset", "Synthetic", "--limit-train-samples", "64",
                                       "--limit-test-samples", "40", "--replication-factor", replicas, "--rts"});
    INFO("stdout: " << result.out << "stderr: " << result.err);
    CHECK(result.exitCode == 0);
    const std::string rts = std::string(replicas) == "1" ? "on, not applied with one replica" : "on";
    CHECK(result.out.find(fmt::format("(40 samples, replication factor {}, rts {})\n", replicas, rts)) !=
          std::string::npos);
  }
}
