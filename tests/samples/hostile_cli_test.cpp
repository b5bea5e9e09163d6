// Hostile inputs and outputs at the command line: special files where files
// are expected, NUL in paths, huge values in errors, counts over the limits,
// groupings PopXL refuses and training that diverges. Each is answered at
// once with an id and exit code 1 or 2.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/process.hpp"
#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tessera::test::ProcessResult;
using tessera::test::readFile;
using tessera::test::runCli;
using tessera::test::TempDir;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs the CLI and checks that it answered within 3 s.
ProcessResult runQuickly(const std::vector<std::string>& args) {
  const auto start = std::chrono::steady_clock::now();
  ProcessResult result = runCli(args);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(3));
  return result;
}

// A small synthetic run: batch 8, 10 steps per epoch.
json smallRun() {
  return {{"model", {{"layers", {784, 16, 10}}}},
          {"optimizer", {{"type", "SGD"}, {"learningRate", 0.05}}},
          {"data",
           {{"dataset", "Synthetic"},
            {"batchSize", 8},
            {"epochs", 1},
            {"limitTrainSamples", 80},
            {"limitTestSamples", 16}}}};
}

}  // namespace

TEST_CASE("a FIFO, a device or a folder as the config or checkpoint is refused at once with io.601") {
  const TempDir dir;
  const std::string fifo = (dir.path() / "fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::vector<std::vector<std::string>> commands = {
      {"validate", fifo},
      {"train", fifo},
      {"validate", "/dev/zero"},
      {"validate", dir.path().string()},
      {"checkpoint", "inspect", fifo},
      {"checkpoint", "inspect", "/dev/zero"},
      {"checkpoint", "inspect", "/dev/urandom"},
  };
  for (const auto& command : commands) {
    CAPTURE(command.back());
    CAPTURE(command.front());
    const ProcessResult result = runQuickly(command);
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 2);
    CHECK(result.err.starts_with("error: [tessera.io.601] " + command.back() +
                                 ": cannot read the file: it is "));
    CHECK(contains(result.err, "not a regular file"));
  }
  const std::string config = dir.write("run.json", smallRun().dump());
  const ProcessResult resumed = runQuickly({"train", config, "--resume", "/dev/urandom", "--quiet"});
  INFO("stderr: ", resumed.err);
  CHECK(resumed.exitCode == 2);
  CHECK(
      resumed.err.starts_with("error: [tessera.io.601] /dev/urandom: cannot read the file: it is a character "
                              "device, not a regular file"));
}

TEST_CASE("an output path naming a special file, directly or by a link, is refused and left alone") {
  const TempDir dir;
  const std::string fifo = (dir.path() / "fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const fs::path link = dir.path() / "link";
  fs::create_symlink(fifo, link);
  const std::string config = dir.write("run.json", smallRun().dump());
  for (const std::string& target : {fifo, link.string(), std::string("/dev/null")}) {
    CAPTURE(target);
    for (const char* key : {"checkpoint", "profile", "trace"}) {
      CAPTURE(key);
      const ProcessResult result =
          runQuickly({"validate", config, "--set", fmt::format("/output/{}={}", key, json(target).dump())});
      INFO("stderr: ", result.err);
      CHECK(result.exitCode == 1);
      CHECK(result.err.starts_with(
          fmt::format("error: [tessera.io.607] /output/{}: \"{}\" cannot be written: it is ", key, target)));
      CHECK(contains(result.err, "not a regular file, and tessera never replaces one"));
    }
    const ProcessResult summary = runQuickly({"train", config, "--quiet", "--json-summary", target});
    INFO("stderr: ", summary.err);
    CHECK(summary.exitCode == 1);
    CHECK(summary.err.starts_with("error: [tessera.io.607] --json-summary: "));
  }
  CHECK(fs::status(fifo).type() == fs::file_type::fifo);
  CHECK(fs::is_symlink(link));
  CHECK(fs::status("/dev/null").type() == fs::file_type::character);
}

TEST_CASE("a NUL character in an output path, from JSON or --set, is refused") {
  const TempDir dir;
  json run = smallRun();
  run["output"]["checkpoint"] = (dir.path() / "model").string() + std::string(1, '\0') + ".safetensors";
  const std::string config = dir.write("nul.json", run.dump());
  REQUIRE(contains(readFile(config), "\\u0000"));
  const std::string plain = dir.write("run.json", smallRun().dump());
  const std::string trace =
      "/output/trace=" + json((dir.path() / "t").string() + std::string(1, '\0') + "x").dump();
  REQUIRE(contains(trace, "\\u0000"));
  for (const auto& command : std::vector<std::vector<std::string>>{
           {"validate", config}, {"train", config}, {"validate", plain, "--set", trace}}) {
    CAPTURE(command.back());
    const ProcessResult result = runQuickly(command);
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 1);
    CHECK(result.err.starts_with("error: [tessera.config.155] /output/"));
    CHECK(contains(result.err, "has a NUL character after its first "));
  }
  CHECK(!fs::exists(dir.path() / "model"));
  CHECK(!fs::exists(dir.path() / "t"));
}

TEST_CASE("errors quote a bounded prefix of a huge key, enum value or syntax error") {
  const TempDir dir;
  const std::string huge(10 << 20, 'k');
  const std::vector<std::pair<std::string, std::string>> documents = {
      {"key.json", json{{huge, 1}}.dump()},
      {"enum.json",
       json{{"sessionOptions", {{"weightTensorLocationSettings", {{"location", {{"storage", huge}}}}}}}}
           .dump()},
      {"syntax.json", "{\"a\": \"" + huge + "\n\"}"},
  };
  // Named variables, not structured bindings: clang before 16 cannot capture those (CAPTURE makes a lambda).
  for (const auto& document : documents) {
    const std::string& name = document.first;
    CAPTURE(name);
    const ProcessResult result = runQuickly({"validate", dir.write(name, document.second)});
    CHECK(result.exitCode == 1);
    CHECK(result.err.starts_with("error: [tessera.config.10"));
    CHECK(result.err.size() < 4096);
    CHECK(contains(result.err, "... ("));
  }
}

TEST_CASE("a config with more layers than /limits/maxLayers fails validate with the limit named") {
  const TempDir dir;
  json run = smallRun();
  std::vector<int64_t> layers(100'000, 4);
  layers.front() = 784;
  layers.back() = 10;
  run["model"]["layers"] = layers;
  const std::string config = dir.write("deep.json", run.dump());
  for (const char* command : {"validate", "explain", "train"}) {
    CAPTURE(command);
    const ProcessResult result = runQuickly({command, config});
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 1);
    CHECK(result.err.starts_with(
        "error: [tessera.config.154] /model/layers: the model has 99999 layers, more than "
        "/limits/maxLayers (1024)"));
  }
  // The knob: a user who needs more raises it.
  run["model"]["layers"] = std::vector<int64_t>{784, 4, 4, 4, 10};
  run["limits"]["maxLayers"] = 3;
  const std::string limited = dir.write("limited.json", run.dump());
  CHECK(runQuickly({"validate", limited}).exitCode == 1);
  CHECK(runQuickly({"validate", limited, "--set", "/limits/maxLayers=4"}).exitCode == 0);
}

TEST_CASE("a run of more replicas than /limits/maxReplicas is refused before it is planned, the limit named") {
  const TempDir dir;
  json run = smallRun();
  run["sessionOptions"]["enableReplicatedGraphs"] = true;
  run["sessionOptions"]["replicatedGraphCount"] = 4611686018427387904LL;  // 2^62
  const std::string config = dir.write("replicas.json", run.dump());
  for (const char* command : {"validate", "explain", "train"}) {
    CAPTURE(command);
    for (const char* count : {"4611686018427387904", "1048576"}) {
      CAPTURE(count);
      const ProcessResult result =
          runQuickly({command, config, "--set", std::string("/sessionOptions/replicatedGraphCount=") + count});
      INFO("stderr: ", result.err);
      CHECK(result.exitCode == 1);
      CHECK(result.err.starts_with(fmt::format(
          "error: [tessera.config.154] /sessionOptions/replicatedGraphCount: the run has {} replicas, more "
          "than /limits/maxReplicas (65536)",
          count)));
    }
  }
  // The launcher's count (its POPDIST_* variables) meets the same limit in train.
  ::setenv("POPDIST_NUM_TOTAL_REPLICAS", "4611686018427387904", 1);
  ::setenv("POPDIST_NUM_LOCAL_REPLICAS", "4611686018427387904", 1);
  ::setenv("POPDIST_REPLICA_INDEX_OFFSET", "0", 1);
  const ProcessResult launched = runQuickly({"train", dir.write("launched.json", smallRun().dump())});
  for (const char* name : {"POPDIST_NUM_TOTAL_REPLICAS", "POPDIST_NUM_LOCAL_REPLICAS", "POPDIST_REPLICA_INDEX_OFFSET"})
    ::unsetenv(name);
  INFO("stderr: ", launched.err);
  CHECK(launched.exitCode == 1);
  CHECK(launched.err.starts_with(
      "error: [tessera.config.154] POPDIST_NUM_TOTAL_REPLICAS: the launcher asks for 4611686018427387904 replicas "
      "in total (tessera launch --num-replicas), more than /limits/maxReplicas (65536)"));
  // The knob: a user who needs more raises it.
  const std::vector<std::string> eight = {"--set", "/sessionOptions/replicatedGraphCount=8"};
  std::vector<std::string> limited = {"validate", config, "--set", "/limits/maxReplicas=4"};
  limited.insert(limited.end(), eight.begin(), eight.end());
  CHECK(runQuickly(limited).exitCode == 1);
  limited[3] = "/limits/maxReplicas=8";
  CHECK(runQuickly(limited).exitCode == 0);
}

TEST_CASE(
    "train and evaluate refuse a program over /limits/maxHostBytes before allocating; validate and explain "
    "plan it") {
  // A device of 10^8 tiles holds a 784 x 1000000 layer (3.1 GB of weights,
  // each tensor under maxTensorBytes), but the simulator would hold it, its
  // gradient and Adam's two moments in host memory: over the 16 GiB default.
  const TempDir dir;
  json run = smallRun();
  run["device"]["tilesPerIpu"] = 100000000;
  run["model"]["layers"] = {784, 1000000, 10};
  run["optimizer"] = {{"type", "Adam"}};
  const std::string wide = dir.write("wide.json", run.dump());
  for (const char* command : {"validate", "explain"}) {
    CAPTURE(command);
    const ProcessResult result = runQuickly({command, wide});
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 0);
    CHECK(!contains(result.err, "tessera.device.415"));
  }
  for (const char* command : {"train", "evaluate"}) {
    CAPTURE(command);
    const ProcessResult result = runQuickly({command, wide});
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 1);
    CHECK(result.err.starts_with(
        fmt::format("error: [tessera.device.415] /limits/maxHostBytes: {} would allocate about ", command)));
    CHECK(contains(result.err, "more than /limits/maxHostBytes (16.00 GiB, 17179869184 bytes)"));
    CHECK(contains(result.err, "largest: W0 (Weight) 2.92 GiB"));
    CHECK(contains(result.err, "--set /limits/maxHostBytes="));
    CHECK(contains(result.err, "/device/tilesPerIpu 100000000"));
  }
  // The knob: the small run over a small limit, and under a larger one.
  const std::string small = dir.write("small.json", smallRun().dump());
  const ProcessResult refused =
      runQuickly({"train", small, "--quiet", "--set", "/limits/maxHostBytes=65536"});
  INFO("stderr: ", refused.err);
  CHECK(refused.exitCode == 1);
  CHECK(contains(refused.err, "more than /limits/maxHostBytes (0.00 GiB, 65536 bytes)"));
  const ProcessResult trained = runCli({"train", small, "--quiet", "--set", "/limits/maxHostBytes=16777216"});
  INFO("stderr: ", trained.err);
  CHECK(trained.exitCode == 0);
}

TEST_CASE("a config of millions of values is refused while it is parsed") {
  const TempDir dir;
  std::string text = R"({"sessionOptions": {"tensorLocationSettingsOverride": {)";
  for (int i = 0; i < 250'000; ++i) text += fmt::format("{}\"W{}\": {{}}", i == 0 ? "" : ",", i);
  text += "}}}";
  const ProcessResult result = runQuickly({"validate", dir.write("overrides.json", text)});
  INFO("stderr: ", result.err);
  CHECK(result.exitCode == 1);
  CHECK(result.err.starts_with("error: [tessera.config.108] "));
  CHECK(contains(result.err, "more than 200000 values"));
}

TEST_CASE("groups refuses what PopXL refuses and counts beyond 64 bits") {
  const ProcessResult strided =
      runQuickly({"groups", "--replicas", "8", "--stride", "2", "--group-size", "2"});
  CHECK(strided.exitCode == 1);
  CHECK(strided.err ==
        "error: [tessera.config.149] ReplicaGrouping(numReplicas=8, stride=2, groupSize=2): with stride 2 != "
        "1, "
        "stride * groupSize must equal numReplicas 8 (PopXL's rule) but is 4; use groupSize 4 or stride 1\n");
  CHECK(runQuickly({"groups", "--replicas", "8", "--stride", "2", "--group-size", "4"}).exitCode == 0);
  const ProcessResult huge = runQuickly({"groups", "--replicas", "9223372036854775808"});
  INFO("stderr: ", huge.err);
  CHECK(huge.exitCode == 2);
  CHECK(contains(huge.err, "9223372036854775808 is too large to list"));
}

TEST_CASE("training that diverges stops at the first non-finite loss with device.403") {
  const TempDir dir;
  json run = smallRun();
  run["optimizer"]["learningRate"] = 1e308;
  run["data"]["epochs"] = 3;
  run["output"]["checkpoint"] = (dir.path() / "model.safetensors").string();
  const std::string config = dir.write("diverge.json", run.dump());
  const std::string summary = (dir.path() / "summary.json").string();
  const ProcessResult result = runCli({"train", config, "--quiet", "--json-summary", summary});
  INFO("stderr: ", result.err);
  CHECK(result.exitCode == 1);
  CHECK(result.err.starts_with("error: [tessera.device.403] step "));
  CHECK(contains(result.err, "training diverged and stopped"));
  const json report = json::parse(readFile(summary));
  CHECK(report["diverged"] == true);
  const auto step = report["divergedStep"].get<int64_t>();
  CHECK(step < 30);
  CHECK(report["steps"].get<int64_t>() == step + 1);
  // JSON has no NaN: the non-finite loss is null.
  CHECK(report["losses"].back().is_null());
  // No checkpoint of the non-finite weights is written.
  CHECK(!fs::exists(dir.path() / "model.safetensors"));
}

TEST_CASE("an override naming a tensor the model does not have fails explain and train with graph.203") {
  const TempDir dir;
  json run = smallRun();
  run["sessionOptions"]["tensorLocationSettingsOverride"]["W9"] = {{"storage", "OffChip"}};
  const std::string config = dir.write("override.json", run.dump());
  for (const char* command : {"explain", "train"}) {
    CAPTURE(command);
    const ProcessResult result = runQuickly({command, config});
    INFO("stderr: ", result.err);
    CHECK(result.exitCode == 1);
    CHECK(
        result.err.starts_with("error: [tessera.graph.203] "
                               "/sessionOptions/tensorLocationSettingsOverride/W9: locations: the override names "
                               "tensor "
                               "\"W9\" but the model has no tensor of that name (did you mean \"W"));
  }
  run["sessionOptions"]["tensorLocationSettingsOverride"] = {{"W1", {{"storage", "OffChip"}}}};
  CHECK(runQuickly({"explain", dir.write("known.json", run.dump())}).exitCode == 0);
}

TEST_CASE("checkpoint inspect reads only the header: a 6 GiB checkpoint is listed at once") {
  // The small MLP's checkpoint with its first tensor made 6 GiB large: the
  // header is rewritten with the new shape and offsets, and the file is
  // extended (sparsely) to the size the header says.
  const TempDir dir;
  const std::string valid = readFile(tessera::test::sourcePath("tests/data/checkpoint/valid.safetensors"));
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(valid[static_cast<size_t>(i)]);
  json header = json::parse(valid.substr(8, length));
  std::vector<std::string> order;
  for (const auto& item : header.items())
    if (item.key() != "__metadata__") order.push_back(item.key());
  std::sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
    return header[a]["data_offsets"][0].get<uint64_t>() < header[b]["data_offsets"][0].get<uint64_t>();
  });
  const std::string big = order.front();
  REQUIRE(header[big]["dtype"] == "F32");
  header[big]["shape"] = {uint64_t{3} << 29};  // 1.5 G float32 values: 6 GiB
  uint64_t offset = 0;
  for (const std::string& name : order) {
    uint64_t elements = 4;
    for (const auto& dim : header[name]["shape"]) elements *= dim.get<uint64_t>();
    header[name]["data_offsets"] = {offset, offset + elements};
    offset += elements;
  }
  const std::string text = header.dump();
  std::string bytes(8, '\0');
  for (size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  const std::string path = dir.write("huge.safetensors", bytes + text);
  fs::resize_file(path, 8 + text.size() + offset);
  REQUIRE(fs::file_size(path) > (uint64_t{6} << 30));

  const ProcessResult listed = runQuickly({"checkpoint", "inspect", path, "--json"});
  INFO("stderr: ", listed.err);
  REQUIRE(listed.exitCode == 0);
  const json inspected = json::parse(listed.out);
  CHECK(inspected["bytes"] == fs::file_size(path));
  CHECK(inspected["tensors"][0]["name"] == big);
  CHECK(inspected["tensors"][0]["bytes"] == uint64_t{6} << 30);
  const ProcessResult table = runQuickly({"checkpoint", "inspect", path});
  CHECK(table.exitCode == 0);
  CHECK(contains(table.out, "6442450944"));

  // A data section longer than the header's tensors is still found without reading it.
  fs::resize_file(path, 8 + text.size() + offset + 4);
  const ProcessResult longer = runQuickly({"checkpoint", "inspect", path});
  CHECK(longer.exitCode == 1);
  CHECK(longer.err.starts_with("error: [tessera.io.603] " + path + ": bytes "));
  CHECK(contains(longer.err, "at the end of the data section belong to no tensor"));
}

TEST_CASE("resuming a checkpoint of the run's last step runs no step and reports no final loss") {
  const TempDir dir;
  json run = smallRun();
  const std::string checkpoint = (dir.path() / "model.safetensors").string();
  run["output"]["checkpoint"] = checkpoint;
  const std::string config = dir.write("run.json", run.dump());
  const ProcessResult trained = runCli({"train", config, "--quiet"});
  INFO("stderr: ", trained.err);
  REQUIRE(trained.exitCode == 0);
  CHECK(contains(trained.out, "final loss: "));
  const std::string summary = (dir.path() / "summary.json").string();
  const ProcessResult resumed = runCli({"train", config, "--quiet", "--resume", checkpoint, "--json-summary", summary});
  INFO("stderr: ", resumed.err);
  REQUIRE(resumed.exitCode == 0);
  CHECK(contains(resumed.out, "steps: 0 "));
  CHECK(contains(resumed.out, "final loss: none, no steps were run (step 10 is the run's last)\n"));
  CHECK(!contains(resumed.out, "final loss: 0.0000"));
  const json written = json::parse(readFile(summary));
  CHECK(written["steps"] == 0);
  CHECK(written["finalLoss"].is_null());
}

TEST_CASE("a per-tensor override that shards a weight and its momentum differently is config.123") {
  // Four replicas: W0 over groups of 2 by its override while its momentum
  // follows the optimizer state's category (all 4), and the other way round.
  const json consecutive2 = {{"type", "Consecutive"}, {"replicaGroupSize", 2}};
  const json rtsOn = {{"replicatedTensorSharding", "On"}};
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"tensorLocationSettingsOverride", {{"W0", {{"replicatedTensorSharding", "On"}, {"shardingDomain", consecutive2}}}}},
        {"optimizerStateTensorLocationSettings", {{"location", rtsOn}}}},
       "its weight W0 is sharded over "},
      {{{"weightTensorLocationSettings", {{"location", rtsOn}}},
        {"optimizerStateTensorLocationSettings", {{"location", rtsOn}}},
        {"tensorLocationSettingsOverride",
         {{"W0.momentum", {{"replicatedTensorSharding", "On"}, {"shardingDomain", consecutive2}}}}}},
       "/sessionOptions/tensorLocationSettingsOverride/W0.momentum"},
  };
  const TempDir dir;
  for (const auto& [overrides, expected] : cases) {
    json run = smallRun();
    run["optimizer"]["momentum"] = 0.9;
    run["sessionOptions"] = {{"enableReplicatedGraphs", true}, {"replicatedGraphCount", 4}};
    run["sessionOptions"].update(overrides);
    const std::string config = dir.write("run.json", run.dump());
    const std::string text = expected;
    CAPTURE(text);
    for (const char* command : {"validate", "explain", "train"}) {
      CAPTURE(command);
      std::vector<std::string> args{command, config};
      if (std::string(command) == "train") args.push_back("--quiet");
      const ProcessResult result = runQuickly(args);
      INFO("stderr: ", result.err);
      CHECK(result.exitCode == 1);
      CHECK(result.err.starts_with("error: [tessera.config.123] "));
      CHECK(contains(result.err, "W0.momentum: the optimizer state is sharded over "));
      CHECK(contains(result.err, text));
    }
  }
  // The same domains by override and category: accepted.
  json run = smallRun();
  run["optimizer"]["momentum"] = 0.9;
  run["sessionOptions"] = {
      {"enableReplicatedGraphs", true},
      {"replicatedGraphCount", 4},
      {"tensorLocationSettingsOverride",
       {{"W0", {{"replicatedTensorSharding", "On"}, {"shardingDomain", consecutive2}}},
        {"W0.momentum", {{"replicatedTensorSharding", "On"}, {"shardingDomain", consecutive2}}}}}};
  const ProcessResult valid = runQuickly({"validate", dir.write("same.json", run.dump())});
  INFO("stderr: ", valid.err);
  CHECK(valid.exitCode == 0);
}

TEST_CASE("explain's \"Not applied\" names every tensor a setting was not applied to") {
  // One replica: replicated tensor sharding of the weights and their
  // momentum is applied to none of them.
  const ProcessResult result = runQuickly({"explain", tessera::test::sourcePath("samples/configs/mnist_rts.json"),
                                           "--json", "--set", "/sessionOptions/enableReplicatedGraphs=false",
                                           "--set", "/sessionOptions/replicatedGraphCount=1"});
  INFO("stderr: ", result.err);
  REQUIRE(result.exitCode == 0);
  const json report = json::parse(result.out);
  std::map<std::string, std::string> tensors;
  for (const json& entry : report["notApplied"])
    tensors[entry["setting"].get<std::string>() + " " + entry["why"].get<std::string>()] =
        entry["tensor"].get<std::string>();
  const std::string why = "/replicatedTensorSharding no local replication (enableReplicatedGraphs is false)";
  CHECK(tensors["/sessionOptions/weightTensorLocationSettings/location" + why] ==
        "these 6 tensors: W0, b0, W1, b1, W2, b2");
  CHECK(tensors["/sessionOptions/optimizerStateTensorLocationSettings/location" + why] ==
        "these 6 tensors: W0.momentum, b0.momentum, W1.momentum, b1.momentum, W2.momentum, b2.momentum");
}

TEST_CASE("gradient accumulation holds one micro-batch of the input on the device, not all of them") {
  // The input arrives one micro-batch at a time, as PopART's streams do:
  // 512 micro-batches must not make the activations 512 inputs larger.
  const auto activations = [](int factor) {
    const ProcessResult result =
        runQuickly({"explain", tessera::test::sourcePath("samples/configs/mnist.json"), "--json", "--set",
                    "/data/dataset=\"Synthetic\"", "--set", "/sessionOptions/enableGradientAccumulation=true",
                    "--set", fmt::format("/sessionOptions/accumulationFactor={}", factor)});
    INFO("stderr: ", result.err);
    REQUIRE(result.exitCode == 0);
    return json::parse(result.out)["memory"]["replicaClasses"][0]["activations"]["computeTiles"].get<int64_t>();
  };
  const int64_t one = activations(1);
  const int64_t many = activations(512);
  CAPTURE(one);
  CAPTURE(many);
  // Before, the whole input of 512 micro-batches (98 MiB) was counted live all step.
  CHECK(many < 2 * one);
}
