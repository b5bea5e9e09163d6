// Runs the built `tessera` program (path in TESSERA_CLI): explain and the
// plan-only answers of validate. The other commands are in cli_test.cpp.
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

TEST_CASE("explain's phase table counts an activation stored after its phase and loaded by a later forward one") {
  // The MLP in 4 forward phases with only the activations OffChip: phase 2
  // is forward only, so what it loads is the 64 x 256 activation that the
  // layer of phase 1 makes and the layer of phase 2 reads.
  const std::vector<std::string> args = {
      "explain", tessera::test::sourcePath("samples/configs/mnist.json"), "--json",
      "--set", "/sessionOptions/virtualGraphMode=ExecutionPhases",
      "--set", "/sessionOptions/executionPhaseSettings/phases=4",
      "--set", "/sessionOptions/executionPhaseSettings/stages=1",
      "--set", "/sessionOptions/activationTensorLocationSettings/location/storage=OffChip"};
  const CliResult explained = runCli(args);
  INFO("explain stderr: ", explained.err);
  REQUIRE(explained.exitCode == 0);
  const json phases = parseJson(explained).at("phases");
  REQUIRE(phases.size() > 2);
  constexpr double kActivation = 64.0 * 256.0 * 4.0;
  CHECK(phases[1].at("storeBytes").get<double>() == kActivation);
  CHECK(phases[2].at("loadBytes").get<double>() == kActivation);
  std::vector<std::string> textArgs = args;
  textArgs.erase(textArgs.begin() + 2);
  const CliResult text = runCli(textArgs);
  CHECK(text.exitCode == 0);
  CHECK(text.out.find("    2  IPU 0    0.000 ms    64.0 KiB") != std::string::npos);
}

TEST_CASE("a pipelined config: explain shows the stages, cycles and stashes, the trace a thread per stage") {
  if (!tessera::onnxSupported()) return;
  const std::string path = tessera::test::sourcePath("samples/configs/mlp_onnx.json");
  // 2 replicas x 3 micro-batches of 4: one step.
  const std::vector<std::string> pipelined = {
      "--set", "/sessionOptions/virtualGraphMode=Auto",           "--set", "/device/ipusPerReplica=2",
      "--set", "/sessionOptions/enablePipelining=true",           "--set", "/sessionOptions/enableGradientAccumulation=true",
      "--set", "/sessionOptions/accumulationFactor=3",            "--set", "/data/limitTrainSamples=24",
      "--set", "/data/limitTestSamples=8",                        "--set", "/data/epochs=1"};
  std::vector<std::string> args = {"explain", path, "--json"};
  args.insert(args.end(), pipelined.begin(), pipelined.end());
  const CliResult explained = runCli(args);
  INFO("explain stderr: ", explained.err);
  REQUIRE(explained.exitCode == 0);
  const json report = parseJson(explained);
  const json& pipeline = report.at("pipeline");
  CHECK(pipeline.at("enabled") == true);
  CHECK(pipeline.at("forwardStages") == 2);
  CHECK(pipeline.at("stages") == 3);
  CHECK(pipeline.at("microBatches") == 3);
  CHECK(pipeline.at("cycles") == 5);  // N + 2 S - 2
  int64_t stashed = 0;
  for (const json& s : pipeline.at("stashBytes")) stashed += s.at("bytes").get<int64_t>();
  CHECK(stashed > 0);
  args.erase(args.begin() + 2);
  const CliResult text = runCli(args);
  CHECK(text.exitCode == 0);
  CHECK(text.out.find("Pipelined: 2 forward stages (3 with the backward), 3 micro-batches in 5 cycles") !=
        std::string::npos);
  // The trace of a pipelined step: the phases' thread and each IPU's stages.
  const TempDir dir;
  const std::string trace = (dir.path() / "trace.json").string();
  std::vector<std::string> run = {"train", path, "--set", "/output/trace=" + json(trace).dump()};
  run.insert(run.end(), pipelined.begin(), pipelined.end());
  const CliResult trained = runCli(run);
  INFO("train stderr: ", trained.err);
  REQUIRE(trained.exitCode == 0);
  const json events = json::parse(readFile(trace));
  std::set<std::string> threads;
  for (const json& e : events.at("traceEvents"))
    if (e.value("name", "") == "thread_name") threads.insert(e.at("args").at("name").get<std::string>());
  INFO("threads: ", json(threads).dump());
  CHECK(std::any_of(threads.begin(), threads.end(),
                    [](const std::string& t) { return startsWith(t, "pipeline: 3 micro-batches, 3 stages"); }));
  CHECK(threads.count("IPU 0 compute tiles: stages 0, 2") == 1);
  // The last IPU runs its forward and backward in one stage: every op there, the accumulation and
  // update of its weights too, is in stage 1.
  CHECK(threads.count("IPU 1 compute tiles: stage 1") == 1);
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
  CHECK(tooLarge.out.find("\nEach lever alone:\n  ") != std::string::npos);
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

// GPT-2 XL's sample at a tiny width, one IPU per replica, float32, on a
// device of 900 bytes per tile: two blocks whose activations do not fit 4
// replicas.
const std::vector<std::string> kTinyGpt = {
    "--set", "/model/layers=2",       "--set", "/model/hidden=64",
    "--set", "/model/heads=2",        "--set", "/model/vocab=256",
    "--set", "/model/sequence=64",    "--set", "/sessionOptions/replicatedGraphCount=4",
    "--set", "/device/ipusPerReplica=1",  "--set", "/sessionOptions/virtualGraphMode=Off",
    "--set", "/sessionOptions/autoRecomputation=None", "--set", "/model/dtype=float32",
    "--set", "/device/bytesPerTile=900"};

std::vector<std::string> tinyGptArgs(std::string command, std::vector<std::string> extra) {
  std::vector<std::string> args = {std::move(command),
                                   tessera::test::sourcePath("samples/configs/gpt2_xl_pod64.json")};
  args.insert(args.end(), kTinyGpt.begin(), kTinyGpt.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST_CASE("explain finds levers that make a program fit: each combination planned, its settings pasted back fit") {
  const CliResult asJson = runCli(tinyGptArgs("explain", {"--json", "--lever-plans", "12"}));
  INFO("stderr: ", asJson.err);
  REQUIRE(asJson.exitCode == 4);  // does not fit as given
  const json report = json::parse(asJson.out);
  CHECK(report.at("memory").at("fits") == false);
  const json& search = report.at("leverSearch");
  CHECK(search.at("plans").get<int64_t>() <= 12);
  CHECK(search.at("peakBytes").get<int64_t>() > search.at("availableBytes").get<int64_t>());
  // Each lever alone, with its settings and cost.
  REQUIRE(!report.at("levers").empty());
  for (const json& lever : report.at("levers")) {
    CAPTURE(lever.dump());
    CHECK(!lever.at("changes").empty());
    CHECK(!lever.at("cost").get<std::string>().empty());
    CHECK(lever.at("stepSeconds").get<double>() > 0.0);
  }
  // Phased execution on the one IPU of a replica: a forward phase per block,
  // cut by memory (the model names none), the weights and activations
  // OffChip; it lowers the peak.
  const json& single = report.at("levers");
  const auto phased = std::find_if(single.begin(), single.end(),
                                   [](const json& l) { return l.at("name") == "execution phases 2"; });
  REQUIRE(phased != single.end());
  CHECK(phased->at("setting") == "/sessionOptions/virtualGraphMode");
  CHECK(phased->at("value") == "ExecutionPhases");
  std::set<std::string> phasedPaths;
  for (const json& change : phased->at("changes")) phasedPaths.insert(change.at("path").get<std::string>());
  CHECK(phasedPaths.count("/sessionOptions/executionPhaseSettings/phases") == 1);
  CHECK(phasedPaths.count("/sessionOptions/executionPhaseSettings/stages") == 1);
  CHECK(phasedPaths.count("/sessionOptions/activationTensorLocationSettings/location/storage") == 1);
  CHECK(phased->at("neededBytes").get<int64_t>() < search.at("peakBytes").get<int64_t>());
  // The combinations that fit, the fastest first.
  const json& fitting = report.at("leverCombinations");
  REQUIRE(!fitting.empty());
  for (std::size_t i = 0; i + 1 < fitting.size(); ++i)
    CHECK(fitting[i].at("stepSeconds").get<double>() <= fitting[i + 1].at("stepSeconds").get<double>());
  const json& best = fitting.front();
  CHECK(best.at("fits") == true);
  CHECK(best.at("neededBytes").get<int64_t>() <= search.at("availableBytes").get<int64_t>());
  // Planned again from its settings: it fits, with the modelled step the search gave.
  std::vector<std::string> sets;
  for (const json& change : best.at("changes")) {
    sets.emplace_back("--set");
    sets.push_back(change.at("path").get<std::string>() + "=" + change.at("value").dump());
  }
  std::vector<std::string> extra = sets;
  extra.emplace_back("--json");
  const CliResult replanned = runCli(tinyGptArgs("explain", extra));
  INFO("replanned stderr: ", replanned.err);
  REQUIRE(replanned.exitCode == 0);
  const json after = parseJson(replanned);
  CHECK(after.at("memory").at("fits") == true);
  CHECK(after.at("modelledStepTime").at("seconds").get<double>() == best.at("stepSeconds").get<double>());
  CHECK(after.at("leverCombinations").empty());
  // Per-IPU rows: one class per IPU of the replicas, with its count.
  const int64_t ipus = after.at("memory").at("ipusPerReplica").get<int64_t>();
  const json& classes = after.at("memory").at("replicaClasses");
  CHECK(static_cast<int64_t>(classes.size()) >= ipus);
  std::set<int64_t> seen;
  int64_t entries = 0;
  for (const json& c : classes) {
    seen.insert(c.at("ipu").get<int64_t>());
    entries += c.at("count").get<int64_t>();
  }
  CHECK(static_cast<int64_t>(seen.size()) == ipus);
  CHECK(entries == after.at("replication").at("global").get<int64_t>() * ipus);

  // The text answers the same, with the settings to paste; validate exits the same way.
  const CliResult text = runCli(tinyGptArgs("explain", {"--lever-plans", "12"}));
  CHECK(text.exitCode == 4);
  CHECK(text.out.find("\nLevers that make it fit (each combination planned; the fastest modelled step first; ") !=
        std::string::npos);
  CHECK(text.out.find("\n  1. ") != std::string::npos);
  CHECK(text.out.find(" --set ") != std::string::npos);
  CHECK(runCli(tinyGptArgs("validate", {})).exitCode == 4);
  CHECK(runCli(tinyGptArgs("validate", sets)).exitCode == 0);
  // --lever-plans 0: no search.
  const json none = json::parse(runCli(tinyGptArgs("explain", {"--json", "--lever-plans", "0"})).out);
  CHECK(none.at("levers").empty());
  CHECK(none.at("leverSearch").at("plans") == 0);
}

TEST_CASE("explain plans recomputation as a lever: a lower peak for more modelled step time") {
  // GPT-2 XL's shape, two of its blocks (cheap enough under valgrind): the
  // activations of a 1,024-token sequence do not fit.
  const std::string path = tessera::test::sourcePath("samples/configs/gpt2_xl_pod64.json");
  // The sample's layout before its levers: 64 replicas of one IPU, float32, no recomputation.
  const std::vector<std::string> before = {
      "--set", "/model/layers=2", "--set", "/device/ipusPerReplica=1", "--set",
      "/sessionOptions/replicatedGraphCount=64", "--set", "/sessionOptions/virtualGraphMode=Off", "--set",
      "/sessionOptions/autoRecomputation=None", "--set", "/model/dtype=float32", "--lever-plans", "2"};
  std::vector<std::string> args = {"explain", path, "--json"};
  args.insert(args.end(), before.begin(), before.end());
  const CliResult asJson = runCli(args);
  CHECK(asJson.exitCode == 4);
  const json report = json::parse(asJson.out);
  const double step = report.at("modelledStepTime").at("seconds").get<double>();
  std::optional<json> recompute;
  for (const json& lever : report.at("levers")) {
    CHECK(lever.at("stepSeconds").get<double>() > 0.0);
    if (lever.at("setting") == "/sessionOptions/autoRecomputation" && lever.at("value") == "Standard")
      recompute = lever;
  }
  REQUIRE(recompute.has_value());
  INFO("lever: ", recompute->dump());
  CHECK(recompute->at("value") == "Standard");
  CHECK(recompute->at("savingBytes").get<int64_t>() > 0);
  // The clones are charged like any op: the step takes longer.
  CHECK(recompute->at("stepSeconds").get<double>() > step);
  // With recomputation set, it is no lever: the plan is the lever's.
  args.insert(args.end(), {"--set", "/sessionOptions/autoRecomputation=Standard"});
  const CliResult standard = runCli(args);
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

}  // namespace
