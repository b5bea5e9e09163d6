// The transformer model config against PyTorch: tests/data/onnx/generate.py
// (gpt2_layout) exports a tiny GPT of the transformer's exact layout, with its
// parameter names, tied (gpt2_layout.onnx) and untied (gpt2_layout_untied.onnx),
// and PyTorch's loss for fixed sequences. The transformer built from the
// config, given the export's weights by name, computes the loss of PyTorch
// and of the ONNX import of the same module, at several batch sizes and
// replication factors.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/simdevice/device.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"
#include "tessera/app/transformer.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

using nlohmann::json;

const json& reference() {
  static const json value = [] {
    std::ifstream in(test::sourcePath("tests/data/onnx/gpt2_layout_reference.json"), std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return json::parse(text.str());
  }();
  return value;
}

TransformerConfig tinyConfig(bool tied) {
  const json& r = reference();
  TransformerConfig config;
  config.layers = r.at("layers").get<int64_t>();
  config.hidden = r.at("hidden").get<int64_t>();
  config.heads = r.at("heads").get<int64_t>();
  config.vocab = r.at("vocab").get<int64_t>();
  config.sequence = r.at("sequence").get<int64_t>();
  config.tiedHead = tied;
  return config;
}

OnnxModel importTiny(const std::string& name, int64_t batchPerReplica, int64_t replicas) {
  OnnxImportOptions options;
  options.dimensions = {{"batch", batchPerReplica}};
  options.replicationFactor = replicas;
  return importOnnx(test::sourcePath("tests/data/onnx/" + name + ".onnx"), options);
}

// The mean over replicas of the loss of `graph` on the case's sequences.
double lossOf(Graph graph, const std::string& loss, int64_t replicas, const json& c) {
  const std::vector<int32_t> tokens = c.at("tokens").get<std::vector<int32_t>>();
  const std::vector<int32_t> targets = c.at("targets").get<std::vector<int32_t>>();
  SessionOptions options;
  options.enableReplicatedGraphs = replicas > 1;
  options.replicatedGraphCount = replicas;
  InferenceSession session(std::move(graph), {loss}, options, makeSimDevice());
  session.run({StepInput("tokens", tokens), StepInput("targets", targets)});
  const HostTensor& losses = session.output(loss);
  REQUIRE(losses.data.size() == static_cast<std::size_t>(replicas));
  double mean = 0;
  for (float l : losses.data) mean += l / static_cast<double>(replicas);
  return mean;
}

TEST_CASE("the transformer has the parameters of the PyTorch module, by name, shape and count") {
  for (const bool tied : {true, false}) {
    const std::string name = tied ? "gpt2_layout" : "gpt2_layout_untied";
    CAPTURE(name);
    const TransformerConfig config = tinyConfig(tied);
    const TransformerGraph built = buildTransformer(config, 2, 1, 0);
    const OnnxModel imported = importTiny(name, 2, 1);
    std::vector<std::string> names;
    int64_t count = 0;
    for (const TensorId id : built.weights) {
      const TensorNode& node = built.graph.tensor(id);
      names.push_back(node.name);
      count += numElements(node.shape);
      CHECK(node.category == TensorCategory::Weight);
      CHECK(node.shape == imported.graph.tensor(imported.graph.find(node.name)).shape);
    }
    CHECK(names == reference().at(name).at("parameters").get<std::vector<std::string>>());
    CHECK(transformerParameterCount(config) == count);
  }
}

TEST_CASE(
    "the transformer's loss equals PyTorch's and the ONNX import's, tied and untied, at R = 1, 2 and 4") {
  for (const bool tied : {true, false}) {
    const std::string name = tied ? "gpt2_layout" : "gpt2_layout_untied";
    const std::vector<double> losses = reference().at(name).at("losses").get<std::vector<double>>();
    const json& cases = reference().at("cases");
    REQUIRE(cases.size() == losses.size());
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const json& c = cases[k];
      const auto batch = c.at("batch").get<int64_t>();
      for (const int64_t replicas : {1, 2, 4}) {
        if (batch % replicas != 0) continue;
        CAPTURE(name);
        CAPTURE(batch);
        CAPTURE(replicas);
        OnnxModel imported = importTiny(name, batch / replicas, replicas);
        TransformerGraph built = buildTransformer(tinyConfig(tied), batch / replicas, replicas, 0);
        for (const TensorId id : built.weights) {
          TensorNode& node = built.graph.tensor(id);
          node.initial = imported.graph.tensor(imported.graph.find(node.name)).initial;
        }
        const std::string loss = built.graph.tensor(built.loss).name;
        const double transformer = lossOf(std::move(built.graph), loss, replicas, c);
        const double onnx = lossOf(std::move(imported.graph), imported.outputs.at(0), replicas, c);
        const double torch = losses[k];
        CHECK(std::fabs(transformer - torch) <= 1e-5 * std::fabs(torch));
        CHECK(std::fabs(transformer - onnx) <= 1e-5 * std::fabs(onnx));
      }
    }
  }
}

// Per-step losses of `steps` Adam steps on the case's sequences.
std::vector<double> trainLosses(Graph graph, TensorId loss, const json& c, int steps) {
  const std::vector<int32_t> tokens = c.at("tokens").get<std::vector<int32_t>>();
  const std::vector<int32_t> targets = c.at("targets").get<std::vector<int32_t>>();
  OptimizerConfig adam;
  adam.type = OptimizerType::Adam;
  adam.adam.learningRate = 0.01;
  TrainingSession session(std::move(graph), loss, makeOptimizer(adam), SessionOptions{}, makeSimDevice());
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    session.run({StepInput("tokens", tokens), StepInput("targets", targets)});
    losses.push_back(session.meanLoss());
  }
  return losses;
}

TEST_CASE("training the transformer and the ONNX import from the same weights gives the same losses") {
  const json& c = reference().at("cases").at(2);
  const auto batch = c.at("batch").get<int64_t>();
  for (const bool tied : {true, false}) {
    const std::string name = tied ? "gpt2_layout" : "gpt2_layout_untied";
    CAPTURE(name);
    OnnxModel imported = importTiny(name, batch, 1);
    TransformerGraph built = buildTransformer(tinyConfig(tied), batch, 1, 0);
    for (const TensorId id : built.weights) {
      TensorNode& node = built.graph.tensor(id);
      node.initial = imported.graph.tensor(imported.graph.find(node.name)).initial;
    }
    const TensorId importedLoss = imported.graph.find(imported.outputs.at(0));
    const std::vector<double> transformer = trainLosses(std::move(built.graph), built.loss, c, 5);
    const std::vector<double> onnx = trainLosses(std::move(imported.graph), importedLoss, c, 5);
    CHECK(transformer.front() == doctest::Approx(reference().at(name).at("losses").at(2).get<double>()).epsilon(1e-5));
    // The gradients agree too: the losses after each update stay together, and fall.
    for (std::size_t k = 0; k < transformer.size(); ++k) CHECK(transformer[k] == doctest::Approx(onnx[k]).epsilon(1e-5));
    CHECK(transformer.back() < transformer.front());
  }
}

TEST_CASE("with the seeded initial values the loss differs from the export's: the weights by name matter") {
  const json& c = reference().at("cases").at(1);
  const auto batch = c.at("batch").get<int64_t>();
  TransformerGraph built = buildTransformer(tinyConfig(true), batch, 1, 0);
  const std::string loss = built.graph.tensor(built.loss).name;
  const double seeded = lossOf(std::move(built.graph), loss, 1, c);
  const double torch = reference().at("gpt2_layout").at("losses").at(1).get<double>();
  CHECK(std::fabs(seeded - torch) > 1e-2);
  // GPT-2's initialisation (stddev 0.02) gives nearly uniform predictions: about log(vocab).
  CHECK(std::fabs(seeded - std::log(24.0)) < 0.05);
}

}  // namespace
}  // namespace tessera
