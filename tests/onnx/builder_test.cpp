// OnnxBuilder (PopART's Builder): a model built node by node imports as the
// graph it describes and trains like the same model written with tessera's
// ops; every node is checked against ONNX's schema as it is added.
#include "tessera/onnx/onnx_builder.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"

namespace tessera {
namespace {

OnnxTensor floats(Shape shape, float scale) {
  OnnxTensor tensor;
  tensor.dtype = "float";
  tensor.shape = shape;
  const int64_t count = numElements(shape);
  for (int64_t k = 0; k < count; ++k) tensor.values.push_back(scale * std::sin(0.7 * static_cast<double>(k) + 0.3));
  return tensor;
}

OnnxModel importBytes(const std::string& bytes) {
  return importOnnx(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())), {}, "built");
}

std::string expectError(ErrorCode code, auto&& call) {
  try {
    call();
  } catch (const OnnxError& e) {
    CHECK(e.code() == code);
    return e.what();
  }
  FAIL("no error");
  return {};
}

TEST_CASE("a built MLP trains as the same MLP written with tessera's ops, bit for bit") {
  const int64_t batch = 4;
  const OnnxTensor w0 = floats({3, 5}, 0.5f), b0 = floats({5}, 0.1f), w1 = floats({5, 2}, 0.5f);

  OnnxBuilder builder;
  const std::string x = builder.addInputTensor("FLOAT", {batch, 3}, "x");
  const std::string labels = builder.addInputTensor("INT32", {batch}, "labels");
  const std::string tw0 = builder.addInitializedInputTensor(w0, "W0");
  const std::string tb0 = builder.addInitializedInputTensor(b0, "b0");
  const std::string tw1 = builder.addInitializedInputTensor(w1, "W1");
  const std::string pre = builder.addNode("add", std::vector{builder.addNode("MatMul", std::vector{x, tw0})[0], tb0})[0];
  const std::string hidden = builder.addNode("Relu", std::vector{pre})[0];
  const std::string logits = builder.addNode("MatMul", std::vector{hidden, tw1})[0];
  const std::string probs = builder.addNode("Softmax", std::vector{logits}, {{"axis", int64_t{1}}})[0];
  const std::string loss = builder.nllLoss(probs, labels, "Mean");
  builder.addOutputTensor(loss);
  CHECK(builder.tensorShape(logits) == Shape{batch, 2});
  CHECK(builder.tensorShape(loss) == Shape{});

  OnnxModel model = importBytes(builder.modelProto());
  CHECK(model.weights == std::vector<std::string>{"W0", "b0", "W1"});

  // The same model from tessera's ops.
  Graph graph;
  const Tensor gx = ops::input(graph, "x", {batch, 3});
  const Tensor glabels = ops::input(graph, "labels", {batch}, DType::Int32);
  const auto weight = [&](const std::string& name, const OnnxTensor& t) {
    return ops::variable(graph, name, std::vector<float>(t.values.begin(), t.values.end()), t.shape);
  };
  const Tensor gw0 = weight("W0", w0), gb0 = weight("b0", b0), gw1 = weight("W1", w1);
  const Tensor glogits = ops::matmul(ops::relu(ops::add(ops::matmul(gx, gw0), gb0)), gw1);
  const Tensor gloss = ops::softmaxCrossEntropy(glogits, glabels, ReductionType::Mean);

  OptimizerConfig sgd;
  sgd.sgd.learningRate = 0.1;
  // The loss's id before the graph moves into the session (arguments may be evaluated in any order).
  const TensorId builtLoss = model.graph.find(loss);
  TrainingSession built(std::move(model.graph), builtLoss, makeOptimizer(sgd), SessionOptions{}, makeSimDevice());
  TrainingSession direct(std::move(graph), gloss.id(), makeOptimizer(sgd), SessionOptions{}, makeSimDevice());
  std::vector<float> xs(static_cast<size_t>(batch * 3));
  std::vector<int32_t> ys = {0, 1, 1, 0};
  for (int step = 0; step < 3; ++step) {
    for (size_t k = 0; k < xs.size(); ++k) xs[k] = static_cast<float>(std::cos(0.37 * static_cast<double>(k + 5 * step)));
    const std::vector<StepInput> feeds = {{"x", std::span<const float>(xs)}, {"labels", std::span<const int32_t>(ys)}};
    built.run(feeds);
    direct.run(feeds);
    const double a = built.meanLoss();
    const double b = direct.meanLoss();
    // Softmax then Log then NLL is not the fused softmax cross-entropy: close, not equal.
    CHECK(a == doctest::Approx(b).epsilon(1e-6));
  }
}

TEST_CASE("shape queries share one inference per change of the model, with the same answers") {
  OnnxBuilder builder;
  const std::string x = builder.addInputTensor("FLOAT", {4, 3}, "x");
  const std::string w = builder.addInitializedInputTensor(floats({3, 5}, 0.5f), "W");
  CHECK(builder.tensorShape(w) == Shape{3, 5});  // an initializer's dims: no inference
  CHECK(builder.shapeInferenceRuns() == 0);
  const std::string y = builder.addNode("MatMul", std::vector{x, w})[0];
  CHECK(builder.tensorShape(y) == Shape{4, 5});
  CHECK(builder.tensorDtype(y) == "float");
  CHECK(builder.tensorShape(x) == Shape{4, 3});
  CHECK(builder.shapeInferenceRuns() == 1);
  // A node changes the model: the next query infers again, once.
  const std::string shape = builder.addInitializedInputTensor(OnnxTensor{"", "int64", {2}, {5, 4}}, "shape");
  const std::string z = builder.addNode("Reshape", std::vector{y, shape})[0];
  CHECK(builder.tensorShape(z) == Shape{5, 4});
  CHECK(builder.tensorShape(y) == Shape{4, 5});
  CHECK(builder.shapeInferenceRuns() == 2);
  // So does a node's attribute.
  const std::string t =
      builder.addNode("Transpose", std::vector{z}, {{"perm", std::vector<int64_t>{0, 1}}})[0];
  CHECK(builder.tensorShape(t) == Shape{5, 4});
  builder.setNodeAttribute(t, "perm", std::vector<int64_t>{1, 0});
  CHECK(builder.tensorShape(t) == Shape{4, 5});
  CHECK(builder.shapeInferenceRuns() == 4);
  // An output takes the inferred type without another run.
  builder.addOutputTensor(t);
  CHECK(builder.shapeInferenceRuns() == 4);
  CHECK(builder.tensorShape(t) == Shape{4, 5});
  CHECK(builder.shapeInferenceRuns() == 4);
}

TEST_CASE("names are PopART's, made unique with /N") {
  OnnxBuilder builder;
  CHECK(builder.addInputTensor("float", {2}) == "input");
  CHECK(builder.addInputTensor("FLOAT32", {2}) == "input/1");
  CHECK(builder.addInitializedInputTensor(floats({2}, 1.0f)) == "init_input");
  CHECK(builder.addNode("relu", std::vector<std::string>{"input"}) == std::vector<std::string>{"Relu:0"});
  CHECK(builder.addNode("relu", std::vector<std::string>{"input"}) == std::vector<std::string>{"Relu:0/1"});
  CHECK(builder.addNode("Relu", std::vector<std::string>{"input"}, {}, 0, "act") == std::vector<std::string>{"act:0"});
  CHECK(builder.opType("batchnormalization") == "BatchNormalization");
  CHECK(builder.hasSeveralOutputs("Split"));
  CHECK_FALSE(builder.hasSeveralOutputs("Relu"));
}

TEST_CASE("unknown names and refused values have ids, names and suggestions") {
  OnnxBuilder builder;
  const std::string x = builder.addInputTensor("FLOAT", {2, 3}, "x");
  const std::vector<std::string> one = {x};
  CHECK(expectError(ErrorCode::OnnxBuilderUnknown, [&] { builder.addNode("Relux", one); }).find("did you mean \"Relu\"") !=
        std::string::npos);
  CHECK(expectError(ErrorCode::OnnxBuilderUnknown, [&] {
          builder.addNode("Softmax", one, {{"axes", int64_t{1}}});
        }).find("did you mean \"axis\"") != std::string::npos);
  CHECK(expectError(ErrorCode::OnnxBuilderUnknown, [&] { builder.addNode("Relu", std::vector<std::string>{"y"}); })
            .find("\"y\"") != std::string::npos);
  CHECK(expectError(ErrorCode::OnnxBuilderInvalid, [&] { builder.addNode("MatMul", one); }).find("takes 2") !=
        std::string::npos);
  CHECK(expectError(ErrorCode::OnnxBuilderInvalid, [&] {
          builder.addNode("Softmax", one, {{"axis", std::string("one")}});
        }).find("wants an int") != std::string::npos);
  CHECK(expectError(ErrorCode::OnnxBuilderInvalid, [&] {
          builder.addNode("Transpose", one, {}, 2);
        }).find("outputs") != std::string::npos);
  expectError(ErrorCode::OnnxBuilderInvalid, [&] { builder.addInputTensor("string", {1}); });
  expectError(ErrorCode::OnnxBuilderInvalid, [&] { OnnxBuilder old(10); });
  OnnxTensor bad = floats({2, 2}, 1.0f);
  bad.values.pop_back();
  expectError(ErrorCode::OnnxBuilderInvalid, [&] { builder.addInitializedInputTensor(bad); });
  OnnxTensor ints;
  ints.dtype = "int32";
  ints.shape = {1};
  ints.values = {0.5};
  expectError(ErrorCode::OnnxBuilderInvalid, [&] { builder.addInitializedInputTensor(ints); });
  expectError(ErrorCode::OnnxBuilderInvalid, [&] { builder.setNodeAttribute(x, "__ipu_number", int64_t{1}); });
  expectError(ErrorCode::OnnxBuilderInvalid, [&] { builder.clearScopeAttribute("__ipu_number"); });
  expectError(ErrorCode::OnnxBuilderInvalid, [&] { builder.setScopeAttribute("axis", int64_t{1}); });
}

TEST_CASE("an integer attribute where the schema wants a float is that float; an empty list is the default") {
  OnnxBuilder builder;
  const std::string x = builder.addInputTensor("FLOAT", {1, 2, 4, 4}, "x");
  const std::string y = builder.addNode("LeakyRelu", std::vector{x}, {{"alpha", int64_t{1}}})[0];
  const std::string pooled = builder.addNode("MaxPool", std::vector{y},
                                             {{"kernel_shape", std::vector<int64_t>{2, 2}},
                                              {"strides", std::vector<int64_t>{2, 2}},
                                              {"pads", std::vector<int64_t>{}}})[0];
  CHECK(builder.tensorShape(pooled) == Shape{1, 2, 2, 2});
  builder.addOutputTensor(pooled);
  CHECK_FALSE(builder.modelProto().empty());
}

TEST_CASE("a recompute annotation from the builder reaches the imported graph") {
  OnnxBuilder builder;
  const std::string x = builder.addInputTensor("FLOAT", {2, 3}, "x");
  const std::string w = builder.addInitializedInputTensor(floats({3, 3}, 0.5f), "w");
  const std::string h = builder.addNode("MatMul", std::vector{x, w})[0];
  builder.setScopeAttribute("__recompute_output_in_backward_pass", int64_t{2});
  const std::string a = builder.addNode("Tanh", std::vector{h}, {}, 0, "a")[0];
  builder.clearScopeAttribute("__recompute_output_in_backward_pass");
  const std::string loss = builder.identityLoss(a, "Sum");
  builder.addOutputTensor(loss);
  const OnnxModel model = importBytes(builder.modelProto());
  int recomputed = 0;
  for (const OpNode& op : model.graph.ops()) {
    if (op.recompute != RecomputeType::Recompute) continue;
    ++recomputed;
    CHECK(op.kind == OpKind::Tanh);
  }
  CHECK(recomputed == 1);
  // A value no RecomputeType has is the importer's error.
  OnnxBuilder wrong;
  const std::string z = wrong.addInputTensor("FLOAT", {2}, "z");
  const std::string t = wrong.addNode("Tanh", std::vector{z})[0];
  wrong.setNodeAttribute(t, "__recompute_output_in_backward_pass", int64_t{7});
  wrong.addOutputTensor(t);
  CHECK_THROWS_AS(importBytes(wrong.modelProto()), OnnxError);
}

}  // namespace
}  // namespace tessera
