// The C++ side of test_session.py's comparison: trains an ONNX model with
// the public C++ API on inputs the test wrote, and prints every step's
// per-replica losses in hexadecimal floating point, so that the test can
// compare the Python module's losses with these bit for bit.
//
//   python_reference_training MODEL INPUTS STEPS REPLICAS BATCH LEARNING_RATE MOMENTUM
//
// MODEL is an ONNX model with inputs x (float, [batch, ...]) and labels
// (int64, [batch]) and a scalar output "loss", e.g. tests/data/onnx/mlp.onnx.
// INPUTS holds, for each step, x then the labels (as int32) of the step in
// their host shapes [REPLICAS, BATCH, ...], raw and little-endian.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s MODEL INPUTS STEPS REPLICAS BATCH LEARNING_RATE MOMENTUM\n", argv[0]);
    return 2;
  }
  try {
    const int64_t steps = std::stoll(argv[3]);
    const int64_t replicas = std::stoll(argv[4]);
    const int64_t batch = std::stoll(argv[5]);
    tessera::OnnxImportOptions import;
    import.dimensions = {{ "batch", batch }};
    import.replicationFactor = replicas;
    tessera::OnnxModel model = tessera::importOnnx(argv[1], import);

    tessera::SessionOptions options;
    options.enableReplicatedGraphs = replicas > 1;
    options.replicatedGraphCount = replicas;
    options.accumulationAndReplicationReductionType = tessera::ReductionType::Mean;
    tessera::OptimizerConfig optimizer;
    optimizer.sgd.learningRate = std::stod(argv[6]);
    optimizer.sgd.momentum = std::stod(argv[7]);
    const tessera::TensorId loss = model.graph.find("loss");
    tessera::TrainingSession session(std::move(model.graph), loss, tessera::makeOptimizer(optimizer), options,
                                     tessera::makeSimDevice());

    std::vector<float> x(static_cast<size_t>(tessera::numElements(session.inputHostShape("x"))));
    std::vector<int32_t> labels(static_cast<size_t>(tessera::numElements(session.inputHostShape("labels"))));
    std::ifstream in(argv[2], std::ios::binary);
    for (int64_t step = 0; step < steps; ++step) {
      in.read(reinterpret_cast<char*>(x.data()), static_cast<std::streamsize>(x.size() * sizeof(float)));
      in.read(reinterpret_cast<char*>(labels.data()),
              static_cast<std::streamsize>(labels.size() * sizeof(int32_t)));
      if (!in) {
        std::fprintf(stderr, "%s: too short for %lld steps\n", argv[2], static_cast<long long>(steps));
        return 1;
      }
      session.run({tessera::StepInput("x", x), tessera::StepInput("labels", labels)});
      for (const float value : session.loss().data) std::printf("%a ", static_cast<double>(value));
      std::printf("\n");
    }
    return 0;
  } catch (const tessera::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
