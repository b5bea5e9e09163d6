// Training an ONNX model exported from PyTorch through the public API: the
// export (loss inside the graph, a symbolic batch axis) is imported with the
// batch bound to the per-replica batch size, its inputs are fed from a
// .safetensors file with a tensor per graph input, and a TrainingSession
// trains it from the model's own initializers, as it trains a graph built
// with tessera/lib/ops.hpp.
//
//   onnx_training FOLDER [--replicas R] [--epochs E]
//
// FOLDER holds mlp.onnx, train.safetensors and test.safetensors
// (samples/configs/mlp_onnx). The run trains with a global batch of 8 over R
// replicas (Mean reduction), then trains again on one replica and checks
// that both runs computed the same per-step losses and that the loss went
// down; it exits non-zero when a check fails.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "tessera/app/dataset.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"

namespace {

constexpr int64_t kGlobalBatch = 8;

struct Run {
  std::vector<double> losses;  // per step
  double testLoss = 0.0;
};

// One training run of `epochs` epochs over `replicas` replicas.
Run trainOnnx(const std::string& folder, int64_t replicas, int64_t epochs) {
  const int64_t batch = kGlobalBatch / replicas;
  tessera::OnnxImportOptions import;
  import.dimensions = {{ "batch", batch }};  // torch's dynamic axis, per replica
  import.replicationFactor = replicas;
  tessera::OnnxModel model = tessera::importOnnx(folder + "/mlp.onnx", import);

  // The file's tensor of each input's name feeds that input, samples along axis 0.
  const std::vector<tessera::DataInput> inputs = tessera::graphDataInputs(model.graph, model.inputs);
  const tessera::TensorSplit train = tessera::readTensorSplit(folder + "/train.safetensors", inputs);
  const tessera::TensorSplit test = tessera::readTensorSplit(folder + "/test.safetensors", inputs);

  tessera::SessionOptions options;
  options.enableReplicatedGraphs = replicas > 1;
  options.replicatedGraphCount = replicas;
  options.accumulationAndReplicationReductionType = tessera::ReductionType::Mean;
  tessera::OptimizerConfig optimizer;
  optimizer.sgd.learningRate = 0.05;
  optimizer.sgd.momentum = 0.9;
  const tessera::TensorId loss = model.graph.find("loss");
  tessera::TrainingSession session(model.graph, loss, tessera::makeOptimizer(optimizer), options,
                                   tessera::makeSimDevice());

  // Host buffers [replicas, batch, ...] of one step: the global batch in order.
  std::vector<float> x(static_cast<size_t>(kGlobalBatch * train.find("x")->sampleElements()));
  std::vector<int32_t> labels(static_cast<size_t>(kGlobalBatch));
  Run run;
  const int64_t steps = train.count / kGlobalBatch;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    const std::vector<int64_t> order = tessera::epochOrder(train.count, /*seed=*/1, epoch, /*shuffle=*/true);
    for (int64_t step = 0; step < steps; ++step) {
      tessera::fillTensorBatch(*train.find("x"), order, step * kGlobalBatch, x);
      tessera::fillTensorBatch(*train.find("labels"), order, step * kGlobalBatch, labels);
      session.run({tessera::StepInput("x", x), tessera::StepInput("labels", labels)});
      run.losses.push_back(session.meanLoss());
    }
  }

  // The test loss with the trained weights: an inference session of the
  // same model, the weights copied by name.
  tessera::InferenceSession inference(std::move(model.graph), {"loss"}, options, tessera::makeSimDevice());
  inference.writeWeights(session.readWeights());
  const std::vector<int64_t> order = tessera::epochOrder(test.count, 0, 0, false);
  const int64_t testSteps = test.count / kGlobalBatch;
  for (int64_t step = 0; step < testSteps; ++step) {
    tessera::fillTensorBatch(*test.find("x"), order, step * kGlobalBatch, x);
    tessera::fillTensorBatch(*test.find("labels"), order, step * kGlobalBatch, labels);
    inference.run({tessera::StepInput("x", x), tessera::StepInput("labels", labels)});
    for (const float value : inference.output("loss").data) run.testLoss += value;
  }
  run.testLoss /= static_cast<double>(testSteps * replicas);
  return run;
}

double mean(const std::vector<double>& values, size_t first, size_t count) {
  double sum = 0.0;
  for (size_t i = first; i < first + count; ++i) sum += values[i];
  return sum / static_cast<double>(count);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: onnx_training FOLDER [--replicas R] [--epochs E]\n");
    return 2;
  }
  const std::string folder = argv[1];
  int64_t replicas = 2;
  int64_t epochs = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const int64_t value = std::stoll(argv[i + 1]);
    if (flag == "--replicas")
      replicas = value;
    else if (flag == "--epochs")
      epochs = value;
  }
  if (replicas < 1 || kGlobalBatch % replicas != 0 || epochs < 1) {
    std::fprintf(stderr, "--replicas must divide %lld and --epochs be >= 1\n",
                 static_cast<long long>(kGlobalBatch));
    return 2;
  }
  try {
    if (!tessera::onnxSupported()) {
      std::fprintf(stderr, "this build of tessera cannot read ONNX models\n");
      return 1;
    }
    const Run run = trainOnnx(folder, replicas, epochs);
    const Run single = trainOnnx(folder, 1, epochs);
    const size_t perEpoch = run.losses.size() / static_cast<size_t>(epochs);
    const double first = mean(run.losses, 0, perEpoch);
    const double last = mean(run.losses, run.losses.size() - perEpoch, perEpoch);
    double worst = 0.0;
    for (size_t i = 0; i < run.losses.size(); ++i) {
      worst = std::max(worst, std::fabs(run.losses[i] - single.losses[i]) / std::fabs(single.losses[i]));
    }
    fmt::print("{} steps over {} replicas (global batch {})\n", run.losses.size(), replicas, kGlobalBatch);
    fmt::print("mean loss: first epoch {:.4f}, last epoch {:.4f}\n", first, last);
    fmt::print("test loss: {:.4f}\n", run.testLoss);
    fmt::print("largest relative difference from one replica: {:.2e}\n", worst);
    int failures = 0;
    if (!(last < first)) {
      fmt::print("FAIL the loss did not go down\n");
      ++failures;
    }
    if (!(worst <= 1e-5)) {
      fmt::print("FAIL {} replicas and one replica computed different losses\n", replicas);
      ++failures;
    }
    if (!(std::fabs(run.testLoss - single.testLoss) <= 1e-5 * std::fabs(single.testLoss))) {
      fmt::print("FAIL the test losses differ: {} and {}\n", run.testLoss, single.testLoss);
      ++failures;
    }
    return failures == 0 ? 0 : 1;
  } catch (const tessera::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
