// ONNX's GatherElements, ScatterElements and Clip with bounds the model
// computes, in models built node by node (OnnxBuilder): they import as the
// element gathers and scatters and as selects, train as the same model
// written with tessera's ops, give the gradient where torch.clamp does, and
// what they do not take is refused with the node named. Clip's bounds may
// be weights (torch.clamp by parameters): they train, with torch.clamp's
// gradients checked against the double reference and the same bits on the
// per-replica reference device. PyTorch exports using torch.gather,
// scatter_add, scatter and clamp with computed bounds, and clamp by its own
// parameters (tests/data/onnx/generate_elements.py), train with PyTorch's
// per-step SGD losses, on one replica and on two, and the bounds end where
// PyTorch's do.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/onnx_models.hpp"
#include "support/reference_evaluator.hpp"
#include "tessera/lib/autodiff.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/onnx/onnx_builder.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/sessions/session.hpp"
#include "tessera/app/trainer.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

OnnxTensor floats(Shape shape, float scale) {
  OnnxTensor tensor;
  tensor.dtype = "float";
  tensor.shape = shape;
  const int64_t count = numElements(shape);
  for (int64_t k = 0; k < count; ++k)
    tensor.values.push_back(scale * std::sin(0.7 * static_cast<double>(k) + 0.3));
  return tensor;
}

OnnxTensor int64s(Shape shape, std::vector<double> values) {
  OnnxTensor tensor;
  tensor.dtype = "int64";
  tensor.shape = std::move(shape);
  tensor.values = std::move(values);
  return tensor;
}

OnnxModel importBytes(const std::string& bytes) {
  return importOnnx(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())), {}, "built");
}

std::unique_ptr<Optimizer> sgd(double learningRate) {
  OptimizerConfig config;
  config.sgd.learningRate = learningRate;
  return makeOptimizer(config);
}

int countOps(const Graph& graph, OpKind kind) {
  int n = 0;
  for (const OpNode& op : graph.ops()) n += op.kind == kind ? 1 : 0;
  return n;
}

TEST_CASE(
    "GatherElements and ScatterElements train as the same model written with tessera's ops, bit for bit") {
  const int64_t batch = 4;
  const OnnxTensor w = floats({3, 5}, 0.5f), u = floats({4, 2}, 0.3f);
  const std::vector<double> picks = {4, 0, -1, 1, 2, 2, -5, 3};

  OnnxBuilder builder(16);
  const std::string x = builder.addInputTensor("FLOAT", {batch, 3}, "x");
  const std::string tw = builder.addInitializedInputTensor(w, "W");
  const std::string tu = builder.addInitializedInputTensor(u, "U");
  const std::string idx = builder.addInitializedInputTensor(int64s({batch, 2}, picks), "idx");
  const std::string h = builder.addNode("MatMul", std::vector{x, tw})[0];
  const std::string picked =
      builder.addNode("GatherElements", std::vector{h, idx}, {{"axis", int64_t{1}}})[0];
  const std::string updates = builder.addNode("Mul", std::vector{picked, tu})[0];
  const std::string added = builder.addNode("ScatterElements", std::vector{h, idx, updates},
                                            {{"axis", int64_t{-1}}, {"reduction", std::string("add")}})[0];
  const std::string written =
      builder.addNode("ScatterElements", std::vector{added, idx, tu}, {{"axis", int64_t{1}}})[0];
  const std::string loss =
      builder.addNode("ReduceSum", std::vector{builder.addNode("Mul", std::vector{written, written})[0]},
                      {{"keepdims", int64_t{0}}})[0];
  builder.addOutputTensor(loss);

  OnnxModel model = importBytes(builder.modelProto());
  CHECK(model.weights == std::vector<std::string>{"W", "U"});
  CHECK(countOps(model.graph, OpKind::GatherElements) == 1);
  CHECK(countOps(model.graph, OpKind::ScatterElements) == 2);

  Graph graph;
  const Tensor gx = ops::input(graph, "x", {batch, 3});
  const Tensor gw = ops::variable(graph, "W", std::vector<float>(w.values.begin(), w.values.end()), w.shape);
  const Tensor gu = ops::variable(graph, "U", std::vector<float>(u.values.begin(), u.values.end()), u.shape);
  const Tensor gidx =
      ops::constant(graph, "idx", std::vector<float>(picks.begin(), picks.end()), {batch, 2}, DType::Int32);
  const Tensor gh = ops::matmul(gx, gw);
  const Tensor gadded =
      ops::scatterElements(gh, gidx, ops::mul(ops::gatherElements(gh, gidx, 1), gu), 1, true);
  const Tensor gwritten = ops::scatterElements(gadded, gidx, gu, 1);
  const Tensor gloss = ops::reduceSum(ops::mul(gwritten, gwritten));

  const TensorId builtLoss = model.graph.find(loss);
  TrainingSession built(std::move(model.graph), builtLoss, sgd(0.05), SessionOptions{}, makeSimDevice());
  TrainingSession direct(std::move(graph), gloss.id(), sgd(0.05), SessionOptions{}, makeSimDevice());
  std::vector<float> xs(static_cast<size_t>(batch * 3));
  for (int step = 0; step < 3; ++step) {
    for (size_t k = 0; k < xs.size(); ++k)
      xs[k] = static_cast<float>(std::cos(0.37 * static_cast<double>(k + 5 * step)));
    const std::vector<StepInput> feeds = {{"x", std::span<const float>(xs)}};
    built.run(feeds);
    direct.run(feeds);
    CHECK(built.meanLoss() == direct.meanLoss());
  }
  CHECK(built.readVariable("W") == direct.readVariable("W"));
  CHECK(built.readVariable("U") == direct.readVariable("U"));
}

TEST_CASE("ScatterElements' reduction mul is refused with the node and the value named") {
  OnnxBuilder builder(16);
  const std::string data = builder.addInputTensor("FLOAT", {2, 3}, "data");
  const std::string updates = builder.addInputTensor("FLOAT", {2, 1}, "updates");
  const std::string idx = builder.addInitializedInputTensor(int64s({2, 1}, {0, 2}), "idx");
  builder.addOutputTensor(builder.addNode("ScatterElements", std::vector{data, idx, updates},
                                          {{"reduction", std::string("mul")}}, 0, "scatter")[0]);
  const std::string bytes = builder.modelProto();
  try {
    (void)importBytes(bytes);
    FAIL("no error");
  } catch (const OnnxError& e) {
    CHECK(e.code() == ErrorCode::OnnxUnsupportedScatterReduction);
    CHECK(std::string(e.what()).starts_with(
        "[tessera.onnx.737] built: node scatter (ScatterElements, opset 16)"));
    CHECK(e.detail() == "attribute reduction is \"mul\"; allowed: \"none\" (write), \"add\"");
  }
}

TEST_CASE("an index outside the data at run time is an error naming the op and the index") {
  OnnxBuilder builder;
  const std::string data = builder.addInputTensor("FLOAT", {2, 3}, "data");
  const std::string idx = builder.addInputTensor("INT64", {2, 2}, "idx");
  builder.addOutputTensor(
      builder.addNode("GatherElements", std::vector{data, idx}, {{"axis", int64_t{1}}})[0]);
  OnnxModel model = importBytes(builder.modelProto());
  const std::string out = model.graph.tensor(model.graph.ops().back().outputs[0]).name;
  InferenceSession session(std::move(model.graph), std::vector<std::string>{out}, SessionOptions{},
                           makeSimDevice());
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> inside = {2, -3, 0, 1};
  session.run({{"data", std::span<const float>(values)}, {"idx", std::span<const int32_t>(inside)}});
  CHECK(session.output(out).data == std::vector<float>{3, 1, 4, 5});
  const std::vector<int32_t> outside = {0, 1, 3, 0};
  try {
    session.run({{"data", std::span<const float>(values)}, {"idx", std::span<const int32_t>(outside)}});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("index 3 (element 2) is outside [-3, 3)") != std::string::npos);
  }
}

// Clip(w, -b, b) of a weight w by a bound b the model reads from its input:
// one SGD step of rate 1 on sum(c * clip) leaves w - dw.
TEST_CASE("Clip with computed bounds: torch.clamp's values and gradients, boundaries included") {
  OnnxBuilder builder;
  const OnnxTensor w = [] {
    OnnxTensor t;
    t.dtype = "float";
    t.shape = {6};
    t.values = {-2.0, -1.0, -0.25, 0.5, 1.0, 3.0};
    return t;
  }();
  const std::string tw = builder.addInitializedInputTensor(w, "w");
  const std::string b = builder.addInputTensor("FLOAT", {}, "b");
  const std::string lo = builder.addNode("Neg", std::vector{b})[0];
  const std::string clipped = builder.addNode("Clip", std::vector{tw, lo, b})[0];
  const OnnxTensor c = floats({6}, 1.0f);
  const std::string weighted =
      builder.addNode("Mul", std::vector{clipped, builder.addInitializedInputTensor(c, "c")})[0];
  const std::string loss = builder.addNode("ReduceSum", std::vector{weighted}, {{"keepdims", int64_t{0}}})[0];
  builder.addOutputTensor(clipped);
  builder.addOutputTensor(loss);
  OnnxModel model = importBytes(builder.modelProto());
  CHECK(model.weights == std::vector<std::string>{"w", "c"});
  CHECK(countOps(model.graph, OpKind::Clip) == 0);
  CHECK(countOps(model.graph, OpKind::Where) == 2);
  const TensorId lossId = model.graph.find(loss);
  TrainingSession session(std::move(model.graph), lossId, sgd(1.0), SessionOptions{}, makeSimDevice());
  const std::vector<float> bound = {1.0f};
  session.run({{"b", std::span<const float>(bound)}});
  double expectedLoss = 0.0;
  const std::vector<double> clampedW = {-1.0, -1.0, -0.25, 0.5, 1.0, 1.0};
  for (std::size_t k = 0; k < 6; ++k)
    expectedLoss += static_cast<double>(static_cast<float>(c.values[k])) * clampedW[k];
  CHECK(session.meanLoss() == doctest::Approx(expectedLoss).epsilon(1e-6));
  // The gradient passes where -1 <= w <= 1, the bounds included (torch.clamp's rule).
  const std::vector<float> after = session.readVariable("w").data;
  for (std::size_t k = 0; k < 6; ++k) {
    CAPTURE(k);
    const bool inside = w.values[k] >= -1.0 && w.values[k] <= 1.0;
    const float expected =
        static_cast<float>(w.values[k]) - (inside ? static_cast<float>(c.values[k]) : 0.0f);
    CHECK(after[k] == expected);
  }
}

TEST_CASE(
    "Clip with computed bounds: min above max gives max, and a NaN stays NaN (ONNX's min(max(x, lo), hi))") {
  OnnxBuilder builder;
  const std::string x = builder.addInputTensor("FLOAT", {4}, "x");
  const std::string lo = builder.addInputTensor("FLOAT", {}, "lo");
  const std::string hi = builder.addInputTensor("FLOAT", {}, "hi");
  const std::string y = builder.addNode("Clip", std::vector{x, lo, hi})[0];
  const std::string onlyMin = builder.addNode("Clip", std::vector{x, lo})[0];
  builder.addOutputTensor(y);
  builder.addOutputTensor(onlyMin);
  OnnxModel model = importBytes(builder.modelProto());
  InferenceSession session(std::move(model.graph), std::vector<std::string>{y, onlyMin}, SessionOptions{},
                           makeSimDevice());
  const std::vector<float> xs = {-3.0f, 0.5f, 4.0f, std::nanf("")};
  const std::vector<float> inverted = {2.0f}, low = {1.0f};
  session.run({{"x", std::span<const float>(xs)},
               {"lo", std::span<const float>(inverted)},
               {"hi", std::span<const float>(low)}});
  const std::vector<float>& got = session.output(y).data;
  CHECK(got[0] == 1.0f);
  CHECK(got[1] == 1.0f);
  CHECK(got[2] == 1.0f);
  const std::vector<float>& min = session.output(onlyMin).data;
  CHECK(min[0] == 2.0f);
  CHECK(min[1] == 2.0f);
  CHECK(min[2] == 4.0f);
  CHECK(std::isnan(min[3]));
}

// sum(r * Clip(x, lo, hi)) of an input x [3, 4] with weights as bounds: lo
// one value, hi one per column (broadcast; ONNX asks for one value, the
// import takes any shape that broadcasts to x). The bounds' values are
// loInit and hiInit.
struct ClipByWeights {
  std::string x, lo, hi, clipped, loss;
  std::string bytes;
};

ClipByWeights clipByWeights(double loInit, std::vector<double> hiInit) {
  OnnxBuilder builder;
  ClipByWeights m;
  m.x = builder.addInputTensor("FLOAT", {3, 4}, "x");
  OnnxTensor lo;
  lo.dtype = "float";
  lo.shape = {};
  lo.values = {loInit};
  OnnxTensor hi;
  hi.dtype = "float";
  hi.shape = {4};
  hi.values = std::move(hiInit);
  m.lo = builder.addInitializedInputTensor(lo, "lo");
  m.hi = builder.addInitializedInputTensor(hi, "hi");
  m.clipped = builder.addNode("Clip", std::vector{m.x, m.lo, m.hi})[0];
  const std::string weighted = builder.addNode(
      "Mul", std::vector{m.clipped, builder.addInitializedInputTensor(floats({3, 4}, 1.0f), "r")})[0];
  m.loss = builder.addNode("ReduceSum", std::vector{weighted}, {{"keepdims", int64_t{0}}})[0];
  builder.addOutputTensor(m.clipped);
  builder.addOutputTensor(m.loss);
  m.bytes = builder.modelProto();
  return m;
}

TEST_CASE("Clip by weight bounds: the bounds train, gradients checked against the double reference") {
  const ClipByWeights m = clipByWeights(-0.3, {0.2, 0.5, 0.1, 0.4});
  OnnxImportOptions options;
  options.replicationFactor = 2;
  OnnxModel model =
      importOnnx(std::as_bytes(std::span<const char>(m.bytes.data(), m.bytes.size())), options, "built");
  CHECK(model.weights == std::vector<std::string>{"lo", "hi", "r"});
  Graph& g = model.graph;
  const Tensor x(&g, g.find(m.x));
  const Tensor lo(&g, g.find(m.lo));
  const Tensor hi(&g, g.find(m.hi));
  const Tensor loss(&g, g.find(m.loss));
  const std::vector<Tensor> wrt = {x, lo, hi};
  const std::vector<Tensor> grads = autodiff(g, loss, wrt);
  test::ReferenceEvaluator ev(g);
  // x in [-1, 1), different on each replica, none within 1e-3 of a bound.
  std::vector<std::vector<double>> feeds;
  for (int64_t q = 0; q < 2; ++q) {
    std::vector<double> values;
    for (int k = 0; k < 12; ++k) values.push_back(std::sin(1.3 * k + 0.9 * static_cast<double>(q) + 0.1));
    feeds.push_back(values);
    ev.feed(x.id(), q, values);
  }
  ev.run();
  std::vector<std::vector<std::vector<double>>> analytic(3);
  for (std::size_t k = 0; k < 3; ++k)
    for (int64_t q = 0; q < 2; ++q) analytic[k].push_back(ev.value(grads[k].id(), q));
  constexpr double kStep = 1e-6;
  for (std::size_t k = 0; k < 3; ++k) {
    for (int64_t q = 0; q < 2; ++q) {
      const auto qi = static_cast<std::size_t>(q);
      for (std::size_t i = 0; i < analytic[k][qi].size(); ++i) {
        auto lossWith = [&](double delta) {
          if (k == 0) {
            std::vector<double> values = feeds[qi];
            values[i] += delta;
            ev.feed(x.id(), q, values);
          } else {
            ev.state(wrt[k].id(), q)[i] += delta;
          }
          ev.run();
          const double value = ev.sumOverReplicas(loss.id());
          if (k == 0) {
            ev.feed(x.id(), q, feeds[qi]);
          } else {
            ev.state(wrt[k].id(), q)[i] -= delta;
          }
          return value;
        };
        const double numeric = (lossWith(kStep) - lossWith(-kStep)) / (2 * kStep);
        const double exact = analytic[k][qi][i];
        INFO(fmt::format("d loss / d {}[{}] on replica {}: autodiff {}, finite differences {}", wrt[k].name(),
                         i, q, exact, numeric));
        CHECK(std::abs(exact - numeric) <= 1e-6 * std::max({1.0, std::abs(exact), std::abs(numeric)}));
      }
    }
  }
  // Some of x is below lo and some above each bound of hi: every gradient is exercised.
  double loGradient = 0.0;
  for (int64_t q = 0; q < 2; ++q) loGradient += std::abs(analytic[1][static_cast<std::size_t>(q)][0]);
  CHECK(loGradient > 0.0);
}

// x exactly at the bounds: torch.clamp gives the gradient to x (lo <= x <=
// hi), none to the bound; below lo to lo, above hi to hi. One SGD step of
// rate 1 on sum(r * clip) moves each bound by minus the sum of r where it
// was selected, summed over the replicas' mean; the vectorized device and
// the per-replica reference agree bit for bit.
TEST_CASE("Clip by weight bounds: ties go to x as in torch.clamp, the same bits per replica") {
  const ClipByWeights m = clipByWeights(-0.5, {0.25, 0.5, 1.0, 0.125});
  const std::vector<float> xs = {-0.5f, -1.0f, 0.25f, 0.25f,  // lo tie, below lo, inside, above hi[3]
                                 0.25f, 0.5f,  1.0f,  2.0f,   // hi ties in columns 0..2, above hi[3]
                                 -2.0f, 3.0f,  -0.5f, 0.0f};  // below lo, above hi[1], lo tie, inside
  const OnnxTensor r = floats({3, 4}, 1.0f);
  std::vector<std::vector<float>> after;
  for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
    CAPTURE(toString(mode));
    OnnxModel model = importBytes(m.bytes);
    const TensorId lossId = model.graph.find(m.loss);
    TrainingSession session(std::move(model.graph), lossId, sgd(1.0), SessionOptions{},
                            makeSimDevice({}, mode));
    session.run({{"x", std::span<const float>(xs)}});
    const std::vector<float> lo = session.readVariable("lo").data;
    const std::vector<float> hi = session.readVariable("hi").data;
    float loStep = 0.0f;
    std::vector<float> hiStep(4, 0.0f);
    const std::vector<float> loInit = {-0.5f};
    const std::vector<float> hiInit = {0.25f, 0.5f, 1.0f, 0.125f};
    for (std::size_t k = 0; k < 12; ++k) {
      const auto rk = static_cast<float>(r.values[k]);
      if (xs[k] < loInit[0]) loStep += rk;
      if (xs[k] > hiInit[k % 4]) hiStep[k % 4] += rk;
    }
    CHECK(lo[0] == loInit[0] - loStep);
    for (std::size_t c = 0; c < 4; ++c) {
      CAPTURE(c);
      CHECK(hi[c] == hiInit[c] - hiStep[c]);
    }
    std::vector<float> both = lo;
    both.insert(both.end(), hi.begin(), hi.end());
    after.push_back(both);
  }
  CHECK(after[0] == after[1]);
}

TEST_CASE("Clip's bound that does not broadcast to x is refused with the node and the shapes named") {
  {
    // One value of a higher rank than x's is a scalar bound.
    OnnxBuilder builder;
    const std::string x = builder.addInputTensor("FLOAT", {3, 4}, "x");
    const std::string lo = builder.addInputTensor("FLOAT", {1, 1, 1}, "lo");
    const std::string y = builder.addNode("Clip", std::vector{x, lo})[0];
    builder.addOutputTensor(y);
    const OnnxModel model = importBytes(builder.modelProto());
    CHECK(model.graph.tensor(model.graph.find(y)).shape == Shape{3, 4});
  }
  OnnxBuilder builder;
  const std::string x = builder.addInputTensor("FLOAT", {3, 4}, "x");
  const std::string lo = builder.addInputTensor("FLOAT", {3}, "lo");
  builder.addOutputTensor(builder.addNode("Clip", std::vector{x, lo})[0]);
  const std::string bytes = builder.modelProto();
  const auto error = test::catchError<OnnxError>([&] { (void)importBytes(bytes); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::OnnxUnsupportedFeature);
  CHECK(error->detail() ==
        "the min bound \"lo\" is [3] and x [3, 4]; one value, or a shape that broadcasts to x's, expected");
}

// The run config of the PyTorch export `model` on the elements dataset: SGD
// as the reference, batches of 8 in file order, `replicas` replicas sharing
// the global batch.
RunConfig exportConfig(const nlohmann::json& r, int64_t replicas,
                       const std::string& model = "elements_classifier") {
  const int64_t globalBatch = r.at("globalBatch").get<int64_t>();
  const int64_t epochs = r.at("steps").get<int64_t>() * globalBatch / r.at("trainSamples").get<int64_t>();
  const nlohmann::json document = {{"model",
                                    {{"type", "Onnx"},
                                     {"path", test::sourcePath("tests/data/onnx/" + model + ".onnx")},
                                     {"loss", "loss"}}},
                                   {"optimizer", r.at("optimizer")},
                                   {"data",
                                    {{"dataset", "Tensors"},
                                     {"path", test::sourcePath("tests/data/onnx/elements_train.safetensors")},
                                     {"batchSize", globalBatch / replicas},
                                     {"epochs", epochs},
                                     {"shuffle", false}}}};
  const std::vector<std::string> overrides = {
      "/sessionOptions/enableReplicatedGraphs=" + std::string(replicas > 1 ? "true" : "false"),
      fmt::format("/sessionOptions/replicatedGraphCount={}", replicas),
      "/sessionOptions/accumulationAndReplicationReductionType=Mean"};
  return parseRunConfig(document.dump(), "elements.json", overrides).config;
}

TEST_CASE(
    "PyTorch's gather, scatter_add, scatter and clamp(min=tensor) export trains with its per-step losses") {
  const nlohmann::json r = test::readJson("tests/data/onnx/elements_training_reference.json");
  const std::vector<double> float32 = r.at("losses").get<std::vector<double>>();
  const std::vector<double> float64 = r.at("lossesFloat64").get<std::vector<double>>();
  const TrainSummary one = train(exportConfig(r, 1));
  REQUIRE(one.losses.size() == float32.size());
  double worst = 0.0;
  double worst64 = 0.0;
  for (std::size_t i = 0; i < float32.size(); ++i) {
    worst = std::max(worst, std::fabs(one.losses[i] - float32[i]));
    worst64 = std::max(worst64, std::fabs(one.losses[i] - float64[i]));
  }
  INFO(fmt::format("largest |loss - PyTorch float32| {:.3g}, |loss - PyTorch float64| {:.3g}", worst,
                   worst64));
  CHECK(worst <= 1e-5);
  CHECK(worst64 <= 1e-5);
  CHECK(one.losses.back() < one.losses.front());
  // Two replicas of half the batch: the losses of one replica.
  const TrainSummary two = train(exportConfig(r, 2));
  CHECK(test::worstRelativeDifference(two.losses, one.losses) <= 1e-6);
}

// torch.clamp(h, min=lo, max=hi) with scalar parameters (ONNX Clip of Casts
// of the weights) and torch.clamp(h, min=floor) with a per-feature one
// (ONNX Max): the losses are PyTorch's, and so are the bounds after the
// last step.
TEST_CASE("PyTorch's clamp by its own parameters trains its bounds to PyTorch's losses and values") {
  const nlohmann::json r = test::readJson("tests/data/onnx/clamp_training_reference.json");
  const std::vector<double> float32 = r.at("losses").get<std::vector<double>>();
  const std::vector<double> float64 = r.at("lossesFloat64").get<std::vector<double>>();
  const int64_t batch = r.at("globalBatch").get<int64_t>();
  const int64_t samples = r.at("trainSamples").get<int64_t>();
  const std::vector<float> xs = r.at("x").get<std::vector<float>>();
  const std::vector<int32_t> labels = r.at("labels").get<std::vector<int32_t>>();
  const int64_t features = static_cast<int64_t>(xs.size()) / samples;

  OnnxModel model = test::importWithBatch("clamp_classifier.onnx", batch);
  for (const char* bound : {"lo", "hi", "floor"})
    CHECK(std::find(model.weights.begin(), model.weights.end(), bound) != model.weights.end());
  const TensorId lossId = model.graph.find("loss");
  TrainingSession session(std::move(model.graph), lossId,
                          sgd(r.at("optimizer").at("learningRate").get<double>()), SessionOptions{},
                          makeSimDevice());
  std::vector<double> losses;
  for (std::size_t step = 0; step < float32.size(); ++step) {
    const auto first = static_cast<int64_t>(step) * batch % samples;
    const std::span<const float> x(xs.data() + first * features, static_cast<std::size_t>(batch * features));
    const std::span<const int32_t> y(labels.data() + first, static_cast<std::size_t>(batch));
    session.run({{"x", x}, {"labels", y}});
    losses.push_back(session.meanLoss());
  }
  INFO(fmt::format("largest relative difference to PyTorch float32 {:.3g}, to float64 {:.3g}",
                   test::worstRelativeDifference(losses, float32),
                   test::worstRelativeDifference(losses, float64)));
  CHECK(test::worstRelativeDifference(losses, float32) <= 1e-6);
  CHECK(test::worstRelativeDifference(losses, float64) <= 1e-5);
  const nlohmann::json& initial = r.at("initialBounds");
  const nlohmann::json& trained = r.at("trainedBounds");
  for (const char* bound : {"lo", "hi", "floor"}) {
    CAPTURE(bound);
    const std::vector<float> got = session.readVariable(bound).data;
    const std::vector<double> want = trained.at(bound).get<std::vector<double>>();
    const std::vector<double> start = initial.at(bound).get<std::vector<double>>();
    REQUIRE(got.size() == want.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      CAPTURE(k);
      // The bound moved, and to where PyTorch's did.
      CHECK(std::abs(want[k] - start[k]) > 1e-3);
      CHECK(std::abs(static_cast<double>(got[k]) - want[k]) <= 1e-5 * std::max(1.0, std::abs(want[k])));
    }
  }
  // Two replicas of half the batch: the losses of one replica.
  const TrainSummary one = train(exportConfig(r, 1, "clamp_classifier"));
  const TrainSummary two = train(exportConfig(r, 2, "clamp_classifier"));
  CHECK(test::worstRelativeDifference(one.losses, float32) <= 1e-6);
  CHECK(test::worstRelativeDifference(two.losses, one.losses) <= 1e-6);
}

}  // namespace
}  // namespace tessera
