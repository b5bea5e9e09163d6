// Multi-instance runs end to end: `tessera launch` starts instances under
// mpirun, and training split over them must match one instance running every
// replica; instances that disagree or go missing must fail everywhere,
// quickly and clearly. Every run is bounded by the launcher's timeout.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "support/process.hpp"
#include "tessera/onnx/onnx.hpp"
#include "test_support.hpp"

namespace {

using nlohmann::json;
using tessera::test::ProcessResult;
using tessera::test::TempDir;
using Clock = std::chrono::steady_clock;

std::string program(const char* variable) {
  const char* path = std::getenv(variable);
  REQUIRE_MESSAGE(path != nullptr, variable, " must name the program");
  return path;
}

// The training settings every run below shares: 1024 training samples of
// Fashion-MNIST (or the synthetic stand-in), a global batch of 4 x 16.
std::vector<std::string> trainArgs(const std::string& config, const std::vector<std::string>& sets) {
  std::vector<std::string> args{"train", tessera::test::sourcePath(config), "--quiet"};
  for (const std::string& set : std::vector<std::string>{
           "/data/limitTrainSamples=1024", "/data/limitTestSamples=400", "/data/epochs=1",
           "/data/batchSize=16", "/sessionOptions/enableReplicatedGraphs=true",
           "/sessionOptions/replicatedGraphCount=4",
           "/sessionOptions/accumulationAndReplicationReductionType=Mean"}) {
    args.insert(args.end(), {"--set", set});
  }
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  return args;
}

// `tessera train` of the MNIST config with trainArgs' settings, as one
// shell command line (each argument single-quoted).
std::string shellTrainCommand() {
  std::string command = "'" + program("TESSERA_CLI") + "'";
  for (const std::string& a : trainArgs("samples/configs/mnist.json", {})) command += " '" + a + "'";
  return command;
}

struct Run {
  json summary;
  json weights;
};

// `tessera train` on one instance (instances == 0) or under `tessera launch`.
Run train(const std::string& config, const std::vector<std::string>& sets, int64_t instances) {
  const TempDir dir;
  const std::string summary = (dir.path() / "summary.json").string();
  const std::string weights = (dir.path() / "weights.json").string();
  std::vector<std::string> args = trainArgs(config, sets);
  args.insert(args.end(), {"--json-summary", summary, "--dump-weights", weights});
  if (instances > 0) {
    std::vector<std::string> launch{
        "launch", "--num-replicas",      "4", "--num-instances", std::to_string(instances), "--timeout", "60",
        "--",     program("TESSERA_CLI")};
    args.insert(args.begin(), launch.begin(), launch.end());
  }
  const ProcessResult result = tessera::test::runProgram(program("TESSERA_CLI"), args);
  INFO("stdout: " << result.out << "\nstderr: " << result.err);
  REQUIRE(result.exitCode == 0);
  return {json::parse(tessera::test::readFile(summary)), json::parse(tessera::test::readFile(weights))};
}

double maxDifference(const json& a, const json& b) {
  REQUIRE(a.size() == b.size());
  double most = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    most = std::max(most, std::abs(a[i].get<double>() - b[i].get<double>()));
  return most;
}

void checkSameTraining(const Run& split, const Run& one) {
  CHECK(split.summary["steps"] == one.summary["steps"]);
  CHECK(split.summary["globalBatch"] == 64);
  CHECK(maxDifference(split.summary["losses"], one.summary["losses"]) <= 1e-6);
  CHECK(split.summary["testAccuracy"] == one.summary["testAccuracy"]);
  REQUIRE(split.weights.size() == one.weights.size());
  for (const auto& item : one.weights.items()) {
    const std::string name = item.key();
    INFO("weight " << name);
    REQUIRE(split.weights.contains(name));
    CHECK(maxDifference(split.weights[name], item.value()) <= 1e-6);
  }
}

// The weight, optimizer state and accumulator settings' sharding domain.
std::vector<std::string> shardingDomain(const std::string& domain) {
  std::vector<std::string> sets;
  for (const char* category : {"weight", "optimizerState", "accumulator"}) {
    sets.push_back(std::string("/sessionOptions/") + category +
                   "TensorLocationSettings/location/shardingDomain=" + domain);
  }
  return sets;
}

const std::vector<std::string> kConsecutive2 =
    shardingDomain(R"({"type":"Consecutive","replicaGroupSize":2})");

}  // namespace

// The MLP export of samples/configs/mlp_onnx.json on its tensors dataset
// (192 samples: 3 steps of 64), its weights and momentum sharded: every
// instance reads its part of each global batch of the .safetensors file.
TEST_CASE("tessera launch: an ONNX model on a tensors dataset trains like 1 x 4 replicas") {
  if (!tessera::onnxSupported()) {
    MESSAGE("this build has no ONNX support; nothing to run");
    return;
  }
  for (const std::vector<std::string>& domain : {std::vector<std::string>{}, kConsecutive2}) {
    std::vector<std::string> sets = domain;
    sets.push_back("/data/testBatchSize=2");
    const Run one = train("samples/configs/mlp_onnx.json", sets, 0);
    CHECK(one.summary["steps"] == 3);
    for (const int64_t instances : {2, 4}) {
      CAPTURE(instances);
      const Run split = train("samples/configs/mlp_onnx.json", sets, instances);
      checkSameTraining(split, one);
      CHECK(one.summary["testLoss"].get<double>() > 0.0);
      CHECK(std::abs(split.summary["testLoss"].get<double>() - one.summary["testLoss"].get<double>()) <=
            1e-6);
    }
  }
}

TEST_CASE("tessera launch: 2 x 2 and 4 x 1 instances train like 1 x 4 replicas") {
  SUBCASE("plain replication") {
    const Run one = train("samples/configs/mnist.json", {}, 0);
    CHECK(one.summary["steps"] == 16);
    checkSameTraining(train("samples/configs/mnist.json", {}, 2), one);
    checkSameTraining(train("samples/configs/mnist.json", {}, 4), one);
  }
  SUBCASE("replicated tensor sharding over all replicas") {
    const Run one = train("samples/configs/mnist_rts.json", {}, 0);
    checkSameTraining(train("samples/configs/mnist_rts.json", {}, 2), one);
    checkSameTraining(train("samples/configs/mnist_rts.json", {}, 4), one);
  }
  SUBCASE("replicated tensor sharding over Consecutive(2) domains") {
    const Run one = train("samples/configs/mnist_rts.json", kConsecutive2, 0);
    checkSameTraining(train("samples/configs/mnist_rts.json", kConsecutive2, 2), one);
  }
  SUBCASE("optimizer state in streaming memory") {
    const std::vector<std::string> offChip{
        "/sessionOptions/optimizerStateTensorLocationSettings/location/storage=OffChip"};
    const Run one = train("samples/configs/mnist_rts.json", offChip, 0);
    checkSameTraining(train("samples/configs/mnist_rts.json", offChip, 2), one);
    checkSameTraining(train("samples/configs/mnist_rts.json", offChip, 4), one);
  }
}

// The float16 MLP of samples/configs/mlp_float16.json (Adam, float32 master
// weights, automatic loss scaling) started at a scale of 2^24, which
// overflows the float16 gradients: the steps skipped are decided over every
// replica of every instance. The weights and the Adam state are sharded over
// all 4 replicas, so the weights instance 0 dumps hold the shards instance 1
// updated: had it skipped other steps, they would differ.
TEST_CASE(
    "tessera launch: a float16 run whose loss scale overflows skips the same steps on 2 x 2 as on 1 x 4") {
  const std::vector<std::string> sets{
      "/optimizer/lossScaling=16777216",
      "/sessionOptions/weightTensorLocationSettings/location/replicatedTensorSharding=On",
      "/sessionOptions/weightTensorLocationSettings/minElementsForReplicatedTensorSharding=2",
      "/sessionOptions/optimizerStateTensorLocationSettings/location/replicatedTensorSharding=On",
      "/sessionOptions/optimizerStateTensorLocationSettings/minElementsForReplicatedTensorSharding=2"};
  const Run one = train("samples/configs/mlp_float16.json", sets, 0);
  const Run split = train("samples/configs/mlp_float16.json", sets, 2);
  CHECK(one.summary["steps"] == 16);
  // Seen: steps 0 to 7 overflow, the scale ends at 2^16 (the sharded
  // gradients are summed in half before the Mean's 1/4; see docs/precision.md, Loss scaling).
  const json skipped = one.summary["skippedStepIndices"];
  CHECK(skipped.size() >= 2);
  CHECK(split.summary["skippedStepIndices"] == skipped);
  CHECK(split.summary["lossScale"] == one.summary["lossScale"]);
  // The same arithmetic on the same replicas: the same bits.
  CHECK(split.summary["losses"] == one.summary["losses"]);
  CHECK(split.weights == one.weights);
  checkSameTraining(split, one);
}

TEST_CASE("a 2 x 2 run writes one checkpoint, and one instance resumes it like an uninterrupted run") {
  const TempDir dir;
  const std::string checkpoint = (dir.path() / "run.safetensors").string();
  // The first epoch on two instances, checkpointed at its end.
  std::vector<std::string> first = trainArgs("samples/configs/mnist_rts.json", {"/output/checkpoint=" + checkpoint});
  const std::vector<std::string> launch{"launch", "--num-replicas", "4", "--num-instances", "2", "--timeout", "60",
                                        "--", program("TESSERA_CLI")};
  first.insert(first.begin(), launch.begin(), launch.end());
  const ProcessResult split = tessera::test::runProgram(program("TESSERA_CLI"), first);
  INFO("stderr: " << split.err);
  REQUIRE(split.exitCode == 0);
  // Written once, by one instance: no temporary files are left beside it.
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir.path())) ++files;
  CHECK(files == 1);

  // The second epoch on one instance with 4 replicas, against two epochs there without a stop.
  const auto secondEpoch = [&](const std::string& tag, std::vector<std::string> extra) {
    const std::string summary = (dir.path() / (tag + ".json")).string();
    const std::string weights = (dir.path() / (tag + ".weights.json")).string();
    std::vector<std::string> args = trainArgs("samples/configs/mnist_rts.json", {"/data/epochs=2"});
    args.insert(args.end(), {"--json-summary", summary, "--dump-weights", weights});
    args.insert(args.end(), extra.begin(), extra.end());
    const ProcessResult result = tessera::test::runProgram(program("TESSERA_CLI"), args);
    INFO("stderr: " << result.err);
    REQUIRE(result.exitCode == 0);
    return Run{json::parse(tessera::test::readFile(summary)), json::parse(tessera::test::readFile(weights))};
  };
  const Run resumed = secondEpoch("resumed", {"--resume", checkpoint});
  const Run whole = secondEpoch("whole", {});
  CHECK(resumed.summary["firstStep"] == 16);
  CHECK(std::abs(resumed.summary["finalLoss"].get<double>() - whole.summary["finalLoss"].get<double>()) <= 1e-6);
  for (const auto& item : whole.weights.items()) {
    const std::string name = item.key();
    INFO("weight " << name);
    REQUIRE(resumed.weights.contains(name));
    CHECK(maxDifference(resumed.weights[name], item.value()) <= 1e-6);
  }
}

TEST_CASE(
    "SIGTERM to tessera launch stops both instances at one step with one checkpoint, and resuming it "
    "ends like an uninterrupted run") {
  const TempDir dir;
  const TempDir logs;
  const std::string checkpoint = (dir.path() / "run.safetensors").string();
  std::vector<std::string> args = trainArgs("samples/configs/mnist_rts.json",
                                            {"/output/checkpoint=" + checkpoint, "/data/epochs=1000000"});
  args.erase(std::find(args.begin(), args.end(), "--quiet"));
  // Each instance runs under a shell that reports its exit code; the shell
  // ignores the signals mpirun sends to the instance's process group.
  std::string command = "trap '' USR1 USR2 TERM; '" + program("TESSERA_CLI") + "'";
  for (const std::string& a : args) command += " '" + a + "'";
  command += "; code=$?; echo \"instance $OMPI_COMM_WORLD_RANK exited with $code\"; exit $code";
  tessera::test::BackgroundProcess launched(logs.path(), program("TESSERA_CLI"),
                                            {"launch", "--num-replicas", "4", "--num-instances", "2",
                                             "--timeout", "60", "--", "sh", "-c", command});
  REQUIRE_MESSAGE(launched.waitForError("epoch 2/", 300), "training did not start");
  launched.signal(SIGTERM);
  const ProcessResult stopped = launched.wait();
  INFO("stdout: " << stopped.out << "\nstderr: " << stopped.err);
  CHECK(stopped.exitCode == 143);
  CHECK(stopped.out.find("instance 0 exited with 143") != std::string::npos);
  CHECK(stopped.out.find("instance 1 exited with 143") != std::string::npos);
  const std::string marker = "interrupted after step ";
  const size_t at = stopped.err.find(marker);
  REQUIRE(at != std::string::npos);
  const int64_t step = std::stoll(stopped.err.substr(at + marker.size()));
  CHECK(step >= 32);
  CHECK(stopped.err.find(" by SIGTERM; checkpoint written to " + checkpoint) != std::string::npos);
  // Instance 0 alone reports, and writes one file.
  CHECK(stopped.err.find(marker, at + 1) == std::string::npos);
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    files.push_back(entry.path().filename().string());
  CHECK(files == std::vector<std::string>{"run.safetensors"});

  // Resumed on two instances to the end of the epoch it stopped in, against
  // one instance that trained that far without a stop.
  const std::string epochs = "/data/epochs=" + std::to_string(step / 16 + 1);
  const Run resumed = [&] {
    const std::string summary = (dir.path() / "resumed.json").string();
    const std::string weights = (dir.path() / "resumed.weights.json").string();
    std::vector<std::string> resume = trainArgs("samples/configs/mnist_rts.json", {epochs});
    resume.insert(resume.end(),
                  {"--resume", checkpoint, "--json-summary", summary, "--dump-weights", weights});
    const std::vector<std::string> launch{
        "launch", "--num-replicas",      "4", "--num-instances", "2", "--timeout", "60",
        "--",     program("TESSERA_CLI")};
    resume.insert(resume.begin(), launch.begin(), launch.end());
    const ProcessResult result = tessera::test::runProgram(program("TESSERA_CLI"), resume);
    INFO("resumed stderr: " << result.err);
    REQUIRE(result.exitCode == 0);
    return Run{json::parse(tessera::test::readFile(summary)), json::parse(tessera::test::readFile(weights))};
  }();
  const Run whole = train("samples/configs/mnist_rts.json", {epochs}, 0);
  CHECK(resumed.summary["firstStep"] == step);
  CHECK(resumed.summary["steps"].get<int64_t>() + step == whole.summary["steps"].get<int64_t>());
  REQUIRE(resumed.weights.size() == whole.weights.size());
  for (const auto& item : whole.weights.items()) {
    const std::string name = item.key();
    INFO("weight " << name);
    REQUIRE(resumed.weights.contains(name));
    CHECK(maxDifference(resumed.weights[name], item.value()) <= 1e-6);
  }
}

TEST_CASE("the PopDist example checks its replicas on every instance") {
  for (const std::string instances : {"1", "2", "4"}) {
    CAPTURE(instances);
    const ProcessResult result = tessera::test::runProgram(
        program("TESSERA_CLI"), {"launch", "--num-replicas", "4", "--num-instances", instances, "--timeout",
                                 "30", "--", program("TESSERA_POPDIST_EXAMPLE"), "--replicas", "4"});
    INFO("stdout: " << result.out << "\nstderr: " << result.err);
    CHECK(result.exitCode == 0);
    CHECK(result.out.find("FAIL") == std::string::npos);
    const std::string instance3 =
        "ok   instance 3: the all-reduce over 4 replicas gives 10 on its 1 replica(s)";
    CHECK((result.out.find(instance3) != std::string::npos) == (instances == "4"));
    CHECK(result.out.find("ok   instance 0: the all-reduce over 4 replicas gives 10") != std::string::npos);
  }
}

TEST_CASE("instances started with different configs fail alike, naming the setting") {
  const auto start = Clock::now();
  // Each instance gets its own seed.
  const ProcessResult result = tessera::test::runProgram(
      program("TESSERA_CLI"),
      {"launch", "--num-replicas", "4", "--num-instances", "2", "--timeout", "30", "--", "sh", "-c",
       "exec " + shellTrainCommand() + " --set /data/seed=$OMPI_COMM_WORLD_RANK"});
  INFO("stdout: " << result.out << "\nstderr: " << result.err);
  CHECK(result.exitCode != 0);
  CHECK(result.err.find(
            "[tessera.dist.502] /runConfig/data/seed: the instances' run configs and datasets differ "
            "here: 0 on instance 0, 1 on instance 1") != std::string::npos);
  CHECK(Clock::now() - start < std::chrono::seconds(30));
}

TEST_CASE("an instance that leaves makes the others fail within the timeout") {
  SUBCASE("it leaves after starting: the others name it after --timeout") {
    const auto start = Clock::now();
    const ProcessResult result = tessera::test::runProgram(
        program("TESSERA_CLI"), {"launch", "--num-replicas", "4", "--num-instances", "2", "--timeout", "2",
                                 "--", program("TESSERA_POPDIST_EXAMPLE"), "--drop-instance", "1"});
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    INFO("stdout: " << result.out << "\nstderr: " << result.err << "\nafter " << seconds << " s");
    CHECK(result.exitCode != 0);
    CHECK(result.out.find("instance 1 leaves now") != std::string::npos);
    CHECK(result.err.find("[tessera.dist.503] instance 1: instance 0 waited 2.0 s") != std::string::npos);
    CHECK(seconds >= 2.0);
    CHECK(seconds < 20.0);
  }
  SUBCASE("it exits with an error: mpirun stops the others") {
    const auto start = Clock::now();
    const ProcessResult result = tessera::test::runProgram(
        program("TESSERA_CLI"),
        {"launch", "--num-replicas", "4", "--num-instances", "2", "--timeout", "30", "--", "sh", "-c",
         "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exit 3; fi; exec " + shellTrainCommand()});
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    INFO("stdout: " << result.out << "\nstderr: " << result.err << "\nafter " << seconds << " s");
    CHECK(result.exitCode != 0);
    CHECK(result.out.find("final loss") == std::string::npos);
    CHECK(seconds < 20.0);
  }
}

TEST_CASE("tessera launch checks its counts before starting anything") {
  struct Row {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Row> rows = {
      {{"--num-replicas", "4", "--num-instances", "3"},
       "[tessera.config.106] --num-replicas: 4 replicas do not split evenly over 3 instances"},
      {{"--num-replicas", "0"}, "[tessera.config.106] --num-replicas: 0 replicas requested"},
      {{"--num-instances", "0"}, "[tessera.config.106] --num-instances: 0 instances requested"},
      // More instances than mpirun could start here (it failed part-way on the pipe limit).
      {{"--num-replicas", "32768", "--num-instances", "32768"},
       "[tessera.dist.508] --num-instances: 32768 instances requested; this machine lets mpirun start at "
       "most "},
      {{"--num-replicas", "4", "--num-instances", "4", "--timeout", "nan"},
       "[tessera.config.190] --timeout: \"nan\" is not a number of seconds in (0, 3.1536e+07]"},
      {{"--timeout", "0"}, "[tessera.config.190] --timeout: \"0\" is not a number of seconds"},
      {{"--timeout", "-5"}, "[tessera.config.190] --timeout: \"-5\" is not a number of seconds"},
      {{"--timeout", "inf"}, "[tessera.config.190] --timeout: \"inf\" is not a number of seconds"},
      {{"--timeout", "5s"}, "[tessera.config.190] --timeout: \"5s\" is not a number of seconds"},
  };
  for (const Row& row : rows) {
    CAPTURE(row.message);
    std::vector<std::string> args{"launch"};
    args.insert(args.end(), row.args.begin(), row.args.end());
    args.insert(args.end(), {"--", "true"});
    const auto start = Clock::now();
    const ProcessResult result = tessera::test::runProgram(program("TESSERA_CLI"), args);
    INFO("stderr: " << result.err);
    // A value out of an option's range is a usage error, like a malformed one.
    CHECK(result.exitCode == (row.message.find("config.190") != std::string::npos ? 2 : 1));
    CHECK(result.err.find(row.message) != std::string::npos);
    CHECK(Clock::now() - start < std::chrono::seconds(3));
  }
}

TEST_CASE("an instance that never starts MPI fails the launch after --timeout, naming the timeout") {
  // Instance 1 never calls MPI_Init; instance 0 would wait in it for ever.
  const auto start = Clock::now();
  const ProcessResult result = tessera::test::runProgram(
      program("TESSERA_CLI"),
      {"launch", "--num-replicas", "4", "--num-instances", "2", "--timeout", "3", "--", "sh", "-c",
       "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exec sleep 120; fi; exec " + shellTrainCommand()});
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  INFO("stdout: " << result.out << "\nstderr: " << result.err << "\nafter " << seconds << " s");
  CHECK(result.exitCode == 1);
  CHECK(result.err.find("error: [tessera.dist.507] instance 0: not every instance started MPI within 3.0 s") !=
        std::string::npos);
  CHECK(result.err.find("TESSERA_DIST_TIMEOUT=3") != std::string::npos);
  CHECK(seconds >= 3.0);
  CHECK(seconds < 20.0);
}

TEST_CASE("tessera launch ends an mpirun that does not stop within --timeout of SIGTERM") {
  // A stand-in for mpirun that ignores the stop request (SIGUSR1) forwarded to it.
  const TempDir dir;
  const TempDir logs;
  const std::filesystem::path fake = dir.path() / "stuck-mpirun";
  std::ofstream(fake) << "#!/bin/sh\ntrap '' USR1 USR2\necho 'stuck mpirun started' >&2\nexec sleep 120\n";
  std::filesystem::permissions(fake, std::filesystem::perms::owner_all);
  tessera::test::BackgroundProcess launched(
      logs.path(), program("TESSERA_CLI"),
      {"launch", "--timeout", "1", "--mpirun", fake.string(), "--", "true"});
  REQUIRE_MESSAGE(launched.waitForError("stuck mpirun started", 30), "the stand-in did not start");
  const auto start = Clock::now();
  launched.signal(SIGTERM);
  const ProcessResult stopped = launched.wait();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  INFO("stderr: " << stopped.err << "\nafter " << seconds << " s");
  // The stop request, then SIGTERM to mpirun once --timeout has passed.
  CHECK(stopped.exitCode == 143);
  CHECK(seconds >= 1.0);
  CHECK(seconds < 3.0);
}

TEST_CASE("Ctrl-C to tessera launch's process group stops both instances at one step with one checkpoint") {
  const TempDir dir;
  const TempDir logs;
  const std::string checkpoint = (dir.path() / "run.safetensors").string();
  std::vector<std::string> args = trainArgs("samples/configs/mnist_rts.json",
                                            {"/output/checkpoint=" + checkpoint, "/data/epochs=1000000"});
  args.erase(std::find(args.begin(), args.end(), "--quiet"));
  std::vector<std::string> launch{"launch", "--num-replicas", "4",  "--num-instances",     "2",
                                  "--timeout", "60",          "--", program("TESSERA_CLI")};
  launch.insert(launch.end(), args.begin(), args.end());
  tessera::test::ProcessSetup setup;
  setup.newProcessGroup = true;
  tessera::test::BackgroundProcess launched(logs.path(), program("TESSERA_CLI"), launch, setup);
  REQUIRE_MESSAGE(launched.waitForError("epoch 2/", 300), "training did not start");
  // What a terminal does on Ctrl-C: SIGINT to every process of the foreground job.
  launched.signalGroup(SIGINT);
  const ProcessResult stopped = launched.wait();
  INFO("stdout: " << stopped.out << "\nstderr: " << stopped.err);
  CHECK(stopped.exitCode == 130);
  const std::string marker = "interrupted after step ";
  const size_t at = stopped.err.find(marker);
  REQUIRE(at != std::string::npos);
  CHECK(stopped.err.find(marker, at + 1) == std::string::npos);
  // The hint repeats the launch and every --set of the run.
  CHECK(stopped.err.find("; continue with: tessera launch --num-replicas 4 --num-instances 2 --timeout 60 -- "
                         "tessera train ") != std::string::npos);
  CHECK(stopped.err.find(" --set /data/limitTrainSamples=1024 --set /data/limitTestSamples=400 ") !=
        std::string::npos);
  CHECK(stopped.err.find(" --set /output/checkpoint=" + checkpoint + " --set /data/epochs=1000000 --resume " +
                         checkpoint + "\n") != std::string::npos);
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    files.push_back(entry.path().filename().string());
  CHECK(files == std::vector<std::string>{"run.safetensors"});
}
