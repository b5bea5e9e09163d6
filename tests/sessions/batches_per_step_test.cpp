// Batches per step (DataFlow): one run() of batchesPerStep batches trains
// exactly as that many one-batch run() calls, bit for bit, for the MLP, LeNet
// and GPT-block exports of tests/data/onnx, with accumulation and replicas;
// the anchors' return types shape and pick what comes back; bad data flows
// are refused with their ids.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/onnx_models.hpp"
#include "tessera/sessions/data_flow.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/optimizers/optimizer_options.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/sessions/session.hpp"
#include "tessera/app/trainer.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

struct Split {
  int64_t accumulation;
  int64_t replicas;
  int64_t microBatch;
};

SessionOptions optionsFor(const Split& split) {
  SessionOptions options;
  options.enableReplicatedGraphs = split.replicas > 1;
  options.replicatedGraphCount = split.replicas;
  options.enableGradientAccumulation = split.accumulation > 1;
  options.accumulationFactor = split.accumulation;
  return options;
}

std::unique_ptr<Optimizer> adam() {
  // Adam's bias correction depends on the step: a batch out of order shows.
  OptimizerConfig config;
  config.type = OptimizerType::Adam;
  config.adam.learningRate = 0.01;
  return makeOptimizer(config);
}

// Deterministic step data for every input of `model`, `batches` batches in
// front of each input's one-batch host shape: floats in [-1, 1), integers
// (labels, tokens) in [0, 4).
struct StepData {
  std::vector<std::string> names;
  std::vector<std::vector<float>> floats;
  std::vector<std::vector<int32_t>> ints;

  std::vector<StepInput> inputs() const {
    std::vector<StepInput> out;
    for (size_t i = 0; i < names.size(); ++i) {
      if (ints[i].empty()) {
        out.emplace_back(names[i], std::span<const float>(floats[i]));
      } else {
        out.emplace_back(names[i], std::span<const int32_t>(ints[i]));
      }
    }
    return out;
  }
  // The one-batch inputs of batch b of `batches`.
  std::vector<StepInput> batch(int64_t b, int64_t batches) const {
    std::vector<StepInput> out;
    for (size_t i = 0; i < names.size(); ++i) {
      if (ints[i].empty()) {
        const size_t n = floats[i].size() / static_cast<size_t>(batches);
        out.emplace_back(names[i], std::span<const float>(floats[i]).subspan(static_cast<size_t>(b) * n, n));
      } else {
        const size_t n = ints[i].size() / static_cast<size_t>(batches);
        out.emplace_back(names[i], std::span<const int32_t>(ints[i]).subspan(static_cast<size_t>(b) * n, n));
      }
    }
    return out;
  }
};

StepData makeData(const OnnxModel& model, const TrainingSession& oneBatch, int64_t batches, uint32_t seed) {
  StepData data;
  uint32_t state = seed * 2654435761u + 1u;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  for (const std::string& name : model.inputs) {
    const Shape shape = oneBatch.inputHostShape(name);
    const auto count = static_cast<size_t>(numElements(shape) * batches);
    data.names.push_back(name);
    const DType dtype = model.graph.tensor(model.graph.find(name)).dtype;
    std::vector<float> floats;
    std::vector<int32_t> ints;
    for (size_t k = 0; k < count; ++k) {
      if (dtype == DType::Int32) {
        ints.push_back(static_cast<int32_t>(next() % 4));
      } else {
        floats.push_back(static_cast<float>(next() % 2048) / 1024.0f - 1.0f);
      }
    }
    data.floats.push_back(std::move(floats));
    data.ints.push_back(std::move(ints));
  }
  return data;
}

bool sameWeights(const TrainingSession& a, const TrainingSession& b) {
  const auto wa = a.readWeights();
  const auto wb = b.readWeights();
  if (wa.size() != wb.size()) return false;
  for (size_t i = 0; i < wa.size(); ++i) {
    if (wa[i].first != wb[i].first || wa[i].second.data != wb[i].second.data) return false;
  }
  return true;
}

void checkBitwise(const std::string& file, const Split& split, int64_t batches) {
  CAPTURE(file);
  CAPTURE(split.accumulation);
  CAPTURE(split.replicas);
  CAPTURE(batches);
  OnnxModel separateModel = test::importWithBatch(file, split.microBatch, split.replicas);
  OnnxModel stepModel = test::importWithBatch(file, split.microBatch, split.replicas);
  const TensorId separateLoss = separateModel.graph.find("loss");
  const TensorId stepLoss = stepModel.graph.find("loss");
  TrainingSession separate(separateModel.graph, separateLoss, adam(), optionsFor(split), makeSimDevice());
  TrainingSession step(stepModel.graph, stepLoss, adam(), optionsFor(split), makeSimDevice(),
                       DataFlow{batches, {{"loss", AnchorReturnType::all()}}});
  for (const std::string& name : stepModel.inputs) {
    Shape want = separate.inputHostShape(name);
    want.insert(want.begin(), batches);
    CHECK(step.inputHostShape(name) == want);
  }
  for (int64_t s = 0; s < 2; ++s) {
    const StepData data = makeData(separateModel, separate, batches, static_cast<uint32_t>(s + 1));
    std::vector<float> losses;
    std::vector<double> means;
    for (int64_t b = 0; b < batches; ++b) {
      separate.run(data.batch(b, batches));
      losses.insert(losses.end(), separate.loss().data.begin(), separate.loss().data.end());
      means.push_back(separate.meanLoss());
    }
    step.run(data.inputs());
    Shape lossShape = separate.loss().shape;
    lossShape.insert(lossShape.begin(), batches);
    CHECK(step.loss().shape == lossShape);
    CHECK(step.loss().data == losses);
    CHECK(step.batchMeanLosses() == means);
    CHECK(step.meanLoss() == means.back());
    CHECK(step.step() == separate.step());
    CHECK(sameWeights(step, separate));
  }
}

TEST_CASE("one run of batchesPerStep batches trains as that many runs, bit for bit") {
  if (!onnxSupported()) return;
  for (const std::string file : {"mlp.onnx", "lenet.onnx", "gpt_block.onnx"}) {
    checkBitwise(file, {1, 1, 4}, 3);
    checkBitwise(file, {2, 2, 2}, 3);
    checkBitwise(file, {3, 1, 2}, 2);
  }
}

TEST_CASE("return types: All, EveryN, Final and Sum of the loss and of an extra output") {
  if (!onnxSupported()) return;
  const Split split{2, 2, 2};
  const int64_t batches = 4;
  OnnxModel reference = test::importWithBatch("mlp.onnx", split.microBatch, split.replicas);
  TrainingSession separate(reference.graph, reference.graph.find("loss"), adam(), optionsFor(split),
                           makeSimDevice());
  const StepData data = makeData(reference, separate, batches, 7);
  std::vector<HostTensor> perBatch;
  for (int64_t b = 0; b < batches; ++b) {
    separate.run(data.batch(b, batches));
    perBatch.push_back(separate.loss());
  }
  REQUIRE(perBatch[0].shape == Shape{2, 2});

  auto runWith = [&](const AnchorReturnType& type) {
    OnnxModel model = test::importWithBatch("mlp.onnx", split.microBatch, split.replicas);
    TrainingSession session(model.graph, model.graph.find("loss"), adam(), optionsFor(split), makeSimDevice(),
                            DataFlow{batches, {{"loss", type}}});
    session.run(data.inputs());
    return session.loss();
  };
  const HostTensor everyTwo = runWith(AnchorReturnType::everyN(2));
  CHECK(everyTwo.shape == Shape{2, 2, 2});
  std::vector<float> want = perBatch[1].data;
  want.insert(want.end(), perBatch[3].data.begin(), perBatch[3].data.end());
  CHECK(everyTwo.data == want);

  const HostTensor everyFour = runWith(AnchorReturnType::everyN(4));
  CHECK(everyFour.shape == Shape{2, 2});
  CHECK(everyFour.data == perBatch[3].data);

  const HostTensor final = runWith(AnchorReturnType::final());
  CHECK(final.shape == Shape{2});
  CHECK(final.data == std::vector<float>(perBatch[3].data.begin() + 2, perBatch[3].data.end()));

  const HostTensor sum = runWith(AnchorReturnType::sum());
  CHECK(sum.shape == Shape{2});
  std::vector<float> total = {perBatch[0].data[0], perBatch[0].data[1]};
  for (int64_t b = 0; b < batches; ++b) {
    for (size_t m = 0; m < 2; ++m) {
      if (b == 0 && m == 0) continue;
      total[0] += perBatch[static_cast<size_t>(b)].data[2 * m];
      total[1] += perBatch[static_cast<size_t>(b)].data[2 * m + 1];
    }
  }
  CHECK(sum.data == total);
}

TEST_CASE("an inference session runs batchesPerStep batches and returns its anchors by return type") {
  if (!onnxSupported()) return;
  const int64_t batches = 3;
  OnnxModel one = test::importWithBatch("lenet.onnx", 2, 2);
  SessionOptions options = optionsFor({1, 2, 2});
  InferenceSession single(one.graph, one.outputs, options, makeSimDevice());
  OnnxModel stepModel = test::importWithBatch("lenet.onnx", 2, 2);
  DataFlow flow{batches, {}};
  for (const std::string& name : stepModel.outputs) flow.anchors.emplace_back(name, AnchorReturnType::all());
  InferenceSession step(stepModel.graph, flow, options, makeSimDevice());
  // Reuse the training helper's data layout: one-batch shapes from `single`.
  StepData data;
  uint32_t value = 3;
  for (const std::string& name : one.inputs) {
    const auto count = static_cast<size_t>(numElements(single.inputHostShape(name)) * batches);
    data.names.push_back(name);
    std::vector<float> floats;
    std::vector<int32_t> ints;
    const bool integer = one.graph.tensor(one.graph.find(name)).dtype == DType::Int32;
    for (size_t k = 0; k < count; ++k) {
      value = value * 1664525u + 1013904223u;
      if (integer) {
        ints.push_back(static_cast<int32_t>((value >> 8) % 4));
      } else {
        floats.push_back(static_cast<float>((value >> 8) % 2048) / 1024.0f - 1.0f);
      }
    }
    data.floats.push_back(std::move(floats));
    data.ints.push_back(std::move(ints));
  }
  step.run(data.inputs());
  for (const std::string& name : one.outputs) {
    CAPTURE(name);
    std::vector<float> want;
    for (int64_t b = 0; b < batches; ++b) {
      single.run(data.batch(b, batches));
      want.insert(want.end(), single.output(name).data.begin(), single.output(name).data.end());
    }
    Shape shape = single.output(name).shape;
    shape.insert(shape.begin(), batches);
    CHECK(step.output(name).shape == shape);
    CHECK(step.output(name).data == want);
  }
}

TEST_CASE("bad data flows and step inputs are refused with their ids") {
  CHECK_NOTHROW(validate(DataFlow{1}));
  auto codeOf = [](const DataFlow& flow) {
    const auto error = test::catchError<ConfigError>([&flow] { validate(flow); });
    REQUIRE(error.has_value());
    INFO(error->what());
    return error->code();
  };
  CHECK(codeOf(DataFlow{0, {}}) == ErrorCode::InvalidBatchesPerStep);
  CHECK(codeOf(DataFlow{-2, {}}) == ErrorCode::InvalidBatchesPerStep);
  CHECK(codeOf(DataFlow{3, {{"loss", AnchorReturnType::everyN(2)}}}) == ErrorCode::InvalidAnchorReturnType);
  CHECK(codeOf(DataFlow{4, {{"loss", AnchorReturnType::everyN(0)}}}) == ErrorCode::InvalidAnchorReturnType);
  CHECK(codeOf(DataFlow{4, {{"loss", AnchorReturnType::everyN(8)}}}) == ErrorCode::InvalidAnchorReturnType);
  CHECK(codeOf(DataFlow{4, {{"loss", {AnchorReturnTypeId::Sum, 2}}}}) == ErrorCode::InvalidAnchorReturnType);
  CHECK(codeOf(DataFlow{4, {{"loss", AnchorReturnType::all()}, {"loss", AnchorReturnType::sum()}}}) ==
        ErrorCode::InvalidAnchor);
  const auto message = test::catchError<ConfigError>(
      [] { validate(DataFlow{6, {{"logits", AnchorReturnType::everyN(4)}}}); });
  REQUIRE(message.has_value());
  CHECK(message->subject() == "/dataFlow/anchors/logits");
  CHECK(std::string(message->what()).find("divide batchesPerStep (6)") != std::string::npos);
  CHECK(AnchorReturnType::fromName("EveryN", 2) == AnchorReturnType::everyN(2));
  CHECK(AnchorReturnType::fromName("Final") == AnchorReturnType::final());
  CHECK(test::catchError<ConfigError>([] { (void)AnchorReturnType::fromName("Every"); })->code() ==
        ErrorCode::InvalidAnchorReturnType);

  if (!onnxSupported()) return;
  OnnxModel model = test::importWithBatch("mlp.onnx", 4);
  TrainingSession session(model.graph, model.graph.find("loss"), adam(), SessionOptions{}, makeSimDevice(),
                          DataFlow{2, {}});
  StepData data = makeData(model, session, 1, 1);
  for (auto& v : data.floats) v.resize(v.size() / 2);  // one batch where the step takes two
  for (auto& v : data.ints) v.resize(v.size() / 2);
  const auto error = test::catchError<GraphError>([&] { session.run(data.inputs()); });
  REQUIRE(error.has_value());
  INFO(error->what());
  CHECK(error->code() == ErrorCode::HostShapeMismatch);
  CHECK(std::string(error->what()).find("batchesPerStep 2") != std::string::npos);
  const auto unknown = test::catchError<GraphError>([] {
    OnnxModel m = test::importWithBatch("mlp.onnx", 4);
    TrainingSession s(m.graph, m.graph.find("loss"), adam(), SessionOptions{}, makeSimDevice(),
                      DataFlow{2, {{"nothing", AnchorReturnType::all()}}});
  });
  REQUIRE(unknown.has_value());
  CHECK(unknown->code() == ErrorCode::UnknownStream);
}

// The MLP export on its tensors dataset (192 samples): batch 4 x 2 replicas x
// accumulation 2 makes 12 batches an epoch.
RunConfig trainConfig(const std::vector<std::string>& overrides) {
  const nlohmann::json document = {
      {"model",
       {{"type", "Onnx"}, {"path", test::sourcePath("tests/data/onnx/mlp.onnx")}, {"loss", "loss"}}},
      {"optimizer", {{"type", "Adam"}, {"learningRate", 0.01}}},
      {"sessionOptions",
       {{"enableReplicatedGraphs", true},
        {"replicatedGraphCount", 2},
        {"enableGradientAccumulation", true},
        {"accumulationFactor", 2}}},
      {"data",
       {{"dataset", "Tensors"},
        {"path", test::sourcePath("tests/data/onnx/mlp_train.safetensors")},
        {"batchSize", 4},
        {"epochs", 2},
        {"shuffle", true}}}};
  return parseRunConfig(document.dump(), "bps.json", overrides).config;
}

TEST_CASE("tessera train with /data/batchesPerStep reports the per-batch losses of one batch per step") {
  if (!onnxSupported()) return;
  const TrainSummary one = train(trainConfig({}));
  REQUIRE(one.losses.size() == 24);
  for (const std::string bps : {"3", "4", "12"}) {
    CAPTURE(bps);
    const TrainSummary stepped = train(trainConfig({"/data/batchesPerStep=" + bps}));
    CHECK(stepped.losses == one.losses);
    CHECK(stepped.steps == one.steps);
    CHECK(stepped.weights == one.weights);
  }
  CHECK(one.losses.front() != one.losses.back());
}

TEST_CASE("/data/batchesPerStep that does not fit the run is refused with its id") {
  if (!onnxSupported()) return;
  const auto notDividing =
      test::catchError<ConfigError>([] { (void)train(trainConfig({"/data/batchesPerStep=5"})); });
  REQUIRE(notDividing.has_value());
  INFO(notDividing->what());
  CHECK(notDividing->code() == ErrorCode::InvalidBatchesPerStep);
  CHECK(notDividing->subject() == "/data/batchesPerStep");
  CHECK(std::string(notDividing->what()).find("an epoch has 12 batches") != std::string::npos);

  const auto zero = test::catchError<ConfigError>([] { (void)trainConfig({"/data/batchesPerStep=0"}); });
  REQUIRE(zero.has_value());
  CHECK(zero->code() == ErrorCode::OutOfRange);
  CHECK(zero->subject() == "/data/batchesPerStep");

  const auto checkpoints = test::catchError<ConfigError>([] {
    validate(trainConfig({"/data/batchesPerStep=3", "/output/checkpoint=\"unused.safetensors\"",
                          "/output/checkpointEvery=4"}));
  });
  REQUIRE(checkpoints.has_value());
  INFO(checkpoints->what());
  CHECK(checkpoints->code() == ErrorCode::InvalidBatchesPerStep);
  CHECK(checkpoints->subject() == "/output/checkpointEvery");
}

}  // namespace
}  // namespace tessera
