// Several IPUs per replica (virtual graphs): the MLP, LeNet and GPT-block
// exports of tests/data/onnx trained over 2 and 4 IPUs, placed by PopART's
// __ipu_number (Manual) or by the memory split (Auto), give the bits of one
// IPU, alone and with the splits of a step; every IPU has its own memory
// plan, and the copies between IPUs are traffic. Bad settings name the rule.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <set>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <stdlib.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>

#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/app/run_plan.hpp"
#include "tessera/app/trainer.hpp"
#include "test_support.hpp"
#include "transforms/virtual_graph.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Fixture {
  std::string name;
  std::string prefix;  // <prefix>.onnx, <prefix>_train.safetensors, <prefix>_training_reference.json
  std::string model;
};

const Fixture kMlp{"MLP", "mlp", "mlp.onnx"};
const Fixture kLeNet{"LeNet", "lenet", "lenet.onnx"};
const Fixture kGpt{"GPT block", "gpt", "gpt_block.onnx"};

std::string dataPath(const std::string& file) { return test::sourcePath("tests/data/onnx/" + file); }

// The annotated models written by this test, removed when it ends.
struct WrittenModels {
  std::set<std::string> paths;
  ~WrittenModels() {
    std::error_code ignored;
    for (const std::string& path : paths) fs::remove(path, ignored);
  }
};
WrittenModels written;

// The model of `fixture` with __ipu_number on every node: the nodes that
// compute on the data (those the importer does not fold: they read a graph
// input other than an initializer, not through Shape) cut into `ipus` runs
// of about equal count, the folded ones on IPU 0; `shift` is added to every
// value, and the first Relu node is left out when `skipRelu`. Written to a
// file of its own.
std::string annotated(const Fixture& fixture, int64_t ipus, int64_t shift = 0, bool skipRelu = false) {
  onnx::ModelProto model;
  REQUIRE(model.ParseFromString(test::readText(dataPath(fixture.model))));
  std::set<std::string> data;
  std::set<std::string> initializers;
  for (const onnx::TensorProto& t : model.graph().initializer()) initializers.insert(t.name());
  for (const onnx::ValueInfoProto& v : model.graph().input())
    if (!initializers.contains(v.name())) data.insert(v.name());
  std::vector<bool> computes;
  for (const onnx::NodeProto& node : model.graph().node()) {
    const bool reads = std::any_of(node.input().begin(), node.input().end(),
                                   [&](const std::string& in) { return data.contains(in); });
    const bool computing = reads && node.op_type() != "Shape" && node.op_type() != "Size";
    if (computing) data.insert(node.output().begin(), node.output().end());
    computes.push_back(computing);
  }
  const auto computing = static_cast<int64_t>(std::count(computes.begin(), computes.end(), true));
  REQUIRE(computing >= ipus);
  bool skipped = false;
  int64_t index = 0;
  for (int i = 0; i < model.graph().node_size(); ++i) {
    onnx::NodeProto* node = model.mutable_graph()->mutable_node(i);
    const int64_t ipu = computes[static_cast<std::size_t>(i)] ? index++ * ipus / computing : 0;
    if (skipRelu && !skipped && node->op_type() == "Relu") {
      skipped = true;
      continue;
    }
    onnx::AttributeProto* attribute = node->add_attribute();
    attribute->set_name("__ipu_number");
    attribute->set_type(onnx::AttributeProto::INT);
    attribute->set_i(ipu + shift);
  }
  const fs::path path = fs::temp_directory_path() /
                        fmt::format("tessera_vgraph_{}_{}_{}_{}_{}.onnx", ::getpid(), fixture.prefix, ipus, shift,
                                    skipRelu);
  std::ofstream(path, std::ios::binary) << model.SerializeAsString();
  written.paths.insert(path.string());
  return path.string();
}

// The run config of the fixture's training reference (Adam, R = 1 x batch 8)
// with the model at `model` and `overrides`.
RunConfig config(const Fixture& fixture, const std::string& model, const std::vector<std::string>& overrides = {}) {
  const json reference = json::parse(test::readText(dataPath(fixture.prefix + "_training_reference.json")));
  const json document = {{"model", {{"type", "Onnx"}, {"path", model}, {"loss", "loss"}}},
                         {"optimizer", reference.at("runs").at("adam").at("optimizer")},
                         {"data",
                          {{"dataset", "Tensors"},
                           {"path", dataPath(fixture.prefix + "_train.safetensors")},
                           {"batchSize", 8},
                           {"epochs", 1},
                           {"shuffle", false}}}};
  return parseRunConfig(document.dump(), fixture.prefix + "_vgraph.json", overrides).config;
}

std::vector<std::string> ipusOf(const std::string& mode, int64_t ipus) {
  return {"/sessionOptions/virtualGraphMode=" + mode, fmt::format("/device/ipusPerReplica={}", ipus)};
}

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

const std::vector<std::string> kReplicas2 = {
    "/sessionOptions/enableReplicatedGraphs=true", "/sessionOptions/replicatedGraphCount=2",
    "/sessionOptions/accumulationAndReplicationReductionType=Mean", "/data/batchSize=4"};
const std::vector<std::string> kRts = {
    "/sessionOptions/weightTensorLocationSettings/location/replicatedTensorSharding=On",
    "/sessionOptions/weightTensorLocationSettings/minElementsForReplicatedTensorSharding=0",
    "/sessionOptions/optimizerStateTensorLocationSettings/location/replicatedTensorSharding=On",
    "/sessionOptions/optimizerStateTensorLocationSettings/minElementsForReplicatedTensorSharding=0"};
const std::vector<std::string> kOffChip = {
    "/sessionOptions/numIOTiles=32",
    "/sessionOptions/optimizerStateTensorLocationSettings/location/storage=OffChip",
    "/sessionOptions/optimizerStateTensorLocationSettings/location/loadTileSet=IO",
    "/sessionOptions/optimizerStateTensorLocationSettings/location/storageTileSet=IO",
    "/sessionOptions/optimizerStateTensorLocationSettings/minElementsForOffChip=0"};

// Each IPU of the plan holds its own part of the one-IPU plan's model state.
void checkPlans(const RunPlan& one, const RunPlan& many, int64_t ipus) {
  const MemoryReport& a = one.memory;
  const MemoryReport& b = many.memory;
  REQUIRE(b.perReplica.size() == a.perReplica.size() * static_cast<std::size_t>(ipus));
  CHECK(b.ipusPerReplica == ipus);
  int64_t variables = 0;
  int64_t streaming = 0;
  for (int64_t ipu = 0; ipu < ipus; ++ipu) {
    const ReplicaMemory& m = b.perReplica.at(static_cast<std::size_t>(ipu));
    CHECK(m.ipu == ipu);
    CHECK(m.replica == a.perReplica.front().replica);
    variables += m.variableBytes;
    streaming += m.streamingBytes;
  }
  CHECK(variables == a.perReplica.front().variableBytes);
  CHECK(streaming == a.perReplica.front().streamingBytes);
  // The copies between IPUs are traffic on the IPU links, none with one IPU.
  CHECK(one.time.ipuCopies == 0);
  CHECK(many.time.ipuCopies > 0);
  CHECK(many.time.ipuCopyBytes > 0.0);
  double linked = 0.0;
  for (const OpTime& op : many.time.ops)
    if (op.lane == TimeLane::IpuLink) linked += op.bytes;
  CHECK(linked == many.time.ipuCopyBytes);
  CHECK(many.time.flops == one.time.flops);
}

void checkBitwise(const Fixture& fixture, const std::vector<int64_t>& counts) {
  CAPTURE(fixture.name);
  const std::string plainModel = dataPath(fixture.model);
  const TrainSummary plain = train(config(fixture, plainModel));
  REQUIRE(plain.losses.size() >= 2);
  const RunPlan plainPlan = planRun(config(fixture, plainModel));
  for (const int64_t ipus : counts) {
    CAPTURE(ipus);
    const std::string manualModel = annotated(fixture, ipus);
    for (const std::string mode : {"Manual", "Auto"}) {
      CAPTURE(mode);
      const std::string model = mode == "Manual" ? manualModel : plainModel;
      const TrainSummary summary = train(config(fixture, model, ipusOf(mode, ipus)));
      CHECK(summary.losses == plain.losses);
      CHECK(summary.weights == plain.weights);
      checkPlans(plainPlan, planRun(config(fixture, model, ipusOf(mode, ipus))), ipus);
    }
  }
  // The splits of a step over replicas, RTS and OffChip hold over 2 IPUs.
  const std::string model = annotated(fixture, 2);
  for (const auto& split : std::vector<std::vector<std::string>>{with(kReplicas2, kRts), with(kReplicas2, kOffChip)}) {
    const TrainSummary base = train(config(fixture, plainModel, split));
    for (const std::string mode : {"Manual", "Auto"}) {
      CAPTURE(mode);
      const TrainSummary summary =
          train(config(fixture, mode == "Manual" ? model : plainModel, with(split, ipusOf(mode, 2))));
      CHECK(summary.losses == base.losses);
      CHECK(summary.weights == base.weights);
    }
  }
}

TEST_CASE("the MLP over 2 and 4 IPUs, Manual and Auto, trains the bits of one IPU") {
  checkBitwise(kMlp, {2, 4});
}

TEST_CASE("LeNet over 2 and 4 IPUs, Manual and Auto, trains the bits of one IPU") {
  checkBitwise(kLeNet, {2, 4});
}

TEST_CASE("the GPT block over 2 and 4 IPUs, Manual and Auto, trains the bits of one IPU") {
  checkBitwise(kGpt, {2, 4});
}

TEST_CASE("Auto cuts the forward schedule into contiguous parts of about equal memory") {
  const RunPlan plan = planRun(config(kGpt, dataPath(kGpt.model), ipusOf("Auto", 4)));
  for (const OpNode& op : plan.program.graph.ops()) {
    CHECK(op.virtualGraph >= 0);
    CHECK(op.virtualGraph < 4);
    if (op.kind == OpKind::IpuCopy) {
      const OpId producer = plan.program.graph.tensor(op.inputs.at(0)).producer;
      CHECK(plan.program.graph.op(producer).virtualGraph != op.virtualGraph);
    }
  }
  // Every IPU holds a part, each below the one-IPU peak.
  const RunPlan one = planRun(config(kGpt, dataPath(kGpt.model)));
  std::vector<int64_t> peaks;
  for (const ReplicaMemory& m : plan.memory.perReplica) {
    CHECK(m.computeTilesBytes > 0);
    CHECK(m.computeTilesBytes < one.memory.perReplica.front().computeTilesBytes);
    peaks.push_back(m.computeTilesBytes);
  }
  MESSAGE(fmt::format("GPT block over 4 IPUs: peaks {} B (one IPU {} B), {} copies of {} B, step {:.3g} s "
                      "(one IPU {:.3g} s)",
                      fmt::join(peaks, ", "), one.memory.perReplica.front().computeTilesBytes, plan.time.ipuCopies,
                      plan.time.ipuCopyBytes, plan.time.stepSeconds, one.time.stepSeconds));
}

// The launcher's --ipus-per-replica (POPDIST_NUM_IPUS_PER_REPLICA) sets the
// IPUs of a replica when the config leaves them at 1, and refuses another count.
TEST_CASE("tessera launch --ipus-per-replica makes the device's IPUs per replica") {
  const std::vector<std::pair<std::string, std::string>> launched = {
      {std::string(dist::kNumTotalReplicasVar), "1"},
      {std::string(dist::kNumLocalReplicasVar), "1"},
      {std::string(dist::kNumIpusPerReplicaVar), "2"}};
  for (const auto& variable : launched) ::setenv(variable.first.c_str(), variable.second.c_str(), 1);
  const std::string model = dataPath(kMlp.model);
  const TrainSummary plain = [&] {
    ::unsetenv(std::string(dist::kNumIpusPerReplicaVar).c_str());
    TrainSummary one = train(config(kMlp, model));
    ::setenv(std::string(dist::kNumIpusPerReplicaVar).c_str(), "2", 1);
    return one;
  }();
  const TrainSummary summary = train(config(kMlp, model, {"/sessionOptions/virtualGraphMode=Auto"}));
  const auto refused = test::catchError<DistError>(
      [&] { (void)train(config(kMlp, model, ipusOf("Auto", 4))); });
  for (const auto& variable : launched) ::unsetenv(variable.first.c_str());
  CHECK(summary.memory.ipusPerReplica == 2);
  CHECK(summary.memory.perReplica.size() == 2);
  CHECK(summary.losses == plain.losses);
  REQUIRE(refused.has_value());
  CHECK(refused->id() == "tessera.dist.505");
  CHECK(std::string(refused->what()).find("/device/ipusPerReplica is 4") != std::string::npos);
}

template <class E>
void checkError(const std::function<void()>& run, const std::string& id, const std::string& part) {
  const auto error = test::catchError<E>(run);
  REQUIRE(error.has_value());
  CHECK(error->id() == id);
  const std::string message = error->what();
  INFO(message);
  CHECK(message.find(part) != std::string::npos);
}

TEST_CASE("bad virtual graph settings name the option and the rule") {
  const std::string plain = dataPath(kMlp.model);
  checkError<ConfigError>([&] { (void)planRun(config(kMlp, plain, ipusOf("ExecutionPhases", 2))); },
                          "tessera.config.191", "/sessionOptions/executionPhaseSettings/phases: virtualGraphMode is ExecutionPhases");
  checkError<ConfigError>([&] { (void)planRun(config(kMlp, plain, ipusOf("Off", 2))); }, "tessera.config.174",
                          "/device/ipusPerReplica: ipusPerReplica is 2 but /sessionOptions/virtualGraphMode is Off");
  checkError<ConfigError>([&] { (void)planRun(config(kMlp, annotated(kMlp, 2))); }, "tessera.config.175",
                          "virtualGraphMode is Off, but op");
  checkError<ConfigError>([&] { (void)planRun(config(kMlp, plain, ipusOf("Manual", 2))); },
                          "tessera.config.176", "virtualGraphMode is Manual, but none of the graph's");
  checkError<ConfigError>([&] { (void)planRun(config(kMlp, annotated(kMlp, 2, 0, true), ipusOf("Manual", 2))); },
                          "tessera.config.177", "either every op names its IPU or none does");
  checkError<ConfigError>([&] { (void)planRun(config(kMlp, annotated(kMlp, 2, 1), ipusOf("Manual", 2))); },
                          "tessera.config.178", "is placed on IPU 2 (its __ipu_number / virtualGraph), but a replica "
                                                "has 2 IPUs (/device/ipusPerReplica)");
  Graph graph;
  const Tensor x = ops::input(graph, "x", {2});
  const Tensor y = ops::relu(x);
  checkError<GraphError>([&] { ops::virtualGraph(y, -2); }, "tessera.graph.230", "cannot run on IPU -2");
  ops::virtualGraph(y, 1);
  CHECK(graph.op(y.node().producer).virtualGraph == 1);
}

TEST_CASE("an __ipu_number that is not a non-negative int is refused on import") {
  onnx::ModelProto model;
  REQUIRE(model.ParseFromString(test::readText(dataPath(kMlp.model))));
  for (const bool negative : {false, true}) {
    CAPTURE(negative);
    onnx::ModelProto copy = model;
    onnx::NodeProto* relu = nullptr;
    for (onnx::NodeProto& node : *copy.mutable_graph()->mutable_node())
      if (relu == nullptr && node.op_type() == "Relu") relu = &node;
    REQUIRE(relu != nullptr);
    onnx::AttributeProto* attribute = relu->add_attribute();
    attribute->set_name("__ipu_number");
    if (negative) {
      attribute->set_type(onnx::AttributeProto::INT);
      attribute->set_i(-1);
    } else {
      attribute->set_type(onnx::AttributeProto::FLOAT);
      attribute->set_f(1.5F);
    }
    const std::string bytes = copy.SerializeAsString();
    OnnxImportOptions options;
    options.dimensions = {{"batch", 2}};
    checkError<OnnxError>(
        [&] { (void)importOnnx(std::as_bytes(std::span(bytes.data(), bytes.size())), options, "mlp.onnx"); },
        "tessera.onnx.730",
        negative ? "attribute __ipu_number is -1; an IPU is numbered from 0" : "attribute __ipu_number must be an int");
  }
}

}  // namespace
}  // namespace tessera
