// A PyTorch export of LeNet-5 (two convolutions with max pools, three linear
// layers, the cross-entropy loss inside the graph) imports and runs forward
// on the simulated device with PyTorch's loss and logits, at several batch
// sizes and replication factors, and trains: one SGD step moves the weights
// as PyTorch's does, through every gradient kernel of the convolutions and
// pools.
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
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

using nlohmann::json;

const json& reference() {
  static const json value = test::readJson("tests/data/onnx/lenet_reference.json");
  return value;
}

using test::relativeDifference;
using test::replicated;

OnnxModel importLeNet(int64_t batchPerReplica, int64_t replicas) {
  return test::importWithBatch("lenet.onnx", batchPerReplica, replicas);
}

}  // namespace

TEST_CASE("LeNet imports as convolutions, max pools and GEMMs with its weights as variables") {
  const OnnxModel model = importLeNet(2, 1);
  const Graph& graph = model.graph;
  int convs = 0;
  int pools = 0;
  for (const OpNode& op : graph.ops()) {
    convs += op.kind == OpKind::Conv ? 1 : 0;
    pools += op.kind == OpKind::MaxPool ? 1 : 0;
  }
  CHECK(convs == 2);
  CHECK(pools == 2);
  CHECK(graph.tensor(graph.find("image")).shape == Shape{2, 1, 28, 28});
  CHECK(graph.tensor(graph.find("conv1.weight")).shape == Shape{6, 1, 5, 5});
  CHECK(graph.tensor(graph.find("conv2.weight")).category == TensorCategory::Weight);
  CHECK(graph.tensor(graph.find("logits")).shape == Shape{2, 10});
}

TEST_CASE("LeNet's forward loss and logits equal PyTorch's at every batch size and replication factor") {
  for (const json& c : reference().at("cases")) {
    const auto batch = c.at("batch").get<int64_t>();
    std::vector<float> image;
    for (const json& p : c.at("pixels")) image.push_back(static_cast<float>(p.get<int>()) / 255.0f);
    const std::vector<int32_t> labels = c.at("labels").get<std::vector<int32_t>>();
    const std::vector<float> logits = c.at("logits").get<std::vector<float>>();
    const double loss = c.at("loss").get<double>();
    for (int64_t replicas : {1, 2, 4}) {
      if (batch % replicas != 0) continue;
      CAPTURE(batch);
      CAPTURE(replicas);
      // Replica r takes the r-th slice of the batch.
      OnnxModel model = importLeNet(batch / replicas, replicas);
      InferenceSession session(std::move(model.graph), model.outputs, replicated(replicas), makeSimDevice());
      session.run({StepInput("image", image), StepInput("labels", labels)});
      const HostTensor& losses = session.output("loss");
      REQUIRE(losses.data.size() == static_cast<std::size_t>(replicas));
      double mean = 0;
      for (float l : losses.data) mean += l / static_cast<double>(replicas);
      CHECK(relativeDifference(mean, loss) <= 1e-5);
      const HostTensor& got = session.output("logits");
      REQUIRE(got.data.size() == logits.size());
      for (std::size_t k = 0; k < logits.size(); ++k) {
        CAPTURE(k);
        CHECK(std::fabs(got.data[k] - logits[k]) <=
              1e-5 * std::max(1.0, std::fabs(static_cast<double>(logits[k]))));
      }
    }
  }
}

TEST_CASE("LeNet trains: one SGD step moves the weights as PyTorch's does, on 1, 2 and 4 replicas") {
  const json& c = reference().at("cases").back();
  const auto batch = c.at("batch").get<int64_t>();
  std::vector<float> image;
  for (const json& p : c.at("pixels")) image.push_back(static_cast<float>(p.get<int>()) / 255.0f);
  const std::vector<int32_t> labels = c.at("labels").get<std::vector<int32_t>>();
  for (int64_t replicas : {1, 2, 4}) {
    CAPTURE(replicas);
    OnnxModel model = importLeNet(batch / replicas, replicas);
    const TensorId loss = model.graph.find("loss");
    SessionOptions options = replicated(replicas);
    options.accumulationAndReplicationReductionType = ReductionType::Mean;
    OptimizerConfig sgd;
    sgd.sgd.learningRate = 0.1;
    TrainingSession session(std::move(model.graph), loss, makeOptimizer(sgd), options, makeSimDevice());
    session.run({StepInput("image", image), StepInput("labels", labels)});
    CHECK(relativeDifference(session.meanLoss(), c.at("loss").get<double>()) <= 1e-5);
    std::set<std::string> checked;
    for (const auto& weight : session.readWeights()) {
      const std::string& name = weight.first;
      const HostTensor& value = weight.second;
      if (!reference().at("sgdStep").contains(name)) continue;
      CAPTURE(name);
      const std::vector<float> want = reference().at("sgdStep").at(name).get<std::vector<float>>();
      REQUIRE(value.data.size() == want.size());
      for (std::size_t k = 0; k < want.size(); ++k) {
        CAPTURE(k);
        CHECK(std::fabs(value.data[k] - want[k]) <=
              1e-5 * std::max(1.0, std::fabs(static_cast<double>(want[k]))));
      }
      checked.insert(name);
    }
    CHECK(checked.size() == 4);
    const double first = session.meanLoss();
    for (int step = 0; step < 3; ++step)
      session.run({StepInput("image", image), StepInput("labels", labels)});
    CHECK(session.meanLoss() < first);
  }
}

}  // namespace tessera
