// Pipelining (SessionOptions::enablePipelining): the MLP, LeNet and GPT-block
// exports of tests/data/onnx and the transformer config, pipelined over 2
// and 4 IPUs, give the bits of the accumulation run without pipelining, also
// with replicas, RTS and OffChip optimizer state; the modelled step of
// uniform stages is the closed form of the fill and flush bubbles; each IPU
// counts its stashes; every recomputation type keeps the bits, and Pipeline
// recomputation stashes only the stage inputs; bad settings name the option
// and the rule.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "support/process.hpp"
#include "support/training_fixtures.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/app/profile.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/app/run_plan.hpp"
#include "tessera/sessions/session.hpp"
#include "tessera/app/trainer.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

using nlohmann::json;
using test::accumulation;
using test::with;

std::vector<std::string> pipelined(const std::string& mode, int64_t ipus) {
  return {"/sessionOptions/virtualGraphMode=" + mode, fmt::format("/device/ipusPerReplica={}", ipus),
          "/sessionOptions/enablePipelining=true"};
}

const std::vector<std::string> kReplicas2 = {"/sessionOptions/enableReplicatedGraphs=true",
                                             "/sessionOptions/replicatedGraphCount=2",
                                             "/sessionOptions/accumulationAndReplicationReductionType=Mean"};
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

RunConfig onnxConfig(const std::string& prefix, const std::string& model, const std::vector<std::string>& overrides) {
  return test::onnxTrainingConfig(prefix, model, prefix + "_pipeline.json", overrides);
}

// The pipelined runs over 2 and 4 IPUs give the losses and weights of the
// accumulation run (7 micro-batches: 2 x 4 - 1 pipeline stages over 4 IPUs).
void checkBitwise(const std::function<RunConfig(const std::vector<std::string>&)>& config, int64_t batch) {
  const std::vector<std::string> base = accumulation(7, batch);
  const TrainSummary plain = train(config(base));
  REQUIRE(plain.losses.size() == 2);
  for (const int64_t ipus : {2, 4}) {
    CAPTURE(ipus);
    const TrainSummary summary = train(config(with(base, pipelined("Auto", ipus))));
    CHECK(summary.losses == plain.losses);
    CHECK(summary.weights == plain.weights);
    const RunPlan plan = planRun(config(with(base, pipelined("Auto", ipus))));
    CHECK(plan.time.pipeline.enabled);
    // One stage per IPU that Auto gives ops (it may leave one without).
    const int64_t stages = plan.time.pipeline.forwardStages;
    CHECK(stages >= ipus - 1);
    CHECK(stages <= ipus);
    CHECK(plan.time.pipeline.stages == 2 * stages - 1);
    CHECK(plan.time.pipeline.microBatches == 7);
    CHECK(plan.time.pipeline.cycles == 7 + 2 * stages - 2);
    CHECK(plan.time.pipeline.bubbleFraction > 0.0);
    CHECK(plan.time.pipeline.bubbleFraction < 1.0);
    // The IPUs stash the activations their backward stages read.
    REQUIRE(plan.memory.perReplica.size() == static_cast<std::size_t>(ipus));
    int64_t stashed = 0;
    for (const ReplicaMemory& m : plan.memory.perReplica) stashed += m.stashBytes;
    CHECK(stashed > 0);
  }
  // The splits of a step over replicas, RTS and OffChip hold over 2 IPUs.
  const std::vector<std::string> split = with(accumulation(3, batch, 2), kReplicas2);
  for (const auto& more : {kRts, kOffChip}) {
    const TrainSummary reference = train(config(with(split, more)));
    const TrainSummary summary = train(config(with(with(split, more), pipelined("Auto", 2))));
    CHECK(summary.losses == reference.losses);
    CHECK(summary.weights == reference.weights);
  }
}

TEST_CASE("the MLP pipelined over 2 and 4 IPUs trains the bits of the accumulation run") {
  checkBitwise([](const std::vector<std::string>& o) { return onnxConfig("mlp", "mlp.onnx", o); }, 2);
}

// Every op of a weight on the last IPU (its accumulation, its update, its
// collectives) runs in that IPU's one stage, and the trace names only it.
TEST_CASE("on a 2-IPU pipelined MLP every op on IPU 1 runs in stage 1, with replicas and RTS too") {
  const std::vector<std::vector<std::string>> variants = {
      with(accumulation(3, 2), pipelined("Auto", 2)),
      with(with(with(accumulation(3, 2, 2), kReplicas2), kRts), pipelined("Auto", 2)),
      with(with(accumulation(3, 2), pipelined("Auto", 2)), {"/optimizer/type=Adam"})};
  for (const std::vector<std::string>& overrides : variants) {
    CAPTURE(fmt::format("{}", fmt::join(overrides, " ")));
    const RunPlan plan = planRun(onnxConfig("mlp", "mlp.onnx", overrides));
    REQUIRE(plan.time.pipeline.enabled);
    REQUIRE(plan.time.pipeline.forwardStages == 2);
    int64_t onLast = 0;
    for (const OpTime& op : plan.time.ops) {
      // A copy runs at the end of its producer's cycle: in the stage it copies from.
      if (op.kind == OpKind::IpuCopy || op.lane == TimeLane::HostIO) continue;
      const std::string& name = op.name;
      CAPTURE(name);
      if (op.ipu == 1) {
        ++onLast;
        CHECK(op.pipelineStage == 1);
      } else {
        CHECK((op.pipelineStage == 0 || op.pipelineStage == 2));
      }
    }
    CHECK(onLast > 0);
    std::vector<std::string> threads;
    const json trace = chromeTraceJson(plan.time);
    for (const json& e : trace.at("traceEvents"))
      if (e.value("name", "") == "thread_name") threads.push_back(e.at("args").at("name").get<std::string>());
    INFO("threads: ", json(threads).dump());
    CHECK(std::count(threads.begin(), threads.end(), "IPU 0 compute tiles: stages 0, 2") == 1);
    CHECK(std::count(threads.begin(), threads.end(), "IPU 1 compute tiles: stage 1") == 1);
  }
}

TEST_CASE("LeNet pipelined over 2 and 4 IPUs trains the bits of the accumulation run") {
  checkBitwise([](const std::vector<std::string>& o) { return onnxConfig("lenet", "lenet.onnx", o); }, 1);
}

TEST_CASE("the GPT block pipelined over 2 and 4 IPUs trains the bits of the accumulation run") {
  checkBitwise([](const std::vector<std::string>& o) { return onnxConfig("gpt", "gpt_block.onnx", o); }, 2);
}

TEST_CASE("the transformer config pipelined over 2 and 4 IPUs trains the bits of the accumulation run") {
  const test::TempDir folder;
  const std::string tokens = test::writeCountingTokens(folder.path(), 64, 6, 12);
  checkBitwise(
      [&](const std::vector<std::string>& overrides) {
        const json document = {{"model",
                                {{"type", "Transformer"},
                                 {"layers", 2},
                                 {"hidden", 16},
                                 {"heads", 2},
                                 {"vocab", 12},
                                 {"sequence", 6}}},
                               {"optimizer", {{"type", "Adam"}, {"learningRate", 0.02}}},
                               {"data",
                                {{"dataset", "Tensors"},
                                 {"path", tokens},
                                 {"batchSize", 8},
                                 {"epochs", 1},
                                 {"shuffle", false},
                                 {"seed", 4}}}};
        return parseRunConfig(document.dump(), "transformer_pipeline.json", overrides).config;
      },
      2);
}

// Every recomputation type keeps the bits of the accumulation run when
// pipelined, and its clones run in backward stages.
void checkRecomputation(const std::function<RunConfig(const std::vector<std::string>&)>& config, int64_t batch,
                        int64_t ipus) {
  const std::vector<std::string> base = accumulation(2 * ipus - 1, batch);
  const TrainSummary plain = train(config(base));
  for (const char* type : {"Standard", "NormOnly", "RecomputeAll", "Pipeline"}) {
    CAPTURE(type);
    const std::vector<std::string> overrides =
        with(with(base, pipelined("Auto", ipus)), {std::string("/sessionOptions/autoRecomputation=") + type});
    const TrainSummary summary = train(config(overrides));
    CHECK(summary.losses == plain.losses);
    CHECK(summary.weights == plain.weights);
  }
}

TEST_CASE("each recomputation type pipelined trains the bits of the accumulation run") {
  checkRecomputation([](const std::vector<std::string>& o) { return onnxConfig("gpt", "gpt_block.onnx", o); }, 2,
                     2);
  checkRecomputation([](const std::vector<std::string>& o) { return onnxConfig("lenet", "lenet.onnx", o); }, 1, 4);
}

// S stages of one [H, H] matmul and a Relu each (stage 0 after adding a
// trained bias, so that every stage computes its input's gradient; the Relu
// makes every gradient depend on the micro-batch).
struct Uniform {
  Graph graph;
  TensorId loss = kNoTensor;
};

Uniform uniformStages(int64_t stages, int64_t batch, int64_t hidden) {
  Uniform u;
  Graph& g = u.graph;
  const auto h = static_cast<std::size_t>(hidden);
  Tensor y = ops::input(g, "x", {batch, hidden});
  const Tensor bias = ops::variable(g, "bias", std::vector<float>(h, 0.0f), {hidden});
  y = ops::add(y, bias);
  ops::virtualGraph(y, 0);
  for (int64_t s = 0; s < stages; ++s) {
    std::vector<float> w(h * h, 0.0f);
    for (std::size_t i = 0; i < h; ++i) w[i * h + i] = 1.0f;
    y = ops::matmul(y, ops::variable(g, fmt::format("w{}", s), w, {hidden, hidden}));
    ops::virtualGraph(y, s);
    y = ops::relu(y);
    ops::virtualGraph(y, s);
  }
  const Tensor loss = ops::reduceMean(y);
  ops::virtualGraph(loss, stages - 1);
  u.loss = loss.id();
  return u;
}

TEST_CASE("the modelled pipelined step of uniform stages is the closed form of the fill and flush bubbles") {
  // Copies between IPUs cost nothing here, so that every cycle is its
  // compute: N + 2 S - 2 cycles, and with f and b the forward and backward
  // time of one stage, the forward cycles of the fill (S - 1 of them) take
  // f, the backward ones of the flush b, and the N + S - 1 others f + b
  // (the last IPU does both in the same cycle): T = (N + S - 1) (f + b).
  const int64_t batch = 128;
  const int64_t hidden = 256;
  for (const int64_t stages : {2, 4}) {
    for (const int64_t n : std::vector<int64_t>{2 * stages - 1, 16}) {
      CAPTURE(stages);
      CAPTURE(n);
      Uniform u = uniformStages(stages, batch, hidden);
      DeviceSpec spec;
      spec.ipusPerReplica = stages;
      spec.interIpuLatencySeconds = 0.0;
      spec.interIpuBandwidthBytesPerSecond = 1e30;
      SessionOptions options;
      options.virtualGraphMode = VirtualGraphMode::Manual;
      options.enablePipelining = true;
      options.enableGradientAccumulation = true;
      options.accumulationFactor = n;
      OptimizerConfig sgd;
      sgd.type = OptimizerType::Sgd;
      TrainingSession session(std::move(u.graph), u.loss, makeOptimizer(sgd), options, makeSimDevice(spec));
      const PipelineTime& p = session.modelledTime().pipeline;
      REQUIRE(p.enabled);
      CHECK(p.forwardStages == stages);
      CHECK(p.cycles == n + 2 * stages - 2);
      // One stage's work from the matmuls alone: 2 B H H forward, twice that
      // backward (the input's and the weight's gradients).
      const double f = 2.0 * batch * hidden * hidden / spec.computeFlopsPerSecond;
      const double b = 2.0 * f;
      const double closed = static_cast<double>(n + stages - 1) * (f + b);
      const double modelled = p.fillSeconds + p.mainSeconds + p.flushSeconds;
      MESSAGE(fmt::format("S {} N {}: modelled {:.6g} s, closed form {:.6g} s, bubble {:.4f} (closed form {:.4f})",
                          stages, n, modelled, closed, p.bubbleFraction,
                          static_cast<double>(stages - 1) / static_cast<double>(n + stages - 1)));
      CHECK(std::abs(modelled - closed) <= 0.01 * closed);
      CHECK(std::abs(p.bubbleFraction - static_cast<double>(stages - 1) / static_cast<double>(n + stages - 1)) <=
            0.01);
      // The fill is S - 1 forward cycles and S - 1 cycles of f + b.
      CHECK(std::abs(p.fillSeconds - (static_cast<double>(stages - 1) * (2 * f + b))) <= 0.01 * p.fillSeconds);
      // Every forward stage but the last stashes its matmul's input for
      // 2 (S - 1 - s) + 1 micro-batches.
      const MemoryReport& memory = session.memory();
      for (int64_t s = 0; s < stages; ++s) {
        const int64_t entries = s + 1 < stages ? 2 * (stages - 1 - s) + 1 : 0;
        CHECK(memory.perReplica.at(static_cast<std::size_t>(s)).stashBytes >= entries * batch * hidden * 4);
      }
    }
  }
}

TEST_CASE("Pipeline recomputation stashes only each stage's input and repeats its forward work backward") {
  const int64_t batch = 16;
  const int64_t hidden = 32;
  const int64_t stages = 3;
  const int64_t n = 2 * stages - 1;
  struct Run {
    MemoryReport memory;
    double stepSeconds = 0.0;
    std::vector<OpNode> recomputed;
    int64_t forwardStages = 0;
  };
  const auto run = [&](RecomputationType type) {
    Uniform u = uniformStages(stages, batch, hidden);
    DeviceSpec spec;
    spec.ipusPerReplica = stages;
    SessionOptions options;
    options.virtualGraphMode = VirtualGraphMode::Manual;
    options.enablePipelining = true;
    options.enableGradientAccumulation = true;
    options.accumulationFactor = n;
    options.autoRecomputation = type;
    OptimizerConfig sgd;
    sgd.type = OptimizerType::Sgd;
    TrainingSession session(std::move(u.graph), u.loss, makeOptimizer(sgd), options, makeSimDevice(spec));
    Run r;
    r.memory = session.memory();
    r.stepSeconds = session.modelledTime().stepSeconds;
    r.forwardStages = session.modelledTime().pipeline.forwardStages;
    for (const OpNode& op : session.graph().ops())
      if (op.recompute == RecomputeType::Recomputed) r.recomputed.push_back(op);
    return r;
  };
  const Run kept = run(RecomputationType::None);
  const Run pipeline = run(RecomputationType::Pipeline);
  REQUIRE(pipeline.forwardStages == stages);
  CHECK(kept.recomputed.empty());
  REQUIRE(!pipeline.recomputed.empty());
  // The clones run on their stage's IPU in its backward stage 2 (S - 1) - s.
  for (const OpNode& op : pipeline.recomputed) {
    CAPTURE(op.name);
    CHECK(op.virtualGraph < stages - 1);
    CHECK(op.pipelineStage == 2 * (stages - 1) - op.virtualGraph);
  }
  // Stages 1 .. S - 2 stash only their input (the copy from the stage
  // before) for 2 (S - 1 - s) + 1 micro-batches; the activations made in
  // the stage are no longer stashed.
  const int64_t sample = batch * hidden * 4;
  for (int64_t s = 0; s + 1 < stages; ++s) {
    CAPTURE(s);
    const int64_t withStash = kept.memory.perReplica.at(static_cast<std::size_t>(s)).stashBytes;
    const int64_t withRecompute = pipeline.memory.perReplica.at(static_cast<std::size_t>(s)).stashBytes;
    MESSAGE(fmt::format("IPU {}: stash {} B kept, {} B with Pipeline recomputation", s, withStash, withRecompute));
    CHECK(withRecompute < withStash);
    if (s > 0) CHECK(withRecompute == (2 * (stages - 1 - s) + 1) * sample);
  }
  CHECK(pipeline.memory.perReplica.back().stashBytes == kept.memory.perReplica.back().stashBytes);
  // The backward cycles repeat the forward work.
  CHECK(pipeline.stepSeconds > kept.stepSeconds);
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

TEST_CASE("bad pipelining settings name the option and the rule") {
  const auto mlp = [](const std::vector<std::string>& o) { return onnxConfig("mlp", "mlp.onnx", o); };
  checkError<ConfigError>([&] { (void)planRun(mlp(with(accumulation(3, 2), {"/sessionOptions/enablePipelining=true"}))); },
                          "tessera.config.195", "/sessionOptions/enablePipelining: enablePipelining is true but");
  checkError<ConfigError>(
      [&] { (void)planRun(mlp(with(accumulation(3, 2), with(pipelined("Auto", 1), {})))); }, "tessera.config.195",
      "needs virtualGraphMode Manual or Auto and ipusPerReplica >= 2");
  checkError<ConfigError>([&] { (void)planRun(mlp(with(accumulation(6, 2), pipelined("Auto", 4)))); },
                          "tessera.config.196",
                          "enablePipelining over 4 forward stages makes 7 pipeline stages (forward and backward), "
                          "but the accumulation factor is 6");
  checkError<ConfigError>([&] { (void)planRun(mlp(pipelined("Auto", 2))); }, "tessera.config.196",
                          "the accumulation factor is 1 (accumulation is off)");

  // Stages on hand-built graphs: a stage on two IPUs, a gap, IPU order,
  // some ops without a stage, a stage reading a later one.
  const auto session = [](const std::function<void(Graph&, Tensor&)>& build, int64_t lossIpu = 1,
                           int64_t lossStage = 1) {
    Graph g;
    Tensor y = ops::input(g, "x", {2, 4});
    build(g, y);
    const Tensor loss = ops::reduceMean(y);
    ops::virtualGraph(loss, lossIpu);
    ops::pipelineStage(loss, lossStage);
    DeviceSpec spec;
    spec.ipusPerReplica = 2;
    SessionOptions options;
    options.virtualGraphMode = VirtualGraphMode::Manual;
    options.enablePipelining = true;
    options.enableGradientAccumulation = true;
    options.accumulationFactor = 3;
    OptimizerConfig sgd;
    sgd.type = OptimizerType::Sgd;
    const TensorId id = loss.id();
    TrainingSession s(std::move(g), id, makeOptimizer(sgd), options, makeSimDevice(spec));
  };
  const auto layer = [](Graph& g, Tensor& y, const std::string& name, int64_t ipu, int64_t stage) {
    y = ops::matmul(y, ops::variable(g, name, std::vector<float>(16, 0.5f), {4, 4}));
    ops::virtualGraph(y, ipu);
    if (stage >= 0) ops::pipelineStage(y, stage);
  };
  checkError<ConfigError>(
      [&] { session([&](Graph& g, Tensor& y) { layer(g, y, "w0", 0, 0), layer(g, y, "w1", 1, 0); }); },
      "tessera.config.198", "pipeline stage 0 runs on IPU 0");
  checkError<ConfigError>(
      [&] { session([&](Graph& g, Tensor& y) { layer(g, y, "w0", 0, 0), layer(g, y, "w1", 1, 3); }, 1, 3); },
      "tessera.config.199", "they must be numbered 0, 1, ... without gaps (stage 1 is missing)");
  checkError<ConfigError>(
      [&] { session([&](Graph& g, Tensor& y) { layer(g, y, "w0", 1, 0), layer(g, y, "w1", 0, 1); }, 0, 1); },
      "tessera.config.199", "the stages must follow the order of their IPUs");
  checkError<ConfigError>(
      [&] { session([&](Graph& g, Tensor& y) { layer(g, y, "w0", 0, -1), layer(g, y, "w1", 1, 1); }); },
      "tessera.config.197", "either every op names its stage");
  checkError<GraphError>(
      [&] {
        session([&](Graph& g, Tensor& y) {
          layer(g, y, "w0", 1, 1);
          layer(g, y, "w1", 1, 0);
        });
      },
      "tessera.graph.251", "in the forward pass a stage reads only values of its own or earlier stages");
  Graph graph;
  const Tensor x = ops::input(graph, "x", {2});
  checkError<GraphError>([&] { ops::pipelineStage(ops::relu(x), -3); }, "tessera.graph.250",
                         "cannot be in pipeline stage -3");
}

}  // namespace
}  // namespace tessera
