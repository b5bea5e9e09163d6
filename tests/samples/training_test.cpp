// End-to-end training through the programs users run: `tessera train` on the
// sample configs and the mnist_rts sample, on bounded subsets of the data
// (the full runs are recorded in the README).
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "support/process.hpp"
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

TEST_CASE("tessera train rejects settings it cannot honour") {
  const ProcessResult result = tessera::test::runProgram(
      program("TESSERA_CLI"),
      {"train", tessera::test::sourcePath("samples/configs/mnist.json"), "--quiet", "--set",
       "/sessionOptions/activationTensorLocationSettings/location/storage=OffChip"});
  CHECK(result.exitCode == 1);
  CHECK(result.err.find("[tessera.config.125] /sessionOptions/activationTensorLocationSettings/location/storage") !=
        std::string::npos);
}

TEST_CASE("mnist_rts: two replicas of 4 match one replica of 8, with and without RTS") {
  const double single = mnistRtsAccuracy({"--replication-factor", "1", "--batch-size", "8"});
  const double replicated = mnistRtsAccuracy({"--replication-factor", "2", "--batch-size", "4"});
  const double sharded = mnistRtsAccuracy({"--replication-factor", "2", "--batch-size", "4", "--rts"});
  CHECK(std::abs(single - replicated) <= 0.005);
  CHECK(std::abs(single - sharded) <= 0.005);
  CHECK(single > 0.5);
}
