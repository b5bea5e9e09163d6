// Checkpoints through the `tessera` program (path in TESSERA_CLI): written by
// train, listed by `checkpoint inspect`, resumed with --resume, and written
// when Ctrl-C stops a run.
#include <signal.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "support/process.hpp"
#include "test_support.hpp"

namespace {

using nlohmann::json;
using tessera::test::BackgroundProcess;
using tessera::test::ProcessResult;
using tessera::test::readFile;
using tessera::test::TempDir;

std::string cli() { return tessera::test::cliProgram(); }
using tessera::test::runCli;

// A small synthetic run: 2 replicas x batch 8, 10 steps per epoch.
std::string writeConfig(const TempDir& dir, const std::string& checkpoint, int64_t epochs) {
  const json config = {
      {"sessionOptions",
       {{"enableReplicatedGraphs", true},
        {"replicatedGraphCount", 2},
        {"accumulationAndReplicationReductionType", "Mean"}}},
      {"model", {{"layers", {784, 16, 10}}}},
      {"optimizer", {{"type", "SGD"}, {"learningRate", 0.05}, {"momentum", 0.9}}},
      {"data",
       {{"dataset", "Synthetic"},
        {"batchSize", 8},
        {"epochs", epochs},
        {"limitTrainSamples", 160},
        {"limitTestSamples", 50}}},
      {"output", {{"checkpoint", checkpoint}}},
  };
  return dir.write("run.json", config.dump(2));
}

}  // namespace

TEST_CASE("checkpoint inspect lists the tensors and metadata of a trained run") {
  const TempDir dir;
  const std::string checkpoint = (dir.path() / "run.safetensors").string();
  const std::string config = writeConfig(dir, checkpoint, 1);
  const ProcessResult trained = runCli({"train", config, "--quiet"});
  INFO("stderr: " << trained.err);
  REQUIRE(trained.exitCode == 0);
  CHECK(trained.out.find("checkpoint: " + checkpoint + " (step 10)\n") != std::string::npos);

  const ProcessResult listed = runCli({"checkpoint", "inspect", checkpoint, "--json"});
  INFO("stderr: " << listed.err);
  REQUIRE(listed.exitCode == 0);
  const json report = json::parse(listed.out);
  CHECK(report["step"] == 10);
  CHECK(report["optimizerStep"] == 10);
  CHECK(report["formatVersion"] == 1);
  CHECK(report["optimizer"]["type"] == "SGD");
  CHECK(report["optimizer"]["momentum"] == 0.9);
  CHECK(report["sessionOptions"]["replicatedGraphCount"] == 2);
  CHECK(report["sessionOptionsHash"].get<std::string>().starts_with("fnv1a64:"));
  CHECK(report["metadata"]["globalBatch"] == "16");
  CHECK(json::parse(report["metadata"]["runConfig"].get<std::string>())["data"]["limitTrainSamples"] == 160);
  REQUIRE(report["tensors"].size() == 8);
  const json w0 = {{"name", "W0"},         {"dtype", "F32"},          {"shape", {784, 16}},
                   {"category", "Weight"}, {"shardLayoutVersion", 1}, {"bytes", 784 * 16 * 4}};
  CHECK(report["tensors"][0] == w0);
  CHECK(report["tensors"][4]["name"] == "W0.momentum");
  CHECK(report["tensors"][4]["category"] == "OptimizerState");

  const ProcessResult text = runCli({"checkpoint", "inspect", checkpoint});
  REQUIRE(text.exitCode == 0);
  CHECK(text.out.find("step       10\n") != std::string::npos);
  CHECK(text.out.find("W0           F32    [784, 16]  Weight          50176\n") != std::string::npos);
  CHECK(text.out.find("8 tensors, ") != std::string::npos);
  CHECK(text.out.find("globalBatch  16\n") != std::string::npos);
}

TEST_CASE("checkpoint inspect reports damaged and missing files with their error ids") {
  const TempDir dir;
  const std::string damaged = dir.write("damaged.safetensors", std::string("\x10\0\0\0\0\0\0\0{}", 10));
  const ProcessResult corrupt = runCli({"checkpoint", "inspect", damaged});
  CHECK(corrupt.exitCode == 1);
  CHECK(corrupt.err.starts_with("error: [tessera.io.603] " + damaged + ": "));

  const std::string missing = (dir.path() / "missing.safetensors").string();
  const ProcessResult absent = runCli({"checkpoint", "inspect", missing});
  CHECK(absent.exitCode == 2);
  CHECK(absent.err.starts_with("error: [tessera.io.601] " + missing + ": "));

  CHECK(runCli({"checkpoint"}).exitCode == 2);
}

TEST_CASE("Ctrl-C stops training at a step boundary, writes the checkpoint, and --resume finishes the run") {
  const TempDir dir;
  const std::string checkpoint = (dir.path() / "run.safetensors").string();
  const std::string config = writeConfig(dir, checkpoint, 1000000);
  BackgroundProcess training(dir.path(), cli(), {"train", config});
  REQUIRE_MESSAGE(training.waitForError("epoch 2/", 120), "training did not start");
  training.signal(SIGINT);
  const ProcessResult stopped = training.wait();
  INFO("stdout: " << stopped.out << "\nstderr: " << stopped.err);
  CHECK(stopped.exitCode == 130);
  const size_t at = stopped.err.find("interrupted after step ");
  REQUIRE(at != std::string::npos);
  const int64_t step = std::stoll(stopped.err.substr(at + 23));
  CHECK(step >= 10);
  CHECK(stopped.err.find("; checkpoint written to " + checkpoint + "; continue with: tessera train " +
                         config + " --resume " + checkpoint + "\n") != std::string::npos);
  CHECK(stopped.out.find("test accuracy") == std::string::npos);

  const ProcessResult listed = runCli({"checkpoint", "inspect", checkpoint, "--json"});
  REQUIRE(listed.exitCode == 0);
  CHECK(json::parse(listed.out)["step"] == step);

  // Finish the epoch the run was in, from another replica count.
  const int64_t epochs = step / 10 + 1;
  const std::string summary = (dir.path() / "summary.json").string();
  const ProcessResult resumed =
      runCli({"train", config, "--quiet", "--resume", checkpoint, "--json-summary", summary, "--set",
              "/data/epochs=" + std::to_string(epochs), "--set", "/sessionOptions/replicatedGraphCount=4",
              "--set", "/data/batchSize=4"});
  INFO("resumed stderr: " << resumed.err);
  REQUIRE(resumed.exitCode == 0);
  CHECK(resumed.out.find("resumed: " + checkpoint + " at step " + std::to_string(step) + "\n") !=
        std::string::npos);
  CHECK(resumed.err.find("warning: the checkpoint was written with other session options "
                         "(/sessionOptions/replicatedGraphCount 2 -> 4)") != std::string::npos);
  const json result = json::parse(readFile(summary));
  CHECK(result["firstStep"] == step);
  CHECK(result["steps"] == epochs * 10 - step);
  CHECK(result["interrupted"] == false);
  CHECK(result["checkpointStep"] == epochs * 10);
}

TEST_CASE("--resume rejects the checkpoint of another model") {
  const TempDir dir;
  const std::string checkpoint = (dir.path() / "run.safetensors").string();
  const std::string config = writeConfig(dir, checkpoint, 1);
  REQUIRE(runCli({"train", config, "--quiet"}).exitCode == 0);
  const ProcessResult wider = runCli({"train", config, "--quiet", "--resume", checkpoint, "--set",
                                      "/model/layers/1=32", "--set", "/output/checkpoint=\"\""});
  CHECK(wider.exitCode == 1);
  CHECK(wider.err.starts_with(
      "error: [tessera.io.604] " + checkpoint +
      ": tensor \"W0\" has shape [784, 16] in the checkpoint but [784, 32] in the model"));
}

TEST_CASE("a checkpoint interval without a checkpoint path is rejected") {
  const TempDir dir;
  const std::string config = writeConfig(dir, "", 1);
  const ProcessResult result = runCli({"validate", config, "--set", "/output/checkpointEvery=5"});
  CHECK(result.exitCode == 1);
  CHECK(result.err.starts_with(
      "error: [tessera.config.155] /output/checkpointEvery: checkpointEvery is 5 but no "
      "checkpoint path is set"));
}

TEST_CASE("checkpoint inspect lists F16 tensors at 2 bytes per element") {
  const std::string checkpoint = tessera::test::sourcePath("tests/data/checkpoint/valid-f16.safetensors");
  const ProcessResult listed = runCli({"checkpoint", "inspect", checkpoint, "--json"});
  INFO("stderr: " << listed.err);
  REQUIRE(listed.exitCode == 0);
  const json report = json::parse(listed.out);
  REQUIRE(report["tensors"].size() == 8);
  const json w0 = {{"name", "W0"},         {"dtype", "F16"},          {"shape", {784, 1}},
                   {"category", "Weight"}, {"shardLayoutVersion", 1}, {"bytes", 784 * 2}};
  CHECK(report["tensors"][0] == w0);
  const ProcessResult text = runCli({"checkpoint", "inspect", checkpoint});
  REQUIRE(text.exitCode == 0);
  CHECK(text.out.find("8 tensors, 3220 bytes\n") != std::string::npos);
}
