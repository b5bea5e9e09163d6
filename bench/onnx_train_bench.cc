// The training step of an ONNX model exported from PyTorch (loss inside the
// graph, a symbolic batch axis named "batch"), imported and trained with
// plain SGD on the simulated device, with the same arguments and output
// line as the libtorch peers of the same models (bench/peer/torch_lenet.cpp,
// bench/peer/torch_gpt.cpp):
//
//   tessera_bench_onnx_train MODEL.onnx BATCH STEPS THREADS [--classes C] [--loss NAME] [--float16]
//
// Every graph input is fed one fixed batch: float inputs uniform in [0, 1),
// integer inputs (labels, tokens) uniform in [0, C) (default 10). THREADS is
// the device's host threads (DeviceSpec::numThreads; 0 takes
// TESSERA_NUM_THREADS or every CPU of the process). The loss is the tensor
// NAME (default "loss"). --float16 imports the model in float16
// (OnnxImportOptions::floatType), trained with the optimizer's float32 master
// weights and no loss scaling, as tessera_bench_mlp --float16.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

#include "tessera/app/dataset.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"

int main(int argc, char** argv) {
  std::vector<std::string> args;
  int64_t classes = 10;
  std::string lossName = "loss";
  bool float16 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--classes" && i + 1 < argc) {
      classes = std::atoll(argv[++i]);
    } else if (a == "--loss" && i + 1 < argc) {
      lossName = argv[++i];
    } else if (a == "--float16") {
      float16 = true;
    } else {
      args.push_back(a);
    }
  }
  const auto arg = [&](size_t i, int64_t fallback) {
    return i < args.size() ? std::atoll(args[i].c_str()) : fallback;
  };
  const int64_t batch = arg(1, 64);
  const int64_t steps = arg(2, 100);
  const int64_t threads = arg(3, 1);
  if (args.empty() || batch < 1 || steps < 1 || threads < 0 || threads > tessera::kMaxDeviceThreads ||
      classes < 1 || classes > INT32_MAX) {
    std::fprintf(stderr,
                 "usage: tessera_bench_onnx_train MODEL.onnx BATCH STEPS THREADS [--classes C] [--loss NAME] "
                 "[--float16] (THREADS 0: every CPU)\n");
    return 2;
  }
  try {
    if (!tessera::onnxSupported()) {
      std::fprintf(stderr, "error: this build of tessera cannot read ONNX models\n");
      return 1;
    }
    tessera::OnnxImportOptions import;
    import.dimensions = {{ "batch", batch }};
    if (float16) import.floatType = tessera::DType::Float16;
    tessera::OnnxModel model = tessera::importOnnx(args[0], import);
    const std::vector<tessera::DataInput> inputs = tessera::graphDataInputs(model.graph, model.inputs);
    const tessera::TensorId loss = model.graph.find(lossName);

    // Fixed data: a linear congruential generator, as tessera_bench_mlp.
    uint64_t state = 12345;
    const auto next = [&] {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<uint32_t>(state >> 33);
    };
    std::deque<std::vector<float>> floats;
    std::deque<std::vector<int32_t>> ints;
    std::vector<tessera::StepInput> feeds;
    for (const tessera::DataInput& input : inputs) {
      const auto elements = static_cast<size_t>(tessera::numElements(input.shape));
      if (tessera::isFloating(input.dtype)) {
        std::vector<float>& values = floats.emplace_back(elements);
        for (float& v : values) v = static_cast<float>(next() % 1000) / 1000.0f;
        feeds.emplace_back(input.name, std::span<const float>(values));
      } else {
        std::vector<int32_t>& values = ints.emplace_back(elements);
        for (int32_t& v : values) v = static_cast<int32_t>(next() % static_cast<uint64_t>(classes));
        feeds.emplace_back(input.name, std::span<const int32_t>(values));
      }
    }

    tessera::OptimizerConfig sgd;
    sgd.sgd.learningRate = 0.01;
    tessera::DeviceSpec spec;
    spec.numThreads = threads;
    tessera::TrainingSession session(std::move(model.graph), loss, tessera::makeOptimizer(sgd),
                                     tessera::SessionOptions{}, tessera::makeSimDevice(spec));
    for (int i = 0; i < 10; ++i) session.run(feeds);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) session.run(feeds);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "tessera model=%s batch=%lld threads=%lld steps=%lld dtype=%s loss=%.4f step_us=%.1f "
        "samples_per_s=%.0f\n",
        args[0].c_str(), static_cast<long long>(batch), static_cast<long long>(threads),
        static_cast<long long>(steps), float16 ? "float16" : "float32", session.meanLoss(),
        1e6 * seconds / static_cast<double>(steps), static_cast<double>(batch * steps) / seconds);
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
