// Host streams (overlapped IO): the settings change the modelled time and the
// IO tiles' memory, never the numbers; the modelled step follows the closed
// form of tessera/simdevice/time_model.hpp; bad settings are refused with their ids and
// overlap that cannot happen is a note.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "support/onnx_models.hpp"
#include "tessera/app/config_notes.hpp"
#include "tessera/sessions/data_flow.hpp"
#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer_options.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/app/profile.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/app/run_plan.hpp"
#include "tessera/sessions/session.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

std::unique_ptr<Optimizer> sgd() {
  OptimizerConfig config;
  config.sgd.learningRate = 0.05;
  config.sgd.momentum = 0.9;
  return makeOptimizer(config);
}

struct Setting {
  TileSet tileSet;
  ExchangeStrategy strategy;
};

// Two steps of two batches of `file` with every stream (inputs and the loss)
// on `setting`: the losses and the weights after them.
struct Outcome {
  std::vector<float> losses;
  std::vector<std::pair<std::string, HostTensor>> weights;
  TimeReport time;
};

Outcome train(const std::string& file, const Setting& setting) {
  OnnxImportOptions import;
  import.dimensions = {{"batch", 2}};
  OnnxModel probe = importOnnx(test::sourcePath("tests/data/onnx/" + file), import);
  for (const std::string& name : probe.inputs) import.inputSettings[name] = {setting.tileSet, setting.strategy};
  OnnxModel model = importOnnx(test::sourcePath("tests/data/onnx/" + file), import);
  SessionOptions options;
  options.numIOTiles = 64;
  const TensorId loss = model.graph.find("loss");
  TrainingSession session(
      model.graph, loss, sgd(), options, makeSimDevice(),
      DataFlow{2, {{"loss", {AnchorReturnTypeId::All, 0, setting.tileSet, setting.strategy}}}});
  Outcome out;
  for (uint32_t step = 0; step < 2; ++step) {
    std::vector<std::vector<float>> floats;
    std::vector<std::vector<int32_t>> ints;
    std::vector<StepInput> inputs;
    for (const std::string& name : model.inputs) {
      const auto count = static_cast<size_t>(numElements(session.inputHostShape(name)));
      const bool integer = model.graph.tensor(model.graph.find(name)).dtype == DType::Int32;
      floats.emplace_back();
      ints.emplace_back();
      for (size_t k = 0; k < count; ++k) {
        const uint32_t v = (static_cast<uint32_t>(k) * 2654435761u + step * 97u) >> 7;
        if (integer) {
          ints.back().push_back(static_cast<int32_t>(v % 4));
        } else {
          floats.back().push_back(static_cast<float>(v % 2048) / 1024.0f - 1.0f);
        }
      }
    }
    for (size_t i = 0; i < model.inputs.size(); ++i) {
      if (ints[i].empty()) {
        inputs.emplace_back(model.inputs[i], std::span<const float>(floats[i]));
      } else {
        inputs.emplace_back(model.inputs[i], std::span<const int32_t>(ints[i]));
      }
    }
    session.run(inputs);
    out.losses.insert(out.losses.end(), session.loss().data.begin(), session.loss().data.end());
  }
  out.weights = session.readWeights();
  out.time = session.modelledTime();
  return out;
}

TEST_CASE("the numbers are the same bits under every exchange strategy and tile set") {
  if (!onnxSupported()) return;
  const std::vector<Setting> settings = {{TileSet::IO, ExchangeStrategy::JustInTime},
                                         {TileSet::IO, ExchangeStrategy::OverlapInnerLoop},
                                         {TileSet::IO, ExchangeStrategy::OverlapLoops},
                                         {TileSet::Compute, ExchangeStrategy::OverlapLoops}};
  for (const std::string file : {"mlp.onnx", "lenet.onnx", "gpt_block.onnx"}) {
    CAPTURE(file);
    const Outcome reference = train(file, {TileSet::Compute, ExchangeStrategy::JustInTime});
    REQUIRE(reference.time.streams.size() >= 2);
    for (const Setting& setting : settings) {
      CAPTURE(toString(setting.tileSet));
      CAPTURE(toString(setting.strategy));
      const Outcome other = train(file, setting);
      CHECK(other.losses == reference.losses);
      CHECK(other.weights == reference.weights);
      // Only the time differs: overlap on the IO tiles hides transfers.
      const bool overlapped = setting.tileSet == TileSet::IO && overlaps(setting.strategy);
      for (const StreamTime& s : other.time.streams) CHECK(s.overlapped == overlapped);
      if (overlapped) {
        CHECK(other.time.stepSeconds < reference.time.stepSeconds);
      } else {
        CHECK(other.time.stepSeconds == doctest::Approx(reference.time.stepSeconds));
      }
    }
  }
}

// The IO-bound sample: a large batch of a small MLP.
LoadedRunConfig ioBound(const std::vector<std::string>& overrides = {}) {
  return loadRunConfig(test::sourcePath("samples/configs/io_bound.json"), overrides);
}

TEST_CASE("the modelled step of an IO-bound run follows the closed form") {
  const LoadedRunConfig base = ioBound();
  const RunConfig& config = base.config;
  const int64_t batch = config.data.batchSize;
  const int64_t batches = config.data.batchesPerStep;
  REQUIRE(batches > 1);
  REQUIRE(config.model.layers.front() == 784);
  // Bytes and transfers of a step: images [B, 784] and labels [B] float32
  // and int32, the loss (one float32) back; each transfer pays the latency.
  const double bandwidth = config.device.hostBandwidthBytesPerSecond;
  const double latency = config.device.hostLatencySeconds;
  const double images = static_cast<double>(batch * 784 * 4) / bandwidth + latency;
  const double labels = static_cast<double>(batch * 4) / bandwidth + latency;
  const double loss = 4.0 / bandwidth + latency;
  const double n = static_cast<double>(batches);

  const auto plan = [](const std::string& tileSet, const std::string& strategy) {
    const LoadedRunConfig loaded = ioBound({"/io/tileSet=" + tileSet, "/io/exchangeStrategy=" + strategy});
    validateForPlanning(loaded.config);
    return planRun(loaded.config).time;
  };
  const TimeReport justInTime = plan("Compute", "JustInTime");
  const double device = justInTime.deviceSeconds;
  REQUIRE(device > 0.0);
  // IO-bound: a batch's transfers take longer than its compute.
  CHECK(images + labels + loss > device);
  // JustInTime: every transfer on the critical path.
  const double serial = n * (device + images + labels + loss);
  CHECK(justInTime.runSeconds == doctest::Approx(serial).epsilon(0.01));
  CHECK(justInTime.stepSeconds == doctest::Approx(serial / n).epsilon(0.01));
  CHECK(justInTime.hostBytes == doctest::Approx(n * static_cast<double>(batch * 784 * 4 + batch * 4 + 4)));

  // OverlapInnerLoop without accumulation: the batch loop is the inner loop;
  // the first loads and the last store are exposed, the link bounds the rest.
  const TimeReport inner = plan("IO", "OverlapInnerLoop");
  const double overlapped = images + labels + device + (n - 1) * std::max(device, images + labels + loss) + loss;
  CHECK(inner.runSeconds == doctest::Approx(overlapped).epsilon(0.01));
  CHECK(inner.deviceSeconds == doctest::Approx(device));
  // OverlapLoops has no outer boundary to add here: the same step.
  CHECK(plan("IO", "OverlapLoops").runSeconds == doctest::Approx(overlapped).epsilon(0.01));
  // On the compute tiles an overlap strategy is JustInTime.
  CHECK(plan("Compute", "OverlapInnerLoop").runSeconds == doctest::Approx(serial).epsilon(0.01));
  CHECK(inner.runSeconds < 0.9 * justInTime.runSeconds);

  // The IO tiles hold two in-flight buffers of each overlapped stream.
  const LoadedRunConfig loaded = ioBound();
  const RunPlan io = planRun(loaded.config);
  const auto buffer = std::find_if(io.memory.tensors.begin(), io.memory.tensors.end(), [](const TensorMemory& t) {
    return t.name.find("host stream") != std::string::npos && t.bytes == 2 * 784 * 4 * 500;
  });
  CHECK(buffer != io.memory.tensors.end());
  CHECK(io.memory.perReplica.at(0).ioTilesBytes >= 2 * 784 * 4 * 500);
  // The trace has a host link lane.
  const nlohmann::json trace = chromeTraceJson(io.time);
  bool hostLane = false;
  for (const nlohmann::json& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == "host link") hostLane = true;
  CHECK(hostLane);
}

TEST_CASE("with accumulation, OverlapLoops also overlaps the batch boundaries") {
  const LoadedRunConfig loaded =
      ioBound({"/sessionOptions/enableGradientAccumulation=true", "/sessionOptions/accumulationFactor=2",
               "/data/batchSize=250", "/io/exchangeStrategy=OverlapInnerLoop"});
  const TimeReport inner = planRun(loaded.config).time;
  const LoadedRunConfig loops = ioBound({"/sessionOptions/enableGradientAccumulation=true",
                                         "/sessionOptions/accumulationFactor=2", "/data/batchSize=250",
                                         "/io/exchangeStrategy=OverlapLoops"});
  const TimeReport across = planRun(loops.config).time;
  CHECK(across.deviceSeconds == doctest::Approx(inner.deviceSeconds));
  CHECK(across.runSeconds < inner.runSeconds);
}

TEST_CASE("a graph builder input and an anchor carry PopART's settings into the model") {
  Graph graph;
  const Tensor x = ops::input(graph, "x", {4, 3}, DType::Float32, {TileSet::IO, ExchangeStrategy::OverlapInnerLoop});
  const Tensor labels = ops::input(graph, "labels", {4}, DType::Int32);
  const Tensor w = ops::variable(graph, "w", std::vector<float>(6, 0.25f), {3, 2});
  const Tensor loss = ops::softmaxCrossEntropy(ops::matmul(x, w), labels);
  const std::string lossName = graph.tensor(loss.id()).name;
  SessionOptions options;
  options.numIOTiles = 32;
  TrainingSession session(graph, loss.id(), sgd(), options, makeSimDevice(),
                          DataFlow{3, {{lossName, {AnchorReturnTypeId::All, 0, TileSet::IO,
                                                   ExchangeStrategy::OverlapLoops}}}});
  const TimeReport& time = session.modelledTime();
  REQUIRE(time.streams.size() == 3);
  CHECK(time.batchesPerStep == 3);
  CHECK(time.streams[0].name == "x");
  CHECK(time.streams[0].applied == ExchangeStrategy::OverlapInnerLoop);
  CHECK(time.streams[0].overlapped);
  CHECK(time.streams[0].bytesPerStep == doctest::Approx(3 * 4 * 3 * 4));
  CHECK(time.streams[1].name == "labels");
  CHECK(time.streams[1].applied == ExchangeStrategy::JustInTime);
  CHECK_FALSE(time.streams[1].overlapped);
  CHECK(time.streams[2].name == lossName);
  CHECK_FALSE(time.streams[2].input);
  CHECK(time.streams[2].applied == ExchangeStrategy::OverlapLoops);
  CHECK(time.hostSeconds > 0.0);
  CHECK(std::count_if(time.ops.begin(), time.ops.end(),
                      [](const OpTime& op) { return op.lane == TimeLane::HostIO; }) == 3);

  // IO without IO tiles: the device refuses the program.
  SessionOptions none;
  TESSERA_CHECK_ERROR(TrainingSession(graph, loss.id(), sgd(), none, makeSimDevice()), DeviceError,
                      ErrorCode::InvalidHostStream);
}

// A small classifier whose first product runs on IPU 0 and the rest on
// IPU 1 (Manual placement) when `ipus` is 2, with x, the labels and the loss
// overlapped on the IO tiles when `io`.
struct TwoIpuRun {
  std::vector<float> losses;
  std::vector<std::pair<std::string, HostTensor>> weights;
  TimeReport time;
  MemoryReport memory;
};

TwoIpuRun trainOnIpus(int64_t ipus, bool io) {
  constexpr int64_t kBatch = 4;
  const InputSettings overlapped{TileSet::IO, ExchangeStrategy::OverlapInnerLoop};
  Graph graph;
  const Tensor x = ops::input(graph, "x", {kBatch, 3}, DType::Float32, io ? overlapped : InputSettings{});
  const Tensor labels =
      ops::input(graph, "labels", {kBatch}, DType::Int32, io ? overlapped : InputSettings{});
  std::vector<float> w0(3 * 5), w1(5 * 2);
  for (std::size_t i = 0; i < w0.size(); ++i) w0[i] = static_cast<float>(static_cast<int>(i % 7) - 3) / 8.0f;
  for (std::size_t i = 0; i < w1.size(); ++i) w1[i] = static_cast<float>(static_cast<int>(i % 5) - 2) / 4.0f;
  const Tensor hidden = ops::matmul(x, ops::variable(graph, "w0", w0, {3, 5}));
  const Tensor activated = ops::relu(hidden);
  const Tensor logits = ops::matmul(activated, ops::variable(graph, "w1", w1, {5, 2}));
  const Tensor loss = ops::softmaxCrossEntropy(logits, labels);
  if (ipus > 1) {
    for (const Tensor& t : {hidden, activated}) ops::virtualGraph(t, 0);
    for (const Tensor& t : {logits, loss}) ops::virtualGraph(t, 1);
  }
  const std::string lossName = graph.tensor(loss.id()).name;
  SessionOptions options;
  DeviceSpec spec;
  spec.ipusPerReplica = ipus;
  if (ipus > 1) options.virtualGraphMode = VirtualGraphMode::Manual;
  if (io) options.numIOTiles = 32;
  const AnchorReturnType returned =
      io ? AnchorReturnType{AnchorReturnTypeId::All, 0, TileSet::IO, ExchangeStrategy::OverlapInnerLoop}
         : AnchorReturnType::all();
  TrainingSession session(graph, loss.id(), sgd(), options, makeSimDevice(spec),
                          DataFlow{3, {{lossName, returned}}});
  TwoIpuRun out;
  for (uint32_t step = 0; step < 2; ++step) {
    std::vector<float> images(static_cast<std::size_t>(numElements(session.inputHostShape("x"))));
    std::vector<int32_t> classes(static_cast<std::size_t>(numElements(session.inputHostShape("labels"))));
    for (std::size_t k = 0; k < images.size(); ++k)
      images[k] = static_cast<float>(((k * 2654435761u + step * 97u) >> 7) % 2048) / 1024.0f - 1.0f;
    for (std::size_t k = 0; k < classes.size(); ++k) classes[k] = static_cast<int32_t>((k + step) % 2);
    session.run({StepInput("x", std::span<const float>(images)),
                 StepInput("labels", std::span<const int32_t>(classes))});
    out.losses.insert(out.losses.end(), session.loss().data.begin(), session.loss().data.end());
  }
  out.weights = session.readWeights();
  out.time = session.modelledTime();
  out.memory = session.memory();
  return out;
}

TEST_CASE("on two IPUs a stream lands on the IPU that consumes or produces it") {
  const TwoIpuRun reference = trainOnIpus(1, false);
  const TwoIpuRun split = trainOnIpus(2, true);
  // The same bits as one IPU without host stream settings.
  CHECK(split.losses == reference.losses);
  CHECK(split.weights == reference.weights);

  // x is read by the product on IPU 0; the labels by the loss on IPU 1,
  // which produces the loss.
  const TimeReport& time = split.time;
  REQUIRE(time.streams.size() == 3);
  CHECK(time.streams[0].name == "x");
  CHECK(time.streams[0].ipu == 0);
  CHECK(time.streams[1].name == "labels");
  CHECK(time.streams[1].ipu == 1);
  CHECK_FALSE(time.streams[2].input);
  CHECK(time.streams[2].ipu == 1);
  for (const StreamTime& s : time.streams) {
    CHECK(s.applied == ExchangeStrategy::OverlapInnerLoop);
    CHECK(s.overlapped);
  }
  for (const OpTime& op : time.ops) {
    if (op.lane != TimeLane::HostIO) continue;
    CHECK(op.ipu == (op.name == "HostLoad x" ? 0 : 1));
  }

  // Each stream's two in-flight buffers on the IO tiles of its IPU.
  const auto ipuOf = [&](const std::string& stream) {
    for (const TensorMemory& t : split.memory.tensors)
      if (t.name.rfind("host stream " + stream + " ", 0) == 0) return t.ipu;
    return int64_t{-1};
  };
  CHECK(ipuOf("x") == 0);
  CHECK(ipuOf("labels") == 1);
  CHECK(ipuOf(time.streams[2].name) == 1);
  REQUIRE(split.memory.perReplica.size() == 2);
  CHECK(split.memory.perReplica[0].ioTilesBytes >= 2 * 4 * 3 * 4);
  CHECK(split.memory.perReplica[1].ioTilesBytes >= 2 * 4 * 4 + 2 * 4);

  // The closed form per IPU (N = 3 batches, A = 1, nothing JustInTime), each
  // IPU's host link carrying its own streams; the step waits for the slower.
  const double n = 3.0;
  const double c = time.deviceSeconds;
  REQUIRE(c > 0.0);
  const double x = time.streams[0].seconds / n;
  const double in1 = time.streams[1].seconds / n;
  const double out1 = time.streams[2].seconds / n;
  const double ipu0 = x + c + (n - 1) * std::max(c, x);
  const double ipu1 = in1 + c + (n - 1) * std::max(c, in1 + out1) + out1;
  CHECK(time.runSeconds == doctest::Approx(std::max(ipu0, ipu1)));
  CHECK(time.stepSeconds == doctest::Approx(std::max(ipu0, ipu1) / n));
  // One shared link would have taken longer.
  const double shared = x + in1 + c + (n - 1) * std::max(c, x + in1 + out1) + out1;
  CHECK(time.runSeconds < shared);
  // The trace has a host link per IPU.
  const nlohmann::json trace = chromeTraceJson(time);
  int hostLanes = 0;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      const std::string label = e["args"]["name"];
      if (label == "host link IPU 0" || label == "host link IPU 1") ++hostLanes;
    }
  }
  CHECK(hostLanes == 2);
}

TEST_CASE("bad host stream settings are refused with their ids") {
  // A stream the model does not have, with the closest name.
  {
    const LoadedRunConfig loaded = ioBound({R"(/io/streams/lables={"exchangeStrategy": "JustInTime"})"});
    bool threw = false;
    try {
      (void)planRun(loaded.config);
    } catch (const ConfigError& e) {
      threw = true;
      CHECK(e.code() == ErrorCode::UnknownHostStream);
      CHECK(std::string(e.what()).find("did you mean \"labels\"") != std::string::npos);
    }
    CHECK(threw);
  }
  // The IO tile set without IO tiles.
  TESSERA_CHECK_ERROR(validate(ioBound({"/sessionOptions/numIOTiles=0"}).config), ConfigError,
                      ErrorCode::HostStreamIOTilesWithoutIOTiles);
  TESSERA_CHECK_ERROR(
      validate(ioBound({"/sessionOptions/numIOTiles=0", "/io/tileSet=Compute", "/io/streams/labels/tileSet=IO"})
                   .config),
      ConfigError, ErrorCode::HostStreamIOTilesWithoutIOTiles);
  // OverlapStep: declared by PopART, not supported.
  TESSERA_CHECK_ERROR(ioBound({"/io/exchangeStrategy=OverlapStep"}), ConfigError,
                      ErrorCode::UnsupportedExchangeStrategy);
  // A strategy PopART does not have.
  TESSERA_CHECK_ERROR(ioBound({"/io/streams/labels/exchangeStrategy=OverlapEverything"}), ConfigError,
                      ErrorCode::InvalidEnumValue);
  // ONNX import: settings for an input the graph does not have.
  if (onnxSupported()) {
    OnnxImportOptions import;
    import.dimensions = {{"batch", 2}};
    import.inputSettings["nope"] = {TileSet::IO, ExchangeStrategy::OverlapInnerLoop};
    TESSERA_CHECK_ERROR(importOnnx(test::sourcePath("tests/data/onnx/mlp.onnx"), import), GraphError,
                        ErrorCode::InvalidInputSettings);
  }
}

TEST_CASE("a stream entry inherits the io defaults it leaves out") {
  const LoadedRunConfig loaded = ioBound({R"(/io/streams/labels={"exchangeStrategy": "JustInTime"})"});
  CHECK(loaded.config.io.of("labels").tileSet == TileSet::IO);
  CHECK(loaded.config.io.of("labels").exchangeStrategy == ExchangeStrategy::JustInTime);
  CHECK(loaded.config.io.of("input").exchangeStrategy == ExchangeStrategy::OverlapInnerLoop);
}

std::vector<NoteCode> notesOf(const RunConfig& config) {
  std::vector<NoteCode> codes;
  for (const ConfigNote& note : configNotes(config)) codes.push_back(note.code);
  return codes;
}

TEST_CASE("overlap that cannot happen, and a stream and a location on different tiles, are notes") {
  CHECK(notesOf(ioBound().config).empty());
  CHECK(notesOf(ioBound({"/io/tileSet=Compute"}).config) == std::vector<NoteCode>{NoteCode::OverlapOnComputeTiles});
  CHECK(notesOf(ioBound({"/data/batchesPerStep=1"}).config) ==
        std::vector<NoteCode>{NoteCode::OverlapWithoutIterations});
  CHECK(notesOf(ioBound({"/data/batchesPerStep=1", "/io/exchangeStrategy=OverlapLoops",
                         "/sessionOptions/enableGradientAccumulation=true", "/sessionOptions/accumulationFactor=2"})
                    .config) == std::vector<NoteCode>{NoteCode::OverlapWithoutIterations});
  CHECK(notesOf(ioBound({"/io/tileSet=Compute", "/io/exchangeStrategy=JustInTime",
                         "/sessionOptions/activationTensorLocationSettings/location/loadTileSet=IO"})
                    .config) == std::vector<NoteCode>{NoteCode::StreamTileSetDiffersFromLocation});
}

}  // namespace
}  // namespace tessera
