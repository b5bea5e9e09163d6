// Phased execution (virtualGraphMode ExecutionPhases,
// executionPhaseSettings): the MLP, LeNet and GPT-block exports of
// tests/data/onnx and the transformer config, run in phases on one IPU
// (stages 1) and ping-ponged over two (stages 2), give the bits of the run
// without phases, also with weights and activations OffChip; each IPU holds
// only what its phases load; the time model reports each phase's streaming;
// bad settings name the option and the rule.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/process.hpp"
#include "support/training_fixtures.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/placement.hpp"
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

std::vector<std::string> phased(int64_t phases, int64_t stages) {
  return {"/sessionOptions/virtualGraphMode=ExecutionPhases",
          fmt::format("/device/ipusPerReplica={}", stages),
          fmt::format("/sessionOptions/executionPhaseSettings/phases={}", phases),
          fmt::format("/sessionOptions/executionPhaseSettings/stages={}", stages)};
}

// Weights and activations in streaming memory, loaded through the IO tiles.
const std::vector<std::string> kOffChip = {
    "/sessionOptions/numIOTiles=32",
    "/sessionOptions/weightTensorLocationSettings/location/storage=OffChip",
    "/sessionOptions/weightTensorLocationSettings/location/loadTileSet=IO",
    "/sessionOptions/weightTensorLocationSettings/minElementsForOffChip=0",
    "/sessionOptions/activationTensorLocationSettings/location/storage=OffChip",
    "/sessionOptions/activationTensorLocationSettings/location/loadTileSet=IO",
    "/sessionOptions/activationTensorLocationSettings/minElementsForOffChip=0"};

RunConfig onnxConfig(const std::string& prefix, const std::string& model,
                     const std::vector<std::string>& overrides) {
  return test::onnxTrainingConfig(prefix, model, prefix + "_phases.json", overrides);
}

int64_t loads(const TimeReport& time) {
  int64_t n = 0;
  for (const OpTime& op : time.ops) n += op.kind == OpKind::RemoteLoad ? 1 : 0;
  return n;
}

// Phases on one IPU and over two give the losses and weights of the run
// without phases, on chip and with weights and activations OffChip.
void checkBitwise(const std::function<RunConfig(const std::vector<std::string>&)>& config, int64_t batch) {
  const std::vector<std::string> base = accumulation(2, batch);
  const TrainSummary plain = train(config(base));
  REQUIRE(plain.losses.size() == 2);
  for (const int64_t stages : {1, 2}) {
    for (const auto& more : {std::vector<std::string>{}, kOffChip}) {
      CAPTURE(stages);
      CAPTURE(more.size());
      const std::vector<std::string> overrides = with(with(base, phased(3, stages)), more);
      const TrainSummary summary = train(config(overrides));
      CHECK(summary.losses == plain.losses);
      CHECK(summary.weights == plain.weights);
      const RunPlan plan = planRun(config(overrides));
      // 3 forward phases and their 2 x 3 - 1 = 5 phases with the backward.
      CHECK(plan.time.phases.size() == 5);
      REQUIRE(plan.memory.perReplica.size() == static_cast<std::size_t>(stages));
      for (const PhaseTime& p : plan.time.phases) CHECK(p.ipu == p.phase % stages);
      if (more.empty()) continue;
      // Every phase streams: weights in, activations out in the forward
      // phases and back in in the backward ones.
      double loaded = 0.0;
      for (const PhaseTime& p : plan.time.phases) loaded += p.loadBytes;
      CHECK(loaded > 0.0);
      CHECK(plan.time.phases.front().storeBytes > 0.0);
      CHECK(plan.time.phases.back().loadBytes > 0.0);
    }
  }
}

TEST_CASE("the MLP in phases on one and two IPUs trains the bits of the run without phases") {
  checkBitwise([](const std::vector<std::string>& o) { return onnxConfig("mlp", "mlp.onnx", o); }, 2);
}

TEST_CASE("LeNet in phases on one and two IPUs trains the bits of the run without phases") {
  checkBitwise([](const std::vector<std::string>& o) { return onnxConfig("lenet", "lenet.onnx", o); }, 1);
}

TEST_CASE("the GPT block in phases on one and two IPUs trains the bits of the run without phases") {
  checkBitwise([](const std::vector<std::string>& o) { return onnxConfig("gpt", "gpt_block.onnx", o); }, 2);
}

TEST_CASE("recomputation in phases keeps the bits and runs the clones in the backward phases") {
  const auto gpt = [](const std::vector<std::string>& o) { return onnxConfig("gpt", "gpt_block.onnx", o); };
  const std::vector<std::string> base = accumulation(2, 2);
  const TrainSummary plain = train(gpt(base));
  for (const char* type : {"Standard", "RecomputeAll", "NormOnly"}) {
    CAPTURE(type);
    const std::vector<std::string> overrides =
        with(with(base, phased(3, 2)), {std::string("/sessionOptions/autoRecomputation=") + type});
    const TrainSummary summary = train(gpt(overrides));
    CHECK(summary.losses == plain.losses);
    CHECK(summary.weights == plain.weights);
    // The clones run in the backward phases (2 .. 4 of 3 forward phases),
    // each on the IPU of its phase.
    const RunPlan plan = planRun(gpt(overrides));
    int64_t clones = 0;
    for (const OpTime& op : plan.time.ops) {
      // (A copy of a clone to another phase's IPU runs where it copies to.)
      if (op.name.find(".recomputed") == std::string::npos || op.kind == OpKind::IpuCopy) continue;
      CAPTURE(op.name);
      ++clones;
      CHECK(op.executionPhase >= 2);
      CHECK(op.ipu == op.executionPhase % 2);
    }
    // (RecomputeAll keeps the segment ending at the loss, here everything;
    // the block's layer norms are exported as elementwise ops, so NormOnly
    // finds none.)
    if (std::string(type) == "Standard") CHECK(clones > 0);
  }
}

RunConfig transformerConfig(const std::string& tokens, const std::vector<std::string>& overrides) {
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
  return parseRunConfig(document.dump(), "transformer_phases.json", overrides).config;
}

TEST_CASE("the transformer config in phases on one and two IPUs trains the bits of the run without phases") {
  const test::TempDir folder;
  const std::string tokens = test::writeCountingTokens(folder.path(), 64, 6, 12);
  checkBitwise([&](const std::vector<std::string>& o) { return transformerConfig(tokens, o); }, 2);
}

TEST_CASE("phases hold on chip only what they load, and Preload hides the loads that OnDemand waits for") {
  const test::TempDir folder;
  const std::string tokens = test::writeCountingTokens(folder.path(), 64, 6, 12);
  const std::vector<std::string> base = with(accumulation(1, 8), kOffChip);
  const RunPlan plain = planRun(transformerConfig(tokens, base));
  const RunPlan preload = planRun(transformerConfig(tokens, with(base, phased(4, 1))));
  const RunPlan onDemand = planRun(transformerConfig(
      tokens, with(with(base, phased(4, 1)),
                   {"/sessionOptions/executionPhaseSettings/weightIOSchedule=OnDemand",
                    "/sessionOptions/executionPhaseSettings/activationIOSchedule=OnDemand"})));
  // The run without phases loads each OffChip weight once for the step and
  // keeps it until its update; phases load it for each phase that reads it.
  CHECK(loads(preload.time) > loads(plain.time));
  CHECK(preload.memory.perReplica.at(0).computeTilesBytes < plain.memory.perReplica.at(0).computeTilesBytes);
  CHECK(onDemand.memory.perReplica.at(0).computeTilesBytes ==
        preload.memory.perReplica.at(0).computeTilesBytes);
  CHECK(preload.time.stepSeconds < onDemand.time.stepSeconds);
  MESSAGE(fmt::format("peak {} B without phases, {} B in 4 phases; step {:.4g} s Preload, {:.4g} s OnDemand",
                      plain.memory.perReplica.at(0).computeTilesBytes,
                      preload.memory.perReplica.at(0).computeTilesBytes, preload.time.stepSeconds,
                      onDemand.time.stepSeconds));
  // An OnDemand load of phase p starts after the ops of phase p - 1 before
  // it (the weight updates after the phases take their weights' phases).
  std::vector<double> ends(onDemand.time.phases.size(), 0.0);
  int64_t checked = 0;
  for (const OpTime& op : onDemand.time.ops) {
    if (op.executionPhase < 0) continue;
    const auto phase = static_cast<std::size_t>(op.executionPhase);
    if (op.kind == OpKind::RemoteLoad && phase > 0) {
      CHECK(op.start >= ends.at(phase - 1) - 1e-12);
      ++checked;
    }
    if (op.kind != OpKind::RemoteLoad && op.kind != OpKind::RemoteStore)
      ends.at(phase) = std::max(ends.at(phase), op.start + op.duration);
  }
  CHECK(checked > 0);
}

// A residual MLP of three phases: the skip connection `skip` = x Ws, made
// in phase 0, is read only by the Add of phase 2, past the wide layer of
// phase 1 (the Add's gradient does not read it, so only the forward pass
// keeps it). Without `phases` no op names one.
TensorId residualMlp(Graph& g, bool phases) {
  const auto values = [](int64_t n, float scale) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = scale * static_cast<float>((i * 7) % 11 - 5);
    return v;
  };
  const auto at = [phases](Tensor t, int64_t phase) {
    if (phases) ops::executionPhase(t, phase);
    return t;
  };
  const Tensor x = ops::input(g, "x", {4, 8});
  const Tensor skip = at(ops::matmul(x, ops::variable(g, "ws", values(64, 0.05f), {8, 8})), 0);
  g.rename(skip.id(), "skip");
  Tensor h = at(ops::relu(at(ops::matmul(x, ops::variable(g, "w0", values(64, 0.04f), {8, 8})), 0)), 0);
  h = at(ops::relu(at(ops::matmul(h, ops::variable(g, "w1", values(8 * 256, 0.03f), {8, 256})), 1)), 1);
  h = at(ops::matmul(h, ops::variable(g, "w2", values(256 * 8, 0.02f), {256, 8})), 1);
  const Tensor y = at(ops::add(h, skip), 2);
  g.rename(y.id(), "y");
  return at(ops::reduceMean(at(ops::mul(y, y), 2)), 2).id();
}

constexpr int64_t kSkipBytes = 4 * 8 * 4;

SessionOptions residualOptions(bool phases, std::optional<TileSet> skipOffChipVia,
                               ExecutionPhaseIOSchedule schedule) {
  SessionOptions options;
  if (phases) {
    options.virtualGraphMode = VirtualGraphMode::ExecutionPhases;
    options.executionPhaseSettings.phases = 3;
    options.executionPhaseSettings.stages = 1;
    options.executionPhaseSettings.activationIOSchedule = schedule;
  }
  if (skipOffChipVia) {
    TensorLocation location(TensorStorage::OffChip);
    location.loadTileSet = *skipOffChipVia;
    options.tensorLocationSettingsOverride["skip"] = location;
    if (*skipOffChipVia == TileSet::IO) options.numIOTiles = 32;
  }
  return options;
}

DeviceSpec oneIpu() {
  DeviceSpec spec;
  spec.ipusPerReplica = 1;
  return spec;
}

TrainingSession residualTraining(bool phases, std::optional<TileSet> skipOffChipVia,
                                 ExecutionPhaseIOSchedule schedule = ExecutionPhaseIOSchedule::Preload) {
  Graph g;
  const TensorId loss = residualMlp(g, phases);
  OptimizerConfig sgd;
  sgd.type = OptimizerType::Sgd;
  sgd.sgd.learningRate = 0.1;
  return TrainingSession(std::move(g), loss, makeOptimizer(sgd), residualOptions(phases, skipOffChipVia, schedule),
                         makeSimDevice(oneIpu()));
}

InferenceSession residualInference(std::optional<TileSet> skipOffChipVia, ExecutionPhaseIOSchedule schedule) {
  Graph g;
  (void)residualMlp(g, true);
  return InferenceSession(std::move(g), std::vector<std::string>{"y"},
                          residualOptions(true, skipOffChipVia, schedule), makeSimDevice(oneIpu()));
}

const OpNode* producerNamed(const Graph& graph, const std::string& name) {
  const auto t = graph.tryFind(name);
  if (!t) return nullptr;
  const OpId producer = graph.tensor(*t).producer;
  return producer == kNoOp ? nullptr : &graph.op(producer);
}

int64_t remoteOps(const Graph& graph, OpKind kind) {
  int64_t n = 0;
  for (const OpNode& op : graph.ops()) n += op.kind == kind ? 1 : 0;
  return n;
}

TEST_CASE("an activation read by a later forward phase is stored after its phase and loaded for the reader") {
  const TrainingSession onChip = residualTraining(true, std::nullopt);
  CHECK(remoteOps(onChip.graph(), OpKind::RemoteLoad) == 0);
  CHECK(remoteOps(onChip.graph(), OpKind::RemoteStore) == 0);

  for (const auto schedule : {ExecutionPhaseIOSchedule::Preload, ExecutionPhaseIOSchedule::OnDemand}) {
    INFO("schedule ", static_cast<int>(schedule));
    const TrainingSession session = residualTraining(true, TileSet::Compute, schedule);
    const Graph& graph = session.graph();
    // One store of the skip in phase 0, one load of it in phase 2 (the
    // backward pass does not read it), which the forward Add reads.
    CHECK(remoteOps(graph, OpKind::RemoteStore) == 1);
    CHECK(remoteOps(graph, OpKind::RemoteLoad) == 1);
    const TensorId skip = graph.find("skip");
    int64_t stores = 0;
    for (OpId consumer : graph.tensor(skip).consumers) {
      if (graph.op(consumer).kind != OpKind::RemoteStore) continue;
      ++stores;
      CHECK(graph.op(consumer).executionPhase == 0);
    }
    CHECK(stores == 1);
    const OpNode* load = producerNamed(graph, "skip.load");
    REQUIRE(load != nullptr);
    CHECK(load->kind == OpKind::RemoteLoad);
    CHECK(load->executionPhase == 2);
    const TensorNode& loaded = graph.tensor(load->outputs[0]);
    REQUIRE(loaded.consumers.size() == 1);
    const OpNode& add = graph.op(loaded.consumers[0]);
    CHECK(add.kind == OpKind::Add);
    CHECK(add.executionPhase == 2);
    // Preload may load during phase 1 (after the ops of phase 0), OnDemand
    // only once phase 1 is over.
    REQUIRE(!load->after.empty());
    int64_t latest = -1;
    for (OpId before : load->after) latest = std::max(latest, graph.op(before).executionPhase);
    CHECK(latest == (schedule == ExecutionPhaseIOSchedule::Preload ? 0 : 1));
    // The time model counts the store in phase 0 and the load in phase 2.
    const TimeReport& time = session.modelledTime();
    REQUIRE(time.phases.size() == 5);
    CHECK(time.phases[0].storeBytes == doctest::Approx(kSkipBytes));
    CHECK(time.phases[2].loadBytes == doctest::Approx(kSkipBytes));
    CHECK(time.phases[1].loadBytes == 0.0);
  }
}

TEST_CASE("a residual MLP whose skip crosses phases OffChip trains the bits of the run without phases") {
  TrainingSession plain = residualTraining(false, std::nullopt);
  TrainingSession onChip = residualTraining(true, std::nullopt);
  TrainingSession preload = residualTraining(true, TileSet::IO);
  TrainingSession onDemand = residualTraining(true, TileSet::Compute, ExecutionPhaseIOSchedule::OnDemand);
  std::vector<float> x(32);
  for (std::size_t step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>((i * 5 + step * 3) % 9) - 0.4f;
    for (TrainingSession* s : {&plain, &onChip, &preload, &onDemand}) s->run({StepInput("x", x)});
    CAPTURE(step);
    CHECK(onChip.loss() == plain.loss());
    CHECK(preload.loss() == plain.loss());
    CHECK(onDemand.loss() == plain.loss());
  }
  CHECK(preload.readWeights() == plain.readWeights());
  CHECK(onDemand.readWeights() == plain.readWeights());
}

// Where the memory plan holds the load of `name`: the schedule positions
// of its first use and of the first op of `phase`.
struct LoadPlace {
  int64_t firstUse = -1;
  int64_t phaseStart = -1;
};

LoadPlace loadPlace(const InferenceSession& s, const std::string& name, int64_t phase) {
  LoadPlace place;
  for (const TensorMemory& m : s.memory().tensors)
    if (m.name == name) place.firstUse = m.firstUse;
  const std::vector<OpId> schedule = s.graph().schedule();
  for (std::size_t pos = 0; pos < schedule.size() && place.phaseStart < 0; ++pos)
    if (s.graph().op(schedule[pos]).executionPhase == phase) place.phaseStart = static_cast<int64_t>(pos);
  return place;
}

TEST_CASE("the memory plan holds a cross-phase activation only where its location and IO schedule say") {
  constexpr auto Preload = ExecutionPhaseIOSchedule::Preload;
  constexpr auto OnDemand = ExecutionPhaseIOSchedule::OnDemand;
  const auto peak = [](const InferenceSession& s, MemorySpace space) {
    return s.memory().perReplica.at(0).peak(space).bytes;
  };
  // The peak is the wide layer of phase 1, which the skip spans on chip.
  const InferenceSession onChip = residualInference(std::nullopt, Preload);
  const int64_t onChipPeak = peak(onChip, MemorySpace::ComputeTiles);
  // OffChip, loaded in phase 2 through the compute tiles (either schedule:
  // such a load hides nothing and runs at its place) or the IO tiles:
  // phase 1 holds it nowhere on the compute tiles.
  for (const auto via : {TileSet::Compute, TileSet::IO}) {
    for (const auto schedule : {Preload, OnDemand}) {
      INFO("via ", static_cast<int>(via), ", schedule ", static_cast<int>(schedule));
      CHECK(onChipPeak - peak(residualInference(via, schedule), MemorySpace::ComputeTiles) == kSkipBytes);
    }
  }
  // Through the IO tiles, a preload lands there during phase 1 (after the
  // ops of phase 0) and the IO tiles hold it from then; OnDemand it is
  // loaded once phase 1 is over.
  const InferenceSession preloadIo = residualInference(TileSet::IO, Preload);
  const LoadPlace preloaded = loadPlace(preloadIo, "skip.load", 1);
  CHECK(preloaded.firstUse >= 0);
  CHECK(preloaded.firstUse <= preloaded.phaseStart);
  CHECK(peak(preloadIo, MemorySpace::IOTiles) >= kSkipBytes);
  const InferenceSession onDemandIo = residualInference(TileSet::IO, OnDemand);
  const LoadPlace onDemand = loadPlace(onDemandIo, "skip.load", 2);
  CHECK(onDemand.firstUse >= onDemand.phaseStart);
  MESSAGE(fmt::format("compute-tiles peak {} B with the skip on chip, {} B OffChip; its preload held on the IO "
                      "tiles from position {} (phase 1 starts at {}), OnDemand from {} (phase 2 starts at {})",
                      onChipPeak, peak(preloadIo, MemorySpace::ComputeTiles), preloaded.firstUse,
                      preloaded.phaseStart, onDemand.firstUse, onDemand.phaseStart));
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

TEST_CASE("bad phase settings name the option and the rule") {
  const auto mlp = [](const std::vector<std::string>& o) { return onnxConfig("mlp", "mlp.onnx", o); };
  checkError<ConfigError>(
      [&] { (void)planRun(mlp({"/sessionOptions/executionPhaseSettings/phases=2"})); }, "tessera.config.192",
      "/sessionOptions/executionPhaseSettings/phases: executionPhaseSettings.phases is 2 but "
      "/sessionOptions/virtualGraphMode is Off");
  checkError<ConfigError>([&] { (void)planRun(mlp(with(phased(1, 2), {}))); }, "tessera.config.191",
                          "phased execution needs at least 2 phases");
  checkError<ConfigError>([&] { (void)planRun(mlp({"/sessionOptions/executionPhaseSettings/stages=3"})); },
                          "tessera.config.193", "/sessionOptions/executionPhaseSettings/stages");
  checkError<ConfigError>(
      [&] { (void)planRun(mlp(with(phased(2, 2), {"/device/ipusPerReplica=1"}))); }, "tessera.config.193",
      "executionPhaseSettings.stages is 2, so the phases take turns on 2 IPUs, but a replica has 1");
  checkError<ConfigError>(
      [&] {
        (void)planRun(
            mlp(with(with(accumulation(3, 2), phased(2, 2)), {"/sessionOptions/enablePipelining=true"})));
      },
      "tessera.config.194",
      "/sessionOptions/enablePipelining: enablePipelining is true with virtualGraphMode "
      "ExecutionPhases");
  // Phases on hand-built graphs: out of range, some ops without, a phase
  // reading a later one; a negative phase.
  const auto session = [](const std::function<void(Graph&, Tensor&)>& build) {
    Graph g;
    Tensor y = ops::input(g, "x", {2, 4});
    build(g, y);
    const Tensor loss = ops::reduceMean(y);
    ops::executionPhase(loss, 1);
    DeviceSpec spec;
    spec.ipusPerReplica = 2;
    SessionOptions options;
    options.virtualGraphMode = VirtualGraphMode::ExecutionPhases;
    options.executionPhaseSettings.phases = 2;
    OptimizerConfig sgd;
    sgd.type = OptimizerType::Sgd;
    const TensorId id = loss.id();
    TrainingSession s(std::move(g), id, makeOptimizer(sgd), options, makeSimDevice(spec));
  };
  const auto layer = [](Graph& g, Tensor& y, const std::string& name, int64_t phase) {
    y = ops::matmul(y, ops::variable(g, name, std::vector<float>(16, 0.5f), {4, 4}));
    if (phase >= 0) ops::executionPhase(y, phase);
  };
  session([&](Graph& g, Tensor& y) { layer(g, y, "w0", 0), layer(g, y, "w1", 1); });
  checkError<GraphError>(
      [&] { session([&](Graph& g, Tensor& y) { layer(g, y, "w0", 0), layer(g, y, "w1", 2); }); },
      "tessera.graph.253",
      "is in execution phase 2 (its __execution_phase / executionPhase), "
      "but /sessionOptions/executionPhaseSettings/phases is 2");
  checkError<GraphError>(
      [&] { session([&](Graph& g, Tensor& y) { layer(g, y, "w0", 0), layer(g, y, "w1", -1); }); },
      "tessera.graph.254", "either every forward op names its phase");
  checkError<GraphError>(
      [&] { session([&](Graph& g, Tensor& y) { layer(g, y, "w0", 1), layer(g, y, "w1", 0); }); },
      "tessera.graph.255", "made in the later phase 1");
  checkError<GraphError>([&] { session([&](Graph&, Tensor& y) { ops::executionPhase(y, -3); }); },
                         "tessera.graph.252", "cannot be in execution phase -3");
}

}  // namespace
}  // namespace tessera
