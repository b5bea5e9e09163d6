// The models exported from PyTorch train to the same bits at any thread
// count of the device: the LeNet CNN (convolutions split by samples, their
// weight gradients by blocks of the product, pools by planes) and the GPT
// block (batched products, softmax, LayerNorm, gathers) and the recurrent
// classifiers (recurrences split by lanes, their weight gradients by rows),
// at R = 1 and 2.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "tessera/app/checkpoint.hpp"
#include "tessera/app/dataset.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

constexpr int64_t kSteps = 3;

struct Trained {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> weights;
  std::vector<uint8_t> checkpoint;
};

// `steps` SGD-with-momentum steps of the model on fresh pseudo-random
// batches: float inputs in [0, 1), integer inputs in [0, classes).
Trained train(const std::string& file, int64_t globalBatch, int64_t replicas, int64_t classes, int threads) {
  OnnxImportOptions import;
  import.dimensions = {{ "batch", globalBatch / replicas }};
  import.replicationFactor = replicas;
  OnnxModel model = importOnnx(test::sourcePath("tests/data/onnx/" + file), import);
  const std::vector<DataInput> inputs = graphDataInputs(model.graph, model.inputs);
  SessionOptions options;
  options.enableReplicatedGraphs = replicas > 1;
  options.replicatedGraphCount = replicas;
  options.accumulationAndReplicationReductionType = ReductionType::Mean;
  OptimizerConfig sgd;
  sgd.sgd.learningRate = 0.05;
  sgd.sgd.momentum = 0.9;
  DeviceSpec spec;
  spec.numThreads = threads;
  const TensorId loss = model.graph.find("loss");
  TrainingSession session(std::move(model.graph), loss, makeOptimizer(sgd), options, makeSimDevice(spec));

  uint64_t state = 11;
  const auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  std::vector<std::vector<float>> floats(inputs.size());
  std::vector<std::vector<int32_t>> ints(inputs.size());
  Trained out;
  for (int64_t step = 0; step < kSteps; ++step) {
    std::vector<StepInput> feeds;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const auto elements = static_cast<std::size_t>(replicas * numElements(inputs[i].shape));
      if (inputs[i].dtype == DType::Float32) {
        floats[i].resize(elements);
        for (float& v : floats[i]) v = static_cast<float>(next() % 1000) / 1000.0f;
        feeds.emplace_back(inputs[i].name, std::span<const float>(floats[i]));
      } else {
        ints[i].resize(elements);
        for (int32_t& v : ints[i]) v = static_cast<int32_t>(next() % static_cast<uint32_t>(classes));
        feeds.emplace_back(inputs[i].name, std::span<const int32_t>(ints[i]));
      }
    }
    session.run(feeds);
    out.losses.push_back(session.meanLoss());
  }
  for (auto& [name, tensor] : session.readWeights()) out.weights.emplace(name, tensor.data);
  out.checkpoint = encodeCheckpoint(makeCheckpoint(session));
  return out;
}

void checkSameBits(const std::string& file, int64_t globalBatch, int64_t classes) {
  for (const int64_t replicas : {int64_t{1}, int64_t{2}}) {
    CAPTURE(replicas);
    const Trained one = train(file, globalBatch, replicas, classes, 1);
    REQUIRE(one.losses.size() == kSteps);
    // The run trains: a loss that did not move would compare equal trivially.
    CHECK(one.losses.front() != one.losses.back());
    for (const int threads : {2, 3}) {
      CAPTURE(threads);
      const Trained other = train(file, globalBatch, replicas, classes, threads);
      CHECK(other.losses == one.losses);  // exact
      REQUIRE(other.weights.size() == one.weights.size());
      for (const auto& weight : one.weights) {
        CAPTURE(weight.first);
        CHECK(other.weights.at(weight.first) == weight.second);
      }
      CHECK(other.checkpoint == one.checkpoint);
    }
  }
}

TEST_CASE("LeNet trains to the same bits at 1, 2 and 3 threads, at R = 1 and 2") {
  // Batch 16: every convolution, its weight gradient and the first pool
  // are split over the threads.
  checkSameBits("lenet.onnx", 16, 10);
}

TEST_CASE("the GPT block trains to the same bits at 1, 2 and 3 threads, at R = 1 and 2") {
  checkSameBits("gpt_block.onnx", 32, 32);
}

TEST_CASE("the GRU, bidirectional LSTM and RNN classifiers train to the same bits at 1, 2 and 3 threads") {
  for (const char* file : {"gru_classifier.onnx", "bilstm_classifier.onnx", "rnn_classifier.onnx"}) {
    CAPTURE(file);
    checkSameBits(file, 8, 3);
  }
}

}  // namespace
}  // namespace tessera
