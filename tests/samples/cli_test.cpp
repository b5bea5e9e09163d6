// Runs the built `tessera` program (path in TESSERA_CLI) and checks its
// output and exit codes.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "samples/cli_support.hpp"
#include "support/process.hpp"
#include "tessera/onnx/onnx.hpp"
#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tessera::test::commandLine;
using tessera::test::parseJson;
using tessera::test::readFile;
using tessera::test::runCli;
using tessera::test::startsWith;
using tessera::test::TempDir;
using CliResult = tessera::test::ProcessResult;

TEST_CASE("validate accepts every sample run config") {
  for (const char* name : {"mnist.json", "mnist_rts.json", "rts_recipe.json", "multipod_recipe.json",
                           "mlp_float16.json", "lenet_float16.json"}) {
    CAPTURE(name);
    const std::string path = tessera::test::sourcePath(std::string("samples/configs/") + name);
    const CliResult result = runCli({"validate", path});
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 0);
    // The first line, then each host stream as the plan models it.
    CHECK(startsWith(result.out, path + ": valid\nHost streams (one replica, a step of 1 batch):\n"));
    CHECK(result.err.empty());

    const CliResult explained = runCli({"explain", path, "--json"});
    INFO("explain stderr: ", explained.err);
    CHECK(parseJson(explained).contains("provenance"));
  }
}

TEST_CASE("validate and explain show each host stream of the IO-bound sample") {
  const std::string path = tessera::test::sourcePath("samples/configs/io_bound.json");
  const CliResult validated = runCli({"validate", path});
  INFO("stderr: ", validated.err);
  CHECK(validated.exitCode == 0);
  CHECK(startsWith(validated.out, path + ": valid\nHost streams (one replica, a step of 8 batches):\n"));
  CHECK(validated.out.find("OverlapInnerLoop  OverlapInnerLoop  12544000") != std::string::npos);

  const CliResult explained = runCli({"explain", path, "--json"});
  const json report = parseJson(explained);
  REQUIRE(report["hostStreams"].size() == 3);
  CHECK(report["hostStreams"][0]["name"] == "input");
  CHECK(report["hostStreams"][0]["bytesPerStep"] == 8 * 500 * 784 * 4);
  CHECK(report["hostStreams"][0]["overlaps"] == true);
  CHECK(report["traffic"]["HostIO"]["ops"] == 3);
  CHECK(report["modelledStepTime"]["runSeconds"].get<double>() ==
        doctest::Approx(8 * report["modelledStepTime"]["seconds"].get<double>()));

  // Overlap that cannot happen is a note with its id.
  const CliResult compute = runCli({"validate", path, "--set", "/io/tileSet=Compute"});
  CHECK(compute.exitCode == 0);
  CHECK(compute.out.find("warning: [tessera.note.806] /io/exchangeStrategy:") != std::string::npos);
  CHECK(compute.out.find("OverlapInnerLoop  JustInTime") != std::string::npos);
}

TEST_CASE("validate and explain print the config's warning-level notes with their ids") {
  const std::string path = tessera::test::sourcePath("samples/configs/mlp_float16.json");
  const std::vector<std::string> set = {"--set", "/optimizer/masterWeights=false", "--set",
                                        "/optimizer/accl2Type=float16"};
  std::vector<std::string> validate = {"validate", path};
  validate.insert(validate.end(), set.begin(), set.end());
  const CliResult valid = runCli(validate);
  INFO("stderr: ", valid.err);
  CHECK(valid.exitCode == 0);
  CHECK(startsWith(valid.out, path + ": valid\nwarning: [tessera.note.801] /optimizer/masterWeights: "
                                     "masterWeights is false on a float16 model"));
  CHECK(valid.out.find("accl2Type float16") != std::string::npos);

  std::vector<std::string> explain = {"explain", path};
  explain.insert(explain.end(), set.begin(), set.end());
  const CliResult text = runCli(explain);
  CHECK(text.exitCode == 0);
  CHECK(text.out.find("  warning: [tessera.note.801] /optimizer/masterWeights:") != std::string::npos);
  explain.push_back("--json");
  const json report = parseJson(runCli(explain));
  REQUIRE(report.at("notes").size() == 1);
  CHECK(report.at("notes")[0].at("id") == "tessera.note.801");
  CHECK(report.at("notes")[0].at("path") == "/optimizer/masterWeights");

  // Loss scaling on the float32 MNIST config.
  const std::string mnist = tessera::test::sourcePath("samples/configs/mnist.json");
  const CliResult scaled = runCli({"validate", mnist, "--set", "/optimizer/lossScaling=64"});
  CHECK(scaled.exitCode == 0);
  CHECK(scaled.out.find("warning: [tessera.note.802] /optimizer/lossScaling: lossScaling is 64 on a float32 "
                        "model") != std::string::npos);
  // The samples have no notes.
  CHECK(parseJson(runCli({"explain", path, "--json"})).at("notes").empty());
}

TEST_CASE("validate opens an ONNX config's model and checks its names with the ids train gives") {
  if (!tessera::onnxSupported()) return;  // the importer's absence has its own test above
  const std::string path = tessera::test::sourcePath("samples/configs/mlp_onnx.json");
  const TempDir dir;
  struct Case {
    const char* name;
    std::string set;
    const char* id;
  };
  const std::vector<Case> cases = {
      {"missing model", "/model/path=" + (dir.path() / "missing.onnx").string(), "tessera.io.601"},
      {"truncated model", "/model/path=" + dir.write("truncated.onnx", std::string("\x08\x07\x12", 3)),
       "tessera.onnx.702"},
      {"loss naming no tensor", "/model/loss=lost", "tessera.config.150"},
      {"override naming no tensor",
       R"(/sessionOptions/tensorLocationSettingsOverride={"W9": {"storage": "OffChip"}})", "tessera.graph.203"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    for (const char* command : {"validate", "train"}) {
      CAPTURE(command);
      const CliResult result = runCli({command, path, "--set", c.set});
      INFO("stderr: ", result.err);
      CHECK((result.exitCode == 1 || result.exitCode == 2));
      CHECK(result.out.find("valid") == std::string::npos);
      CHECK(result.err.find(c.id) != std::string::npos);
    }
  }
}

TEST_CASE("validate reports the first broken rule with its id and JSON path") {
  struct Case {
    const char* name;
    const char* config;
    std::vector<std::string> overrides;
    const char* expected;  // the start of stderr: "error: [id] subject"
  };
  const std::vector<Case> cases = {
      {"replication count without replication",
       R"({"sessionOptions": {"replicatedGraphCount": 4}})",
       {},
       "error: [tessera.config.110] /sessionOptions/replicatedGraphCount: "},
      {"replication count from --set",
       "{}",
       {"--set", "/sessionOptions/replicatedGraphCount=4"},
       "error: [tessera.config.110] /sessionOptions/replicatedGraphCount: "},
      {"accumulation factor without accumulation",
       R"({"sessionOptions": {"accumulationFactor": 4}})",
       {},
       "error: [tessera.config.111] /sessionOptions/accumulationFactor: "},
      {"invalid enum string",
       R"({"sessionOptions": {"weightTensorLocationSettings": {"location": {"storage": "onchip"}}}})",
       {},
       "error: [tessera.config.102] /sessionOptions/weightTensorLocationSettings/location/storage: "},
      {"wrong type",
       R"({"sessionOptions": {"replicatedGraphCount": "two"}})",
       {},
       "error: [tessera.config.103] /sessionOptions/replicatedGraphCount: "},
      {"odd IO tile count",
       R"({"sessionOptions": {"numIOTiles": 31}})",
       {},
       "error: [tessera.config.119] /sessionOptions/numIOTiles: "},
      {"sharding domain that does not divide the replicas",
       R"({"sessionOptions": {"enableReplicatedGraphs": true, "replicatedGraphCount": 4,
           "weightTensorLocationSettings": {"location": {"replicatedTensorSharding": "On",
             "shardingDomain": {"type": "Consecutive", "replicaGroupSize": 3}}}}})",
       {},
       "error: [tessera.config.122] /sessionOptions/weightTensorLocationSettings/location/shardingDomain"},
      {"too few model layers",
       R"({"model": {"layers": [784]}})",
       {},
       "error: [tessera.config.150] /model/layers"},
  };
  const TempDir dir;
  for (const Case& c : cases) {
    CAPTURE(c.name);
    std::vector<std::string> args{"validate", dir.write("config.json", c.config)};
    args.insert(args.end(), c.overrides.begin(), c.overrides.end());
    const CliResult result = runCli(args);
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 1);
    CHECK(startsWith(result.err, c.expected));
    CHECK(result.out.empty());
  }
}

TEST_CASE("validate suggests the key meant by an unknown one") {
  const TempDir dir;
  const std::string path = dir.write("typo.json", R"({"sessionOptions": {"replicatedGraphCont": 2}})");
  const CliResult result = runCli({"validate", path});
  INFO("stderr: ", result.err);
  CHECK(result.exitCode == 1);
  CHECK(startsWith(result.err, "error: [tessera.config.104] /sessionOptions/replicatedGraphCont: "));
  CHECK(result.err.find("did you mean \"replicatedGraphCount\"") != std::string::npos);
}

TEST_CASE("validate reports malformed JSON and malformed overrides") {
  const TempDir dir;
  const std::string path = dir.write("broken.json", R"({"sessionOptions": {)");
  SUBCASE("syntax error") {
    const CliResult result = runCli({"validate", path});
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 1);
    CHECK(startsWith(result.err, "error: [tessera.config.101] "));
    CHECK(result.err.find(path) != std::string::npos);
  }
  SUBCASE("override without '='") {
    const CliResult result = runCli({"validate", dir.write("empty.json", "{}"), "--set", "/data/epochs"});
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 1);
    CHECK(startsWith(result.err, "error: [tessera.config.107] "));
    CHECK(result.err.find("/data/epochs") != std::string::npos);
  }
}

TEST_CASE("a missing config file is exit code 2 with the file named") {
  const TempDir dir;
  const std::string missing = (dir.path() / "missing.json").string();
  for (const char* command : {"validate", "explain"}) {
    CAPTURE(command);
    const CliResult result = runCli({command, missing});
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 2);
    CHECK(startsWith(result.err, "error: [tessera.io.601] " + missing));
    CHECK(result.out.empty());
  }
}

// ---------------------------------------------------------------------------
// usage
// ---------------------------------------------------------------------------

TEST_CASE("usage errors are exit code 2") {
  const std::vector<std::vector<std::string>> cases = {
      {"validate"},                              // missing CONFIG
      {"frobnicate"},                            // unknown subcommand
      {"groups"},                                // missing --replicas
      {"groups", "--replicas", "eight"},         // not a number
      {"groups", "--replicas", "8", "--bogus"},  // unknown flag
      {"groups", "--replicas", "99999999999"},   // too many to list
      {"cbr", "--elements", "30"},               // missing --replicas
      {"cbr", "--elements", "30", "--replicas", "4", "extra"},
      {"schema", "--json"},
  };
  for (const auto& args : cases) {
    const std::string command = commandLine(args);
    CAPTURE(command);
    const CliResult result = runCli(args);
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 2);
    CHECK(startsWith(result.err, "error: "));
    CHECK(result.out.empty());
  }
}

TEST_CASE("no subcommand prints help and exits with 2") {
  const CliResult result = runCli({});
  CHECK(result.exitCode == 2);
  for (const char* command : {"validate", "explain", "groups", "cbr", "schema"}) {
    CAPTURE(command);
    CHECK(result.err.find(command) != std::string::npos);
  }
}

TEST_CASE("--help and --version exit with 0") {
  const CliResult help = runCli({"--help"});
  CHECK(help.exitCode == 0);
  CHECK(help.out.find("explain") != std::string::npos);

  const CliResult commandHelp = runCli({"groups", "--help"});
  CHECK(commandHelp.exitCode == 0);
  CHECK(commandHelp.out.find("--group-size") != std::string::npos);

  const CliResult version = runCli({"--version"});
  CHECK(version.exitCode == 0);
  REQUIRE(!version.out.empty());
  CHECK(version.out.find('.') != std::string::npos);
  CHECK(version.out.back() == '\n');
}

// ---------------------------------------------------------------------------
// groups
// ---------------------------------------------------------------------------

TEST_CASE("groups --json lists the assignment and the groups") {
  struct Case {
    std::vector<std::string> args;
    json expected;
  };
  const std::vector<Case> cases = {
      {{"--replicas", "8", "--stride", "4", "--group-size", "2"},
       {{"numReplicas", 8},
        {"stride", 4},
        {"groupSize", 2},
        {"numGroups", 4},
        {"assignment", {0, 1, 2, 3, 0, 1, 2, 3}},
        {"groups", {{0, 4}, {1, 5}, {2, 6}, {3, 7}}}}},
      {{"--replicas", "16", "--stride", "4", "--group-size", "4"},
       {{"numReplicas", 16},
        {"stride", 4},
        {"groupSize", 4},
        {"numGroups", 4},
        {"assignment", {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}},
        {"groups", {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}}}},
      // Without --group-size the groups tile the replicas: 8 / 2 = 4.
      {{"--replicas", "8", "--stride", "2"},
       {{"numReplicas", 8},
        {"stride", 2},
        {"groupSize", 4},
        {"numGroups", 2},
        {"assignment", {0, 1, 0, 1, 0, 1, 0, 1}},
        {"groups", {{0, 2, 4, 6}, {1, 3, 5, 7}}}}},
      // Defaults: one group of every replica.
      {{"--replicas", "4"},
       {{"numReplicas", 4},
        {"stride", 1},
        {"groupSize", 4},
        {"numGroups", 1},
        {"assignment", {0, 0, 0, 0}},
        {"groups", {{0, 1, 2, 3}}}}},
  };
  for (const Case& c : cases) {
    const std::string command = commandLine(c.args);
    CAPTURE(command);
    std::vector<std::string> args{"groups", "--json"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    CHECK(parseJson(runCli(args)) == c.expected);
  }
}

TEST_CASE("groups prints group and replica tables") {
  const CliResult result = runCli({"groups", "--replicas", "8", "--stride", "4", "--group-size", "2"});
  INFO("stdout: ", result.out);
  REQUIRE(result.exitCode == 0);
  CHECK(startsWith(result.out, "ReplicaGrouping(numReplicas=8, stride=4, groupSize=2): 4 groups of 2\n"));
  CHECK(result.out.find("group  replicas\n0      0 4\n1      1 5\n2      2 6\n3      3 7\n") !=
        std::string::npos);
  CHECK(result.out.find("replica  group  index\n0        0      0\n1        1      0\n2        2      0\n") !=
        std::string::npos);
}

TEST_CASE("groups rejects an invalid grouping with the library's error id") {
  struct Case {
    std::vector<std::string> args;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {{"--replicas", "12", "--stride", "4", "--group-size", "2"},
       "error: [tessera.config.141] ReplicaGrouping(numReplicas=12, stride=4, groupSize=2): "},
      {{"--replicas", "0"}, "error: [tessera.config.140] ReplicaGrouping(numReplicas=0, "},
      {{"--replicas", "4", "--stride", "0"},
       "error: [tessera.config.140] ReplicaGrouping(numReplicas=4, stride=0, "},
      {{"--replicas", "8", "--stride", "3"}, "error: [tessera.config.141] --stride: "},
      // PopXL's rule: stride * groupSize = numReplicas when the stride is not 1.
      {{"--replicas", "8", "--stride", "2", "--group-size", "2"},
       "error: [tessera.config.149] ReplicaGrouping(numReplicas=8, stride=2, groupSize=2): with stride 2 != "
       "1"},
  };
  for (const Case& c : cases) {
    const std::string command = commandLine(c.args);
    CAPTURE(command);
    std::vector<std::string> args{"groups"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliResult result = runCli(args);
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 1);
    CHECK(startsWith(result.err, c.expected));
  }
}

// ---------------------------------------------------------------------------
// cbr
// ---------------------------------------------------------------------------

TEST_CASE("cbr shows the balanced shard layout") {
  struct Case {
    int elements;
    int replicas;
    int shardElements;
    int padding;
    std::vector<int> realElements;
    const char* layout;
  };
  const std::vector<Case> cases = {
      {30, 4, 8, 2, {7, 8, 7, 8}, "[0..6,p] [7..14] [15..21,p] [22..29]"},
      {5, 4, 2, 3, {1, 2, 2, 0}, "[0,p] [1,2] [3,4] [p,p]"},
      {10, 4, 3, 2, {2, 3, 2, 3}, "[0,1,p] [2,3,4] [5,6,p] [7,8,9]"},
      {16, 4, 4, 0, {4, 4, 4, 4}, "[0..3] [4..7] [8..11] [12..15]"},
      {0, 4, 0, 0, {0, 0, 0, 0}, "[] [] [] []"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.elements);
    CAPTURE(c.replicas);
    const std::vector<std::string> args{"cbr", "--elements", std::to_string(c.elements), "--replicas",
                                        std::to_string(c.replicas)};
    std::vector<std::string> jsonArgs = args;
    jsonArgs.emplace_back("--json");
    const json expected = {{"elements", c.elements},
                           {"replicas", c.replicas},
                           {"shardElements", c.shardElements},
                           {"padding", c.padding},
                           {"realElements", c.realElements}};
    CHECK(parseJson(runCli(jsonArgs)) == expected);

    const CliResult text = runCli(args);
    INFO("stdout: ", text.out);
    CHECK(text.exitCode == 0);
    CHECK(text.out.find("shard length   " + std::to_string(c.shardElements) + "\n") != std::string::npos);
    CHECK(text.out.find("padding        " + std::to_string(c.padding) + "\n") != std::string::npos);
    CHECK(text.out.find(std::string("layout         ") + c.layout + "\n") != std::string::npos);
  }
}

TEST_CASE("cbr rejects an invalid layout with the library's error id") {
  for (const auto& args : {std::vector<std::string>{"cbr", "--elements", "-1", "--replicas", "4"},
                           std::vector<std::string>{"cbr", "--elements", "30", "--replicas", "0"}}) {
    const std::string command = commandLine(args);
    CAPTURE(command);
    const CliResult result = runCli(args);
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 1);
    CHECK(startsWith(result.err, "error: [tessera.config.147] "));
    CHECK(result.err.find("ShardLayout(") != std::string::npos);
  }
}

// ---------------------------------------------------------------------------
// ---------------------------------------------------------------------------
// schema
// ---------------------------------------------------------------------------

TEST_CASE("schema prints the JSON Schema of run configs") {
  const CliResult result = runCli({"schema"});
  const json schema = parseJson(result);
  CHECK(schema.contains("$schema"));
  CHECK(schema["properties"].contains("sessionOptions"));
  // Pretty-printed with a 2-space indent.
  CHECK(result.out.find("\n  \"") != std::string::npos);
}

TEST_CASE("train redraws its progress bar on a terminal at most every 100 ms") {
  // stderr on a pseudo-terminal: the bar is redrawn in place ("\r") when
  // 100 ms have passed, on an epoch's first step and at its end, not on
  // every one of the 2 x 10 steps (the synthetic set keeps it short under
  // valgrind, where a step takes most of a second).
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(master >= 0);
  REQUIRE(grantpt(master) == 0);
  REQUIRE(unlockpt(master) == 0);
  const std::string terminal = ptsname(master);
  const std::vector<std::string> args = {"train", tessera::test::sourcePath("samples/configs/mnist_rts.json"),
                                         "--set", "/data/dataset=Synthetic",
                                         "--set", "/data/limitTrainSamples=640",
                                         "--set", "/data/limitTestSamples=200",
                                         "--set", "/data/epochs=2",
                                         "--set", "/data/batchSize=32"};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, terminal.c_str(), O_RDWR | O_NOCTTY, 0);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = tessera::test::spawnProgram(tessera::test::cliProgram(), args, actions);
  // Read until the program closes the terminal (EIO once no one holds it).
  std::string shown;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(master, buffer, sizeof buffer);
    if (n > 0) {
      shown.append(buffer, static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  ::close(master);
  const int status = tessera::test::waitStatus(pid);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("terminal output: ", shown);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::size_t draws = 0;
  for (std::size_t at = shown.find("epoch "); at != std::string::npos; at = shown.find("epoch ", at + 1))
    ++draws;
  // Both epochs end on a full bar.
  CHECK(shown.find("epoch 1/2 [==============================] 10/10") != std::string::npos);
  CHECK(shown.find("epoch 2/2 [==============================] 10/10") != std::string::npos);
  // Two draws an epoch besides one per 100 ms of the whole run (setup and
  // the test passes included): without the limit a fast build draws all 20.
  CAPTURE(seconds);
  CHECK(draws <= 4 + static_cast<std::size_t>(seconds / 0.1) + 1);
  CHECK(draws >= 4);
}

TEST_CASE("evaluate reports the test accuracy of the initial weights or a checkpoint, without training") {
  const tessera::test::TempDir folder;
  const std::string checkpoint = (folder.path() / "small.safetensors").string();
  const std::string config = tessera::test::sourcePath("samples/configs/mnist.json");
  const std::vector<std::string> small = {"--set", "/data/dataset=Synthetic", "--set", "/data/limitTrainSamples=128",
                                          "--set", "/data/limitTestSamples=50", "--set", "/data/epochs=1",
                                          "--set", "/model/layers=[784, 8, 10]"};
  std::vector<std::string> initial = {"evaluate", config};
  initial.insert(initial.end(), small.begin(), small.end());
  const CliResult fresh = runCli(initial);
  INFO(fresh.err);
  CHECK(fresh.exitCode == 0);
  CHECK(fresh.out.find("weights: initial (no checkpoint given)") != std::string::npos);
  CHECK(fresh.out.find("test accuracy: ") != std::string::npos);
  CHECK(fresh.out.find("(50 samples)") != std::string::npos);

  std::vector<std::string> training = {"train", config, "--quiet", "--set", "/output/checkpoint=\"" + checkpoint + "\""};
  training.insert(training.end(), small.begin(), small.end());
  const CliResult trained = runCli(training);
  REQUIRE(trained.exitCode == 0);
  const std::size_t at = trained.out.find("test accuracy: ");
  REQUIRE(at != std::string::npos);
  const std::string accuracyLine = trained.out.substr(at, trained.out.find('\n', at) - at);

  std::vector<std::string> evaluated = initial;
  evaluated.insert(evaluated.end(), {"--checkpoint", checkpoint});
  const CliResult again = runCli(evaluated);
  INFO(again.err);
  CHECK(again.exitCode == 0);
  CHECK(again.out.find(accuracyLine) != std::string::npos);
  CHECK(again.out.find("(step 2)") != std::string::npos);

  std::vector<std::string> device = initial;
  device.insert(device.end(), {"--checkpoint", "/dev/zero"});
  const CliResult refused = runCli(device);
  CHECK(refused.exitCode == 2);
  CHECK(refused.err.find("tessera.io.601") != std::string::npos);
}

}  // namespace
