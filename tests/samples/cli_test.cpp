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

#include "support/process.hpp"
#include "tessera/onnx.hpp"
#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tessera::test::readFile;
using tessera::test::TempDir;
using CliResult = tessera::test::ProcessResult;

using tessera::test::runCli;

json parseJson(const CliResult& result) {
  INFO("stdout: ", result.out);
  INFO("stderr: ", result.err);
  REQUIRE(result.exitCode == 0);
  return json::parse(result.out);
}

// "tessera ARG..." for failure messages.
std::string commandLine(const std::vector<std::string>& args) {
  std::string line = "tessera";
  for (const std::string& arg : args) line += " " + arg;
  return line;
}

bool startsWith(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

// ---------------------------------------------------------------------------
// validate
// ---------------------------------------------------------------------------

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

TEST_CASE("explain on an ONNX config lists every initializer with its category, location and shards") {
  const std::string path = tessera::test::sourcePath("samples/configs/mlp_onnx.json");
  // validate plans the program too, so it needs the importer as explain does.
  const CliResult valid = runCli({"validate", path});
  CHECK(valid.exitCode == (tessera::onnxSupported() ? 0 : 1));
  const CliResult explained = runCli({"explain", path, "--json"});
  INFO("explain stderr: ", explained.err);
  if (!tessera::onnxSupported()) {
    CHECK(explained.err.find("tessera.onnx.701") != std::string::npos);
    return;
  }
  const json report = parseJson(explained);
  std::map<std::string, json> tensors;
  for (const json& tensor : report.at("tensors")) tensors[tensor.at("name").get<std::string>()] = tensor;
  for (const char* name : {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}) {
    CAPTURE(name);
    REQUIRE(tensors.contains(name));
    const json& weight = tensors[name];
    CHECK(weight["category"] == "Weight");
    CHECK(weight["storage"] == "OnChip");
    CHECK(weight["replicatedTensorSharding"] == "On");
    CHECK(weight["shardElements"].get<int64_t>() * 2 >= weight["elements"].get<int64_t>());
    CHECK(weight["reason"].get<std::string>().starts_with("/sessionOptions/weightTensorLocationSettings"));
    REQUIRE(tensors.contains(std::string(name) + ".momentum"));
    CHECK(tensors[std::string(name) + ".momentum"]["category"] == "OptimizerState");
  }
  CHECK(tensors["fc1.weight"]["elements"] == 48);
  CHECK(tensors["fc1.weight"]["shardElements"] == 24);
  // The text form names them too.
  const CliResult text = runCli({"explain", path});
  CHECK(text.exitCode == 0);
  CHECK(text.out.find("fc2.weight") != std::string::npos);
}

TEST_CASE("explain over 2 IPUs per replica: a row per IPU, the copies between them as traffic") {
  if (!tessera::onnxSupported()) return;
  const std::string path = tessera::test::sourcePath("samples/configs/mlp_onnx.json");
  const std::vector<std::string> ipus = {"--set", "/sessionOptions/virtualGraphMode=Auto", "--set",
                                         "/device/ipusPerReplica=2"};
  std::vector<std::string> args = {"explain", path, "--json"};
  args.insert(args.end(), ipus.begin(), ipus.end());
  const CliResult explained = runCli(args);
  INFO("explain stderr: ", explained.err);
  REQUIRE(explained.exitCode == 0);
  const json report = parseJson(explained);
  const json& memory = report.at("memory");
  CHECK(memory.at("ipusPerReplica") == 2);
  CHECK(memory.at("fits") == true);
  std::set<int64_t> seen;
  for (const json& c : memory.at("replicaClasses")) seen.insert(c.at("ipu").get<int64_t>());
  CHECK(seen == std::set<int64_t>{0, 1});
  CHECK(report.at("ipuCopies").at("count").get<int64_t>() > 0);
  CHECK(report.at("traffic").at("IpuLink").at("bytes") == report.at("ipuCopies").at("bytes"));
  args.erase(args.begin() + 2);
  const CliResult text = runCli(args);
  CHECK(text.exitCode == 0);
  CHECK(text.out.find("fits: every IPU's peaks are within the capacities") != std::string::npos);
  CHECK(text.out.find("Peak per IPU:") != std::string::npos);
  CHECK(text.out.find("IpuLink") != std::string::npos);
  CHECK(text.out.find("copies between IPUs") != std::string::npos);
  // Off with 2 IPUs names the rule.
  const CliResult off = runCli({"validate", path, "--set", "/device/ipusPerReplica=2"});
  CHECK(off.exitCode == 1);
  CHECK(off.err.find("tessera.config.174") != std::string::npos);
}

TEST_CASE("the LeNet and tiny GPT sample configs validate, and explain lists their initializers") {
  const std::vector<std::pair<std::string, std::vector<std::string>>> samples = {
      {"lenet.json", {"conv1.weight", "conv2.bias", "fc3.weight"}},
      {"gpt_tiny.json", {"tokens.weight", "qkv.weight", "head.bias"}}};
  for (const auto& sample : samples) {
    const std::string path = tessera::test::sourcePath("samples/configs/" + sample.first);
    CAPTURE(path);
    const CliResult valid = runCli({"validate", path});
    INFO("validate stderr: ", valid.err);
    CHECK(valid.exitCode == (tessera::onnxSupported() ? 0 : 1));
    const CliResult explained = runCli({"explain", path, "--json"});
    INFO("explain stderr: ", explained.err);
    if (!tessera::onnxSupported()) {
      CHECK(explained.err.find("tessera.onnx.701") != std::string::npos);
      continue;
    }
    const json report = parseJson(explained);
    std::map<std::string, std::string> categories;
    for (const json& tensor : report.at("tensors"))
      categories[tensor.at("name").get<std::string>()] = tensor.at("category").get<std::string>();
    for (const std::string& name : sample.second) {
      CAPTURE(name);
      CHECK(categories[name] == "Weight");
      CHECK(categories[name + ".adamM"] == "OptimizerState");
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
// explain
// ---------------------------------------------------------------------------

// Four replicas with weights sharded over Consecutive(2) domains.
constexpr const char* kShardedConfig = R"({
  "sessionOptions": {
    "enableReplicatedGraphs": true,
    "replicatedGraphCount": 4,
    "weightTensorLocationSettings": {
      "location": {
        "replicatedTensorSharding": "On",
        "shardingDomain": {"type": "Consecutive", "replicaGroupSize": 2}
      }
    }
  }
})";

TEST_CASE("explain --json gives the provenance of values and the sharding domain table") {
  const TempDir dir;
  const std::string path = dir.write("sharded.json", kShardedConfig);
  // --per-replica: the groups of each domain one by one.
  const json report =
      parseJson(runCli({"explain", path, "--set", "/data/epochs=3", "--json", "--per-replica"}));

  CHECK(report["config"]["sessionOptions"]["replicatedGraphCount"] == 4);
  CHECK(report["config"]["data"]["epochs"] == 3);
  CHECK(report["config"]["data"]["batchSize"] == 64);

  const json& provenance = report["provenance"];
  CHECK(provenance["/sessionOptions/replicatedGraphCount"] == "file");
  CHECK(provenance["/sessionOptions/weightTensorLocationSettings/location/replicatedTensorSharding"] ==
        "file");
  CHECK(provenance["/data/epochs"] == "--set");
  CHECK(provenance["/data/batchSize"] == "default");
  CHECK(provenance["/sessionOptions/numIOTiles"] == "default");

  const json expectedDomains = json::array({{
      {"setting", "/sessionOptions/weightTensorLocationSettings/location/shardingDomain"},
      {"commGroup", {{"type", "Consecutive"}, {"replicaGroupSize", 2}}},
      {"numReplicas", 4},
      {"stride", 1},
      {"groupSize", 2},
      {"numGroups", 2},
      {"assignment", {0, 0, 1, 1}},
      {"groups", {{0, 1}, {2, 3}}},
  }});
  CHECK(report["shardingDomains"] == expectedDomains);
  CHECK(report["replication"] == json{{"local", 4}, {"global", 4}, {"offset", 0}, {"accumulationFactor", 1}});
}

TEST_CASE("explain --json places every tensor, and --what-if shows the change beside it") {
  const std::string path = tessera::test::sourcePath("samples/configs/mnist_rts.json");
  const json report =
      parseJson(runCli({"explain", path, "--json", "--per-replica", "--what-if",
                        "/sessionOptions/optimizerStateTensorLocationSettings/location/storage=OffChip"}));
  const auto find = [](const json& tensors, const std::string& name) {
    for (const json& t : tensors)
      if (t["name"] == name) return t;
    return json();
  };
  // Two replicas: every sharded tensor holds ceil(n/2) elements, 4 bytes each.
  const json w0 = find(report["tensors"], "W0");
  CHECK(w0["category"] == "Weight");
  CHECK(w0["replicatedTensorSharding"] == "On");
  CHECK(w0["elements"] == 784 * 256);
  CHECK(w0["shardElements"] == 784 * 256 / 2);
  CHECK(w0["bytesPerReplica"] == 784 * 256 / 2 * 4);
  CHECK(w0["dtype"] == "float32");
  CHECK(w0["storage"] == "OnChip");
  const json b2 = find(report["tensors"], "b2");
  CHECK(b2["shardElements"] == 5);
  CHECK(find(report["tensors"], "W0.momentum")["shardElements"] == 784 * 256 / 2);
  CHECK(report["memory"]["perReplica"].size() == 2);
  CHECK(report["memory"]["perReplica"][0]["streamingBytes"] == 0);
  CHECK(report["modelledStepTime"]["seconds"].get<double>() > 0);
  CHECK(report["notApplied"].size() >= 1);  // the one-element hyper-parameters stay whole

  // The momentum moves to streaming memory: its shards' bytes leave the compute tiles.
  const json& after = report["whatIf"];
  CHECK(find(after["tensors"], "W0.momentum")["storage"] == "OffChip");
  int64_t momentumBytes = 0;
  for (const json& t : after["tensors"]) {
    if (t["name"].get<std::string>().ends_with(".momentum"))
      momentumBytes += t["bytesPerReplica"].get<int64_t>();
  }
  CHECK(after["memory"]["perReplica"][0]["streamingBytes"] == momentumBytes);
  CHECK(after["memory"]["perReplica"][0]["computeTilesBytes"].get<int64_t>() <
        report["memory"]["perReplica"][0]["computeTilesBytes"].get<int64_t>());
  CHECK(after["settings"] ==
        json::array({"/sessionOptions/optimizerStateTensorLocationSettings/location/storage=OffChip"}));
}

TEST_CASE("explain --json lists overrides and non-default domains, and nothing else") {
  const TempDir dir;
  SUBCASE("defaults: no domain in use") {
    const json report = parseJson(runCli({"explain", dir.write("empty.json", "{}"), "--json"}));
    CHECK(report["shardingDomains"] == json::array());
    CHECK(report["replication"] ==
          json{{"local", 1}, {"global", 1}, {"offset", 0}, {"accumulationFactor", 1}});
  }
  SUBCASE("an override with RTS On and a non-default domain with RTS Off") {
    const std::string path = dir.write("override.json", R"({
      "sessionOptions": {
        "enableReplicatedGraphs": true,
        "replicatedGraphCount": 4,
        "optimizerStateTensorLocationSettings": {
          "location": {"shardingDomain": {"type": "Orthogonal", "replicaGroupSize": 2}}
        },
        "tensorLocationSettingsOverride": {
          "W1": {"storage": "OffChip", "replicatedTensorSharding": "On"}
        }
      }
    })");
    const json report = parseJson(runCli({"explain", path, "--json", "--per-replica"}));
    const json& domains = report["shardingDomains"];
    REQUIRE(domains.size() == 2);
    CHECK(domains[0]["setting"] ==
          "/sessionOptions/optimizerStateTensorLocationSettings/location/shardingDomain");
    CHECK(domains[0]["groups"] == json{{0, 2}, {1, 3}});
    CHECK(domains[1]["setting"] == "/sessionOptions/tensorLocationSettingsOverride/W1/shardingDomain");
    CHECK(domains[1]["commGroup"]["type"] == "All");
    CHECK(domains[1]["groups"] == json{{0, 1, 2, 3}});
  }
}

TEST_CASE("explain --values prints aligned values with their provenance, --per-replica the domain tables") {
  const TempDir dir;
  const std::string path = dir.write("sharded.json", kShardedConfig);
  const CliResult result = runCli({"explain", path, "--set", "/data/epochs=3", "--values", "--per-replica"});
  INFO("stdout: ", result.out);
  INFO("stderr: ", result.err);
  REQUIRE(result.exitCode == 0);
  CHECK(startsWith(result.out, path + ": valid; fits: "));

  // Every value line has the form "PATH<pad> = VALUE<pad>   (PROVENANCE)".
  const auto valueLine = [&](const std::string& pointer) -> std::string {
    const std::size_t at = result.out.find("\n" + pointer + " ");
    if (at == std::string::npos) return {};
    return result.out.substr(at + 1, result.out.find('\n', at + 1) - at - 1);
  };
  const auto checkLine = [&](const std::string& pointer, const std::string& value,
                             const std::string& source) {
    CAPTURE(pointer);
    const std::string line = valueLine(pointer);
    REQUIRE(!line.empty());
    CHECK(line.find(" = " + value + " ") != std::string::npos);
    CHECK(line.ends_with("   (" + source + ")"));
  };
  checkLine("/sessionOptions/replicatedGraphCount", "4", "file");
  checkLine("/data/epochs", "3", "--set");
  checkLine("/data/batchSize", "64", "default");
  checkLine("/sessionOptions/weightTensorLocationSettings/location/replicatedTensorSharding", "\"On\"",
            "file");
  // Aligned: the " = " of every value line is in the same column.
  CHECK(valueLine("/data/epochs").find(" = ") ==
        valueLine("/sessionOptions/replicatedGraphCount").find(" = "));

  CHECK(result.out.find("/sessionOptions/weightTensorLocationSettings/location/shardingDomain\n"
                        "  CommGroup(type=Consecutive, replicaGroupSize=2) -> "
                        "ReplicaGrouping(numReplicas=4, stride=1, groupSize=2)") != std::string::npos);
  CHECK(result.out.find("  group  replicas\n  0      0 1\n  1      2 3\n") != std::string::npos);
  CHECK(result.out.find("  replica  group  shard\n  0        0      0\n  1        0      1\n") !=
        std::string::npos);
}

TEST_CASE(
    "a model far too large for the device is planned, not made: explained, and refused before any data") {
  // 785 million weights (3.1 GB of float32, with momentum 6.3 GB): planning
  // makes none of them, so explain answers and train refuses at once, before
  // it reads the dataset (which is not there).
  const std::string path = tessera::test::sourcePath("samples/configs/mnist_rts.json");
  const tessera::test::TempDir dir;
  const std::string huge = "/model/layers=[784,1000000,10]";
  const auto explained = runCli({"explain", path, "--set", huge, "--json"});
  CHECK(explained.exitCode == 4);  // it does not fit the device
  const json plan = json::parse(explained.out);
  CHECK(plan.at("memory").at("replicaClasses").at(0).at("computeTilesBytes").get<int64_t>() > 3'000'000'000);
  const auto trained = runCli(
      {"train", path, "--set", huge, "--set", "/data/path=\"" + (dir.path() / "absent").string() + "\""});
  CHECK(trained.exitCode == 1);
  CHECK(trained.err.find("[tessera.device.401]") != std::string::npos);
  CHECK(trained.err.find("absent") == std::string::npos);
}

// The report of kShardedConfig's program at `replicas` replicas.
CliResult explainAt(const std::string& path, int64_t replicas, std::vector<std::string> extra) {
  std::vector<std::string> args = {"explain", path, "--set",
                                   "/sessionOptions/replicatedGraphCount=" + std::to_string(replicas)};
  args.insert(args.end(), extra.begin(), extra.end());
  return runCli(args);
}

std::size_t lineCount(const std::string& text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

TEST_CASE("explain reports replicas alike once: its size does not grow with the replica count") {
  const TempDir dir;
  const std::string path = dir.write("sharded.json", kShardedConfig);
  const CliResult text64 = explainAt(path, 64, {});
  const CliResult text1024 = explainAt(path, 1024, {});
  INFO("stderr: ", text1024.err);
  REQUIRE(text64.exitCode == 0);
  REQUIRE(text1024.exitCode == 0);
  // The same rows at 16 times the replicas: only numbers widen.
  CHECK(lineCount(text1024.out) == lineCount(text64.out));
  CHECK(text1024.out.find("0-1023    1024") != std::string::npos);
  CHECK(text1024.out.find("512 groups of 2: group 0: 0-1; group 1: 2-3; ...; group 511: 1022-1023\n") !=
        std::string::npos);

  const CliResult json64 = explainAt(path, 64, {"--json"});
  const CliResult json1024 = explainAt(path, 1024, {"--json"});
  REQUIRE(json1024.exitCode == 0);
  CHECK(json1024.out.size() < json64.out.size() * 11 / 10);
  const json report = parseJson(json1024);
  const json& classes = report.at("memory").at("replicaClasses");
  REQUIRE(classes.size() == 1);
  CHECK(classes[0].at("count") == 1024);
  CHECK(classes[0].at("replicas") == json::array({json::array({0, 1023})}));
  CHECK(!report.at("memory").contains("perReplica"));
  CHECK(!report.at("shardingDomains").at(0).contains("assignment"));
  CHECK(report.at("shardingDomains").at(0).at("numGroups") == 512);

  // --per-replica is the expansion: one entry per replica and group.
  const json expanded = parseJson(explainAt(path, 1024, {"--json", "--per-replica"}));
  CHECK(expanded.at("memory").at("perReplica").size() == 1024);
  CHECK(expanded.at("shardingDomains").at(0).at("assignment").size() == 1024);
  CHECK(expanded.at("shardingDomains").at(0).at("groups").size() == 512);
  const CliResult perReplica = explainAt(path, 1024, {"--per-replica"});
  CHECK(lineCount(perReplica.out) > lineCount(text1024.out) + 1024 * 2);
}

TEST_CASE("explain answers first: fits or not, the peak per replica, the largest categories, the levers") {
  const std::string path = tessera::test::sourcePath("samples/configs/mnist_rts.json");
  const CliResult fits = runCli({"explain", path});
  INFO("stderr: ", fits.err);
  CHECK(fits.exitCode == 0);
  CHECK(startsWith(fits.out, path + ": valid; fits: every replica's peaks are within the capacities (all 2 "
                                    "replicas alike)\nPeak per replica:\n  replicas  count  compute tiles"));
  CHECK(fits.out.find("\n  0-1       2      ") != std::string::npos);
  CHECK(fits.out.find("\nLargest at the compute tiles peak of replica 0") != std::string::npos);
  // No value table unless asked for.
  CHECK(fits.out.find("Values (default") == std::string::npos);
  CHECK(
      runCli({"explain", path, "--values"}).out.find("\nValues (default, from the file, or from --set):\n") !=
      std::string::npos);

  // 785 million weights: far more than the compute tiles hold.
  const std::vector<std::string> wide = {"--set", "/model/layers=[784,1000000,10]"};
  std::vector<std::string> args = {"explain", path};
  args.insert(args.end(), wide.begin(), wide.end());
  const CliResult tooLarge = runCli(args);
  INFO("stdout: ", tooLarge.out);
  CHECK(tooLarge.exitCode == 4);
  CHECK(startsWith(tooLarge.out, path + ": valid; does not fit: compute tiles need "));
  CHECK(tooLarge.out.find("Levers (each planned alone):\n  set /sessionOptions/") != std::string::npos);
  CHECK(startsWith(tooLarge.err, "error: [tessera.device.401] replica 0, compute tiles: needs "));
  CHECK(tooLarge.err.find("(2 of 2 replicas short)") != std::string::npos);

  // validate plans the same and exits the same way; --json keeps the levers.
  args[0] = "validate";
  const CliResult validated = runCli(args);
  CHECK(validated.exitCode == 4);
  CHECK(startsWith(validated.out, path + ": valid\n"));
  CHECK(validated.err == tooLarge.err);
  args[0] = "explain";
  args.emplace_back("--json");
  const CliResult asJson = runCli(args);
  CHECK(asJson.exitCode == 4);
  const json report = json::parse(asJson.out);
  CHECK(report.at("memory").at("fits") == false);
  REQUIRE(!report.at("levers").empty());
  CHECK(report.at("levers").at(0).at("setting").get<std::string>().starts_with("/sessionOptions/"));
}

TEST_CASE("explain plans recomputation as a lever: a lower peak for more modelled step time") {
  // GPT-2 XL's shape, two of its blocks (cheap enough under valgrind): the
  // activations of a 1,024-token sequence do not fit.
  const std::string path = tessera::test::sourcePath("samples/configs/gpt2_xl_pod64.json");
  const CliResult asJson = runCli({"explain", path, "--json", "--set", "/model/layers=2"});
  CHECK(asJson.exitCode == 4);
  const json report = json::parse(asJson.out);
  const double step = report.at("modelledStepTime").at("seconds").get<double>();
  std::optional<json> recompute;
  for (const json& lever : report.at("levers")) {
    CHECK(lever.at("stepSeconds").get<double>() > 0.0);
    if (lever.at("setting") == "/sessionOptions/autoRecomputation") recompute = lever;
  }
  REQUIRE(recompute.has_value());
  INFO("lever: ", recompute->dump());
  CHECK(recompute->at("value") == "Standard");
  CHECK(recompute->at("savingBytes").get<int64_t>() > 0);
  // The clones are charged like any op: the step takes longer.
  CHECK(recompute->at("stepSeconds").get<double>() > step);
  // With recomputation set, it is no lever: the plan is the lever's.
  const CliResult standard =
      runCli({"explain", path, "--json", "--set", "/model/layers=2", "--set",
              "/sessionOptions/autoRecomputation=Standard"});
  const json planned = json::parse(standard.out);
  CHECK(planned.at("modelledStepTime").at("seconds").get<double>() == recompute->at("stepSeconds").get<double>());
  for (const json& lever : planned.at("levers")) CHECK(lever.at("setting") != "/sessionOptions/autoRecomputation");
}

TEST_CASE(
    "validate and explain plan past the host limits; train refuses before allocating, naming the limit") {
  // 40 M weights (160 MB) against a limit of 1 MB: planning makes none of
  // them, training would.
  const std::string path = tessera::test::sourcePath("samples/configs/mnist_rts.json");
  const std::vector<std::string> set = {"--set", "/model/layers=[784,51200,10]", "--set",
                                        "/limits/maxTensorBytes=1048576"};
  for (const char* command : {"validate", "explain"}) {
    CAPTURE(command);
    std::vector<std::string> args = {command, path};
    args.insert(args.end(), set.begin(), set.end());
    const CliResult result = runCli(args);
    INFO("stderr: ", result.err);
    CHECK(result.err.find("tessera.config.154") == std::string::npos);
    CHECK(startsWith(result.out, path + ": valid"));
  }
  const TempDir dir;
  std::vector<std::string> args = {"train", path, "--set",
                                   "/data/path=\"" + (dir.path() / "absent").string() + "\""};
  args.insert(args.end(), set.begin(), set.end());
  const CliResult trained = runCli(args);
  CHECK(trained.exitCode == 1);
  CHECK(startsWith(trained.err, "error: [tessera.config.154] /model/layers"));
  CHECK(trained.err.find("/limits/maxTensorBytes (1048576 bytes)") != std::string::npos);
  CHECK(trained.err.find("absent") == std::string::npos);
}

TEST_CASE("explain validates first") {
  const TempDir dir;
  const std::string path = dir.write("invalid.json", R"({"sessionOptions": {"replicatedGraphCount": 4}})");
  for (const bool asJson : {false, true}) {
    CAPTURE(asJson);
    std::vector<std::string> args{"explain", path};
    if (asJson) args.emplace_back("--json");
    const CliResult result = runCli(args);
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 1);
    CHECK(startsWith(result.err, "error: [tessera.config.110] /sessionOptions/replicatedGraphCount: "));
    CHECK(result.out.empty());
  }
}

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

}  // namespace

TEST_CASE("explain shows a float16 MLP's weights at 2 bytes an element") {
  const std::string path = tessera::test::sourcePath("samples/configs/mlp_float16.json");
  const CliResult result = runCli({"explain", path, "--json"});
  INFO("stderr: ", result.err);
  REQUIRE(result.exitCode == 0);
  const json report = parseJson(result);
  int weights = 0;
  for (const json& t : report["tensors"]) {
    if (t["category"] != "Weight") continue;
    ++weights;
    CAPTURE(t.dump());
    CHECK(t["dtype"] == "float16");
    CHECK(t["bytesPerReplica"] == t["shardElements"].get<int64_t>() * 2);
  }
  CHECK(weights == 6);
  CHECK(report["provenance"]["/model/dtype"] == "file");
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
                                         "--set", "/data/dataset=synthetic",
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
  const std::vector<std::string> small = {"--set", "/data/dataset=synthetic", "--set", "/data/limitTrainSamples=128",
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
