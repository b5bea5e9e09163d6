// A GPT-style decoder block exported by PyTorch (tests/data/onnx/generate.py,
// gpt_block): embeddings, causal self-attention with a -inf masked_fill (a
// Where on computed scores), LayerNorms, a GELU MLP and the next-token loss
// inside the graph. Forward on the simulated device gives PyTorch's loss and
// logits at several batch sizes and replication factors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/onnx_models.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/onnx/onnx_builder.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

using nlohmann::json;

const json& reference() {
  static const json value = test::readJson("tests/data/onnx/gpt_block_reference.json");
  return value;
}

OnnxModel importBlock(int64_t batchPerReplica, int64_t replicas) {
  return test::importWithBatch("gpt_block.onnx", batchPerReplica, replicas);
}

TEST_CASE("the GPT block imports: the causal mask is a select on the device, shape arithmetic is folded") {
  const OnnxModel model = importBlock(2, 1);
  CHECK(model.inputs == std::vector<std::string>{"tokens", "targets"});
  CHECK(model.outputs == std::vector<std::string>{"loss", "logits"});
  const Graph& g = model.graph;
  CHECK(g.tensor(g.find("logits")).shape == Shape{2, 8, 32});
  std::multiset<OpKind> kinds;
  for (const OpNode& op : g.ops()) kinds.insert(op.kind);
  // The mask (a sliced buffer compared with 0) is folded; masked_fill runs as Where.
  CHECK(kinds.count(OpKind::Where) == 1);
  CHECK(kinds.count(OpKind::Equal) == 0);
  CHECK(kinds.count(OpKind::BatchMatMul) == 2);
  CHECK(kinds.count(OpKind::Gather) == 2);
  CHECK(kinds.count(OpKind::SoftmaxCrossEntropy) == 1);
  for (const char* name : {"tokens.weight", "positions.weight", "qkv.weight", "head.bias", "lnf.weight"})
    CHECK(g.tensor(g.find(name)).category == TensorCategory::Weight);
}

TEST_CASE("the GPT block's loss and logits equal PyTorch's at every batch size and replication factor") {
  for (const json& c : reference().at("cases")) {
    const auto batch = c.at("batch").get<int64_t>();
    const std::vector<int32_t> tokens = c.at("tokens").get<std::vector<int32_t>>();
    const std::vector<int32_t> targets = c.at("targets").get<std::vector<int32_t>>();
    const std::vector<float> logits = c.at("logits").get<std::vector<float>>();
    const double loss = c.at("loss").get<double>();
    for (int64_t replicas : {1, 2, 4}) {
      if (batch % replicas != 0) continue;
      CAPTURE(batch);
      CAPTURE(replicas);
      OnnxModel model = importBlock(batch / replicas, replicas);
      SessionOptions options;
      options.enableReplicatedGraphs = replicas > 1;
      options.replicatedGraphCount = replicas;
      InferenceSession session(std::move(model.graph), model.outputs, options, makeSimDevice());
      session.run({StepInput("tokens", tokens), StepInput("targets", targets)});
      const HostTensor& losses = session.output("loss");
      REQUIRE(losses.data.size() == static_cast<std::size_t>(replicas));
      // Every replica's loss is a mean over the same number of targets.
      double mean = 0;
      for (float l : losses.data) mean += l / static_cast<double>(replicas);
      CHECK(std::fabs(mean - loss) <= 1e-5 * std::fabs(loss));
      const HostTensor& got = session.output("logits");
      REQUIRE(got.data.size() == logits.size());
      double worst = 0;
      for (std::size_t k = 0; k < logits.size(); ++k)
        worst = std::max(worst, std::fabs(got.data[k] - logits[k]) /
                                    std::max(1.0, std::fabs(static_cast<double>(logits[k]))));
      CHECK(worst <= 1e-5);
    }
  }
}

TEST_CASE(
    "BatchNormalization in training mode: batch statistics, running statistics updated in place as PyTorch") {
  const json reference = test::readJson("tests/data/onnx/batchnorm_train_reference.json");
  const auto batch = reference.at("batch").get<int64_t>();
  OnnxImportOptions importOptions;
  importOptions.dimensions = {{"batch", batch}};
  OnnxModel model = importOnnx(test::sourcePath("tests/data/onnx/batchnorm_train.onnx"), importOptions);
  CHECK(model.weights == std::vector<std::string>{"bn.weight", "bn.bias"});
  CHECK(model.state == std::vector<std::string>{"bn.running_mean", "bn.running_var"});
  const Graph& g = model.graph;
  CHECK(g.tensor(g.find("bn.running_mean")).category == TensorCategory::OptimizerState);
  // Nothing reads the updates: the session runs them for their effect on the state.
  std::vector<std::string> outputs = model.outputs;
  for (const OpNode& op : g.ops())
    if (op.kind == OpKind::ScaledAddInplace) outputs.push_back(g.tensor(op.outputs[0]).name);
  REQUIRE(outputs.size() == 3);
  InferenceSession session(std::move(model.graph), outputs, SessionOptions{}, makeSimDevice());
  for (const json& step : reference.at("steps")) {
    const std::vector<float> x = step.at("x").get<std::vector<float>>();
    session.run({StepInput("x", x)});
    auto close = [](const std::vector<float>& got, const std::vector<float>& want) {
      REQUIRE(got.size() == want.size());
      for (std::size_t k = 0; k < want.size(); ++k)
        CHECK(std::fabs(got[k] - want[k]) <= 1e-5 * std::max(1.0f, std::fabs(want[k])));
    };
    close(session.output("y").data, step.at("y").get<std::vector<float>>());
    close(session.output(outputs[1]).data, step.at("runningMean").get<std::vector<float>>());
    close(session.output(outputs[2]).data, step.at("runningVar").get<std::vector<float>>());
  }
}

TEST_CASE("a training step keeps the running-statistic updates and does not train the state") {
  const json reference = test::readJson("tests/data/onnx/batchnorm_train_reference.json");
  OnnxImportOptions importOptions;
  importOptions.dimensions = {{"batch", reference.at("batch").get<int64_t>()}};
  OnnxModel model = importOnnx(test::sourcePath("tests/data/onnx/batchnorm_train.onnx"), importOptions);
  Graph& g = model.graph;
  const Tensor y{&g, g.find("y")};
  const Tensor loss = ops::reduceMean(ops::mul(y, y));
  std::vector<std::string> outputs;
  for (const OpNode& op : g.ops())
    if (op.kind == OpKind::ScaledAddInplace) outputs.push_back(g.tensor(op.outputs[0]).name);
  REQUIRE(outputs.size() == 2);
  OptimizerConfig sgd;
  sgd.sgd.learningRate = 0.1;
  TrainingSession session(std::move(model.graph), loss.id(), makeOptimizer(sgd), SessionOptions{},
                          makeSimDevice(), outputs);
  const json& first = reference.at("steps").at(0);
  const std::vector<float> x = first.at("x").get<std::vector<float>>();
  session.run({StepInput("x", x)});
  const std::vector<float> mean = first.at("runningMean").get<std::vector<float>>();
  const std::vector<float> variance = first.at("runningVar").get<std::vector<float>>();
  for (std::size_t c = 0; c < 3; ++c) {
    CHECK(std::fabs(session.output(outputs[0]).data.at(c) - mean[c]) <= 1e-5);
    CHECK(std::fabs(session.output(outputs[1]).data.at(c) - variance[c]) <= 1e-5 * std::fabs(variance[c]));
  }
  // Only the weights are trained (and read back as weights).
  std::set<std::string> names;
  for (const auto& [name, value] : session.readWeights()) names.insert(name);
  CHECK(names == std::set<std::string>{"bn.weight", "bn.bias"});
}

TEST_CASE(
    "Conv, BatchNormalization in training mode and Relu import as the normalization ops and train as the same "
    "model written with tessera's ops, bit for bit") {
  const int64_t batch = 4;
  const auto values = [](Shape shape, double scale, double offset) {
    OnnxTensor tensor;
    tensor.dtype = "float";
    tensor.shape = std::move(shape);
    for (int64_t k = 0; k < numElements(tensor.shape); ++k)
      tensor.values.push_back(static_cast<float>(offset + scale * std::sin(0.7 * static_cast<double>(k) + 0.3)));
    return tensor;
  };
  const OnnxTensor w = values({3, 2, 3, 3}, 0.4, 0.0), scale = values({3}, 0.5, 1.0), bias = values({3}, 0.3, 0.1);
  OnnxBuilder builder(14);
  const std::string x = builder.addInputTensor("FLOAT", {batch, 2, 5, 5}, "x");
  const std::string tw = builder.addInitializedInputTensor(w, "W");
  const std::string ts = builder.addInitializedInputTensor(scale, "scale");
  const std::string tb = builder.addInitializedInputTensor(bias, "bias");
  const std::string tm = builder.addInitializedInputTensor(values({3}, 0.0, 0.0), "running_mean");
  const std::string tv = builder.addInitializedInputTensor(values({3}, 0.0, 1.0), "running_var");
  const std::string conv =
      builder.addNode("Conv", std::vector{x, tw}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}})[0];
  const std::vector<std::string> bn = builder.addNode("BatchNormalization", std::vector{conv, ts, tb, tm, tv},
                                                      {{"training_mode", int64_t{1}}}, 3);
  const std::string relu = builder.addNode("Relu", std::vector{bn[0]})[0];
  const std::string loss =
      builder.addNode("ReduceSum", std::vector{builder.addNode("Mul", std::vector{relu, relu})[0]},
                      {{"keepdims", int64_t{0}}})[0];
  builder.addOutputTensor(loss);
  const std::string bytes = builder.modelProto();
  OnnxModel model = importOnnx(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())), {}, "built");
  CHECK(model.state == std::vector<std::string>{"running_mean", "running_var"});
  int normalization = 0;
  int reductions = 0;
  for (const OpNode& op : model.graph.ops()) {
    normalization += op.kind == OpKind::BatchNormStats || op.kind == OpKind::BatchNorm ? 1 : 0;
    reductions += op.kind == OpKind::ReduceMean ? 1 : 0;
    // What RecomputationType::NormOnly recomputes.
    if (op.kind == OpKind::BatchNormStats || op.kind == OpKind::BatchNorm) CHECK(op.normalisation);
  }
  CHECK(normalization == 2);
  CHECK(reductions == 0);

  Graph graph;
  const auto variable = [&](const std::string& name, const OnnxTensor& t) {
    return ops::variable(graph, name, std::vector<float>(t.values.begin(), t.values.end()), t.shape);
  };
  const Tensor gx = ops::input(graph, "x", {batch, 2, 5, 5});
  const Tensor gw = variable("W", w);
  const Tensor gs = variable("scale", scale);
  const Tensor gb = variable("bias", bias);
  const Tensor y = ops::relu(
      ops::batchNormTraining(ops::conv(gx, gw, {.pads = {1, 1, 1, 1}}), gs, gb, static_cast<double>(1e-5F)).y);
  const Tensor gloss = ops::reduceSum(ops::mul(y, y));

  OptimizerConfig sgd;
  sgd.sgd.learningRate = 0.01;
  const TensorId builtLoss = model.graph.find(loss);
  TrainingSession built(std::move(model.graph), builtLoss, makeOptimizer(sgd), SessionOptions{}, makeSimDevice());
  TrainingSession direct(std::move(graph), gloss.id(), makeOptimizer(sgd), SessionOptions{}, makeSimDevice());
  std::vector<float> xs(static_cast<std::size_t>(batch * 2 * 5 * 5));
  for (int step = 0; step < 3; ++step) {
    for (std::size_t k = 0; k < xs.size(); ++k)
      xs[k] = static_cast<float>(std::cos(0.37 * static_cast<double>(k + 5 * step)));
    built.run({StepInput("x", xs)});
    direct.run({StepInput("x", xs)});
    CHECK(built.meanLoss() == direct.meanLoss());
  }
  for (const char* name : {"W", "scale", "bias"}) {
    CAPTURE(name);
    CHECK(built.readVariable(name) == direct.readVariable(name));
  }
}

TEST_CASE(
    "Dropout in training mode: refused by default; with randomDropout the same masks on 1, 2 and 4 "
    "replicas") {
  const std::string path = test::sourcePath("tests/data/onnx/dropout_train.onnx");
  OnnxImportOptions options;
  options.dimensions = {{"batch", 8}};
  const auto error = test::catchError<OnnxError>([&] { (void)importOnnx(path, options); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::OnnxUnsupportedFeature);
  CHECK(error->detail().find("randomDropout") != std::string::npos);

  std::vector<float> x(8 * 6);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i) - 3.0f;
  std::vector<float> expected;
  for (int64_t replicas : {1, 2, 4}) {
    CAPTURE(replicas);
    options.randomDropout = true;
    options.dimensions = {{"batch", 8 / replicas}};
    options.replicationFactor = replicas;
    OnnxModel model = importOnnx(path, options);
    CHECK(model.state == std::vector<std::string>{"dropout.step"});
    SessionOptions sessionOptions;
    sessionOptions.enableReplicatedGraphs = replicas > 1;
    sessionOptions.replicatedGraphCount = replicas;
    InferenceSession session(std::move(model.graph), model.outputs, sessionOptions, makeSimDevice());
    std::vector<float> got;
    for (int step = 0; step < 2; ++step) {
      session.run({StepInput("x", x)});
      const std::vector<float>& y = session.output("y").data;
      const std::vector<float>& mask = session.output("mask").data;
      REQUIRE(y.size() == x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        CHECK((mask[i] == 1.0f || mask[i] == 0.0f));
        CHECK(y[i] == (mask[i] != 0.0f ? 2.0f * x[i] : 0.0f));
      }
      got.insert(got.end(), y.begin(), y.end());
    }
    if (expected.empty()) {
      expected = got;
      // The step advances: the two runs draw different masks.
      CHECK_FALSE(std::equal(got.begin(), got.begin() + 48, got.begin() + 48));
    }
    CHECK(got == expected);
  }
}

}  // namespace
}  // namespace tessera
