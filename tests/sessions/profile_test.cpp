#include "tessera/app/profile.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/app/mlp.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/sessions/session.hpp"
#include "tessera/app/trainer.hpp"
#include "test_support.hpp"

using namespace tessera;
using nlohmann::json;

namespace {

// On 2 replicas: a matmul whose result is stored through the compute tiles,
// loaded back through the IO tiles, copied, summed and all-reduced.
Program lanesProgram() {
  Graph g(2);
  const Tensor x = ops::input(g, "x", {4, 8});
  const Tensor w = ops::variable(g, "w", std::vector<float>(8 * 16, 0.5f), {8, 16});
  const RemoteBuffer buffer = ops::remoteBuffer(g, {4, 16});
  ops::remoteStore(g, buffer, 0, ops::matmul(x, w));
  const Tensor loaded = ops::remoteLoad(g, buffer);
  g.tensor(loaded.id()).tileSet = TileSet::IO;
  ops::replicatedAllReduce(ops::reduceSum(ops::copy(loaded)));
  Program p{g};
  p.replicas.localReplicas = 2;
  p.replicas.globalReplicas = 2;
  p.numIOTiles = 32;
  return p;
}

// A fresh, empty folder under the system's temporary folder.
std::filesystem::path scratchFolder(const std::string& name) {
  const std::filesystem::path folder =
      std::filesystem::temp_directory_path() / ("tessera_profile_test_" + name);
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  return folder;
}

json readJson(const std::filesystem::path& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return json::parse(in);
}

}  // namespace

TEST_CASE("the profile holds memory per replica, traffic per lane and time per op and step") {
  const Program program = lanesProgram();
  const DeviceSpec spec;
  const MemoryReport memory = planMemory(program, spec);
  const TimeReport time = modelTime(program, spec);
  const json j = profileJson(memory, time, 5);

  CHECK(j["steps"] == 5);
  CHECK(j["time"]["stepSeconds"].get<double>() == doctest::Approx(time.stepSeconds));
  CHECK(j["time"]["totalSeconds"].get<double>() == doctest::Approx(5 * time.stepSeconds));
  CHECK(j["time"]["overlappedStreamingSeconds"].get<double>() ==
        doctest::Approx(time.overlappedStreamingSeconds));

  // MatMul, Copy and ReduceSum compute; the store blocks compute, the load
  // overlaps it; the all-reduce of one float moves 2 x 1/2 x 4 bytes.
  const json& traffic = j["traffic"];
  CHECK(traffic["ComputeTiles"]["ops"] == 3);
  CHECK(traffic["ComputeTiles"]["bytes"] == 0.0);
  CHECK(traffic["Streaming"]["ops"] == 1);
  CHECK(traffic["Streaming"]["bytes"] == 4 * 16 * 4.0);
  CHECK(traffic["IOTiles"]["ops"] == 1);
  CHECK(traffic["IOTiles"]["bytes"] == 4 * 16 * 4.0);
  CHECK(traffic["Link"]["ops"] == 1);
  CHECK(traffic["Link"]["bytes"] == 4.0);

  REQUIRE(j["ops"].size() == time.ops.size());
  const json& first = j["ops"][0];
  CHECK(first["name"] == "MatMul");
  CHECK(first["kind"] == "MatMul");
  CHECK(first["lane"] == "ComputeTiles");
  CHECK(first["flops"] == 2.0 * 4 * 16 * 8);
  CHECK(j["ops"][1]["lane"] == "Streaming");
  CHECK(j["ops"][2]["lane"] == "IOTiles");

  const json& mem = j["memory"];
  CHECK(mem["capacity"]["ioTiles"] == memory.ioTilesCapacity);
  REQUIRE(mem["perReplica"].size() == 2);
  const json& replica = mem["perReplica"][1];
  CHECK(replica["replica"] == 1);
  CHECK(replica["computeTiles"]["peakBytes"] == memory.perReplica[1].computeTilesBytes);
  CHECK(replica["ioTiles"]["peakBytes"] == 4 * 16 * 4);
  CHECK(replica["streaming"]["peakBytes"] == 4 * 16 * 4);
  CHECK(replica["byCategory"]["Weight"]["computeTiles"] == 8 * 16 * 4);
  CHECK(replica["byCategory"]["Activation"]["streaming"] == 4 * 16 * 4);
  CHECK(replica["computeTiles"]["largest"][0]["name"] ==
        memory.perReplica[1].computeTilesPeak.largest[0].name);
  bool sawWeight = false;
  for (const json& t : mem["tensors"]) {
    if (t["name"] != "w") continue;
    sawWeight = true;
    CHECK(t["category"] == "Weight");
    CHECK(t["space"] == "ComputeTiles");
    CHECK(t["bytes"] == 8 * 16 * 4);
    CHECK(t["resident"] == true);
    CHECK(t["sharded"] == false);
  }
  CHECK(sawWeight);
}

TEST_CASE("the Chrome trace has one complete event per op on one named thread per lane") {
  const TimeReport time = modelTime(lanesProgram(), DeviceSpec{});
  const json trace = chromeTraceJson(time);
  REQUIRE(trace["traceEvents"].is_array());

  std::map<int, std::string> threads;
  std::vector<json> complete;
  for (const json& e : trace["traceEvents"]) {
    CHECK(e["pid"] == 0);
    if (e["ph"] == "M" && e["name"] == "thread_name") threads[e["tid"].get<int>()] = e["args"]["name"];
    if (e["ph"] == "X") complete.push_back(e);
  }
  const std::string link = "link " + ReplicaGrouping(2).str();
  CHECK(threads ==
        std::map<int, std::string>{{0, "compute tiles"}, {1, "IO tiles"}, {2, "streaming"}, {3, link}});

  REQUIRE(complete.size() == time.ops.size());
  const std::map<std::string, int> laneThread = {
      {"ComputeTiles", 0}, {"IOTiles", 1}, {"Streaming", 2}, {"Link", 3}};
  for (std::size_t i = 0; i < complete.size(); ++i) {
    const json& e = complete[i];
    const OpTime& op = time.ops[i];
    INFO(op.name);
    CHECK(e["name"] == op.name);
    CHECK(e["cat"] == std::string(toString(op.lane)));
    CHECK(e["tid"] == laneThread.at(e["cat"]));
    // Microseconds.
    CHECK(e["ts"].get<double>() == doctest::Approx(op.start * 1e6));
    CHECK(e["dur"].get<double>() == doctest::Approx(op.duration * 1e6));
    CHECK(e["args"]["kind"] == std::string(toString(op.kind)));
  }
}

TEST_CASE("profiles are written as files; an unwritable path is an IoError naming it") {
  const Program program = lanesProgram();
  const MemoryReport memory = planMemory(program, DeviceSpec{});
  const TimeReport time = modelTime(program, DeviceSpec{});
  const std::filesystem::path folder = scratchFolder("files");
  writeProfile((folder / "profile.json").string(), memory, time, 3);
  writeChromeTrace((folder / "trace.json").string(), time);
  CHECK(readJson(folder / "profile.json") == profileJson(memory, time, 3));
  CHECK(readJson(folder / "trace.json") == chromeTraceJson(time));

  const std::string missing = (folder / "no such folder" / "profile.json").string();
  for (const auto& write : std::vector<std::function<void()>>{[&] { writeProfile(missing, memory, time); },
                                                              [&] { writeChromeTrace(missing, time); }}) {
    const auto error = test::catchError<IoError>(write);
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::FileUnwritable);
    CHECK(error->subject() == missing);
  }
  std::filesystem::remove_all(folder);
}

TEST_CASE("a training session models the time of its compiled program") {
  ModelConfig model;
  model.layers = {12, 8, 4};
  MlpGraph mlp = buildMlp(model, 4, 2, 3);
  SessionOptions options;
  options.enableReplicatedGraphs = true;
  options.replicatedGraphCount = 2;
  OptimizerConfig sgd;
  sgd.type = OptimizerType::Sgd;
  DeviceSpec spec;
  spec.linkBandwidthBytesPerSecond = 1e6;  // slow links make the gradient all-reduces visible
  TrainingSession session(std::move(mlp.graph), mlp.loss, makeOptimizer(sgd), options, makeSimDevice(spec));
  const TimeReport& time = session.modelledTime();
  Program program{session.graph()};
  program.replicas.localReplicas = 2;
  program.replicas.globalReplicas = 2;
  const TimeReport expected = modelTime(program, spec);
  // The device's ops as the graph alone gives them; the host streams (the
  // two inputs and the loss) add their transfers on the HostIO lane.
  const auto deviceOps = std::count_if(time.ops.begin(), time.ops.end(),
                                       [](const OpTime& op) { return op.lane != TimeLane::HostIO; });
  REQUIRE(static_cast<std::size_t>(deviceOps) == expected.ops.size());
  CHECK(time.deviceSeconds == doctest::Approx(expected.stepSeconds));
  CHECK(time.streams.size() == 3);
  CHECK(time.stepSeconds > time.deviceSeconds);
  int allReduces = 0;
  for (const OpTime& op : time.ops) allReduces += op.kind == OpKind::ReplicatedAllReduce ? 1 : 0;
  CHECK(allReduces >= 2);  // at least one per weight matrix
  CHECK(time.collectiveSeconds > time.computeSeconds);
}

TEST_CASE("tessera train writes the profile and the trace named in the config's output section") {
  const std::filesystem::path folder = scratchFolder("train");
  RunConfig config;
  config.sessionOptions.enableReplicatedGraphs = true;
  config.sessionOptions.replicatedGraphCount = 2;
  config.model.layers = {784, 16, 10};
  config.optimizer.type = OptimizerType::Sgd;
  config.data.dataset = DatasetKind::Synthetic;
  config.data.batchSize = 8;
  config.data.testBatchSize = 8;
  config.data.limitTrainSamples = 64;
  config.data.limitTestSamples = 16;
  config.output.profile = (folder / "profile.json").string();
  config.output.trace = (folder / "trace.json").string();
  const TrainSummary summary = train(config);
  REQUIRE(summary.steps == 4);  // 64 samples in global batches of 2 x 8

  const json profile = readJson(folder / "profile.json");
  CHECK(profile["steps"] == 4);
  const double step = profile["time"]["stepSeconds"].get<double>();
  CHECK(step > 0);
  CHECK(profile["time"]["totalSeconds"].get<double>() == doctest::Approx(4 * step));
  CHECK(profile["memory"]["perReplica"].size() == 2);
  CHECK(profile["memory"]["perReplica"][0]["computeTiles"]["peakBytes"] ==
        summary.memory.perReplica[0].computeTilesBytes);
  CHECK(profile["traffic"]["Link"]["ops"].get<int>() >= 2);

  const json trace = readJson(folder / "trace.json");
  std::set<std::string> cats;
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == "X") cats.insert(e["cat"].get<std::string>());
  CHECK(cats.count("ComputeTiles") == 1);
  CHECK(cats.count("Link") == 1);
  CHECK(cats.count("HostIO") == 1);
  std::filesystem::remove_all(folder);
}
