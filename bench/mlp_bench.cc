// The training step of an MLP 784-H1-H2-10 (ReLU, softmax cross-entropy, SGD
// with momentum 0.9) on the simulated device, with the same arguments and
// output line as the peer benchmarks (hand-written Eigen, libtorch):
//
//   tessera_bench_mlp BATCH STEPS THREADS H1 H2 [--replicas R] [--rts] [--rts-min-elements N]
//                     [--offchip-state] [--float16]
//
// BATCH is the batch per replica; with R replicas each step trains on
// R x BATCH samples. THREADS is the device's host threads
// (DeviceSpec::numThreads); 0 takes TESSERA_NUM_THREADS or every CPU of
// the process (what `tessera launch` divides among its instances).
// --rts shards the weights and the momentum over all replicas (those of at
// least N elements with --rts-min-elements N; the default is the options'
// minElementsForReplicatedTensorSharding, 8192, and the main job's config
// samples/configs/mnist_rts.json uses 2); --offchip-state keeps the momentum
// in streaming memory. --float16 builds the model in float16 (weights and
// activations stored as half, the logits cast to float32 for the loss), with
// the optimizer's float32 master weights.
//
// Besides the samples per second, the line gives setup_s, the seconds from
// the start of main until the session is ready for its first step (building
// the graph, the transforms, planning and loading the program, making the
// initial values), and peak_rss_mb, the process's peak resident memory when
// it ends (getrusage), so that a run per replica count shows how the host
// cost grows with R.
//
// Under `tessera launch --num-replicas R --num-instances P -- tessera_bench_mlp ...`
// the launcher's R replicas replace --replicas, each instance feeds its own
// replicas, and instance 0 prints the line with the samples per second of
// the whole run.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "tessera/simdevice/device_spec.hpp"
#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"

namespace {

// The process's peak resident set, in MiB (Linux reports ru_maxrss in KiB).
double peakResidentMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto processStart = std::chrono::steady_clock::now();
  std::vector<std::string> args;
  int64_t replicas = 1;
  bool rts = false;
  bool offChipState = false;
  bool float16 = false;
  int64_t rtsMinElements = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--replicas" && i + 1 < argc) {
      replicas = std::atoll(argv[++i]);
    } else if (a == "--rts") {
      rts = true;
    } else if (a == "--rts-min-elements" && i + 1 < argc) {
      rtsMinElements = std::atoll(argv[++i]);
    } else if (a == "--offchip-state") {
      offChipState = true;
    } else if (a == "--float16") {
      float16 = true;
    } else {
      args.push_back(a);
    }
  }
  const auto arg = [&](size_t i, int64_t fallback) { return i < args.size() ? std::atoll(args[i].c_str()) : fallback; };
  const int64_t batch = arg(0, 64);
  const int64_t steps = arg(1, 200);
  const int64_t threads = arg(2, 1);
  const int64_t h1 = arg(3, 256);
  const int64_t h2 = arg(4, 128);
  if (batch < 1 || steps < 1 || threads < 0 || threads > tessera::kMaxDeviceThreads || h1 < 1 || h2 < 1 ||
      replicas < 1 || (rtsMinElements < 0 && rtsMinElements != -1)) {
    std::fprintf(
        stderr,
        "usage: tessera_bench_mlp BATCH STEPS THREADS H1 H2 [--replicas R] [--rts] [--rts-min-elements N] "
        "[--offchip-state] [--float16] "
        "(THREADS 0: every CPU)\n");
    return 2;
  }
  try {
    const tessera::dist::DistEnv env = tessera::dist::readDistEnv();
    if (env.set) replicas = env.numTotalReplicas;
    tessera::ModelConfig model;
    model.layers = {784, h1, h2, 10};
    if (float16) model.dtype = tessera::DType::Float16;
    tessera::MlpGraph mlp = tessera::buildMlp(model, batch, replicas, 0);
    tessera::SessionOptions options;
    options.enableReplicatedGraphs = replicas > 1;
    options.replicatedGraphCount = replicas;
    options.accumulationAndReplicationReductionType = tessera::ReductionType::Mean;
    if (rts) {
      // Weights and momentum sharded over all replicas.
      for (auto category : {tessera::TensorCategory::Weight, tessera::TensorCategory::OptimizerState}) {
        tessera::TensorLocationSettings& settings = options.locationSettings(category);
        settings.location.replicatedTensorSharding = tessera::ReplicatedTensorSharding::On;
        if (rtsMinElements >= 0) settings.minElementsForReplicatedTensorSharding = rtsMinElements;
      }
    }
    if (offChipState) {
      options.optimizerStateTensorLocationSettings.location.storage = tessera::TensorStorage::OffChip;
    }
    tessera::dist::configureSessionOptions(options, env);
    tessera::OptimizerConfig sgd;
    sgd.sgd.learningRate = 0.05;
    sgd.sgd.momentum = 0.9;
    // Under the launcher, each instance simulates its replicas and reaches the others.
    tessera::DeviceSpec spec;
    spec.numThreads = threads;
    std::unique_ptr<tessera::Device> device = tessera::makeSimDevice(spec);
    if (env.numInstances > 1) {
      device = tessera::makeSimDevice(spec, tessera::ExecutionMode::Vectorized,
                                      tessera::dist::instanceCommunicator());
    }
    tessera::TrainingSession session(std::move(mlp.graph), mlp.loss, tessera::makeOptimizer(sgd), options,
                                     std::move(device));

    // Fixed data, as the peers use: uniform inputs and random labels.
    const int64_t samples = options.getLocalReplicationFactor() * batch;
    std::vector<float> x(static_cast<size_t>(samples * 784));
    std::vector<int32_t> y(static_cast<size_t>(samples));
    uint64_t state = 12345;
    const auto next = [&] {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<uint32_t>(state >> 33);
    };
    for (float& v : x) v = 0.1f * static_cast<float>(next() % 1000) / 1000.0f;
    for (int32_t& v : y) v = static_cast<int32_t>(next() % 10);

    const double setupSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - processStart).count();
    const tessera::StepInput inputs[] = {{"input", std::span<const float>(x)}, {"labels", std::span<const int32_t>(y)}};
    for (int i = 0; i < 20; ++i) session.run(inputs);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) session.run(inputs);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (env.instanceIndex != 0) return 0;
    std::printf(
        "tessera batch=%lld threads=%lld steps=%lld replicas=%lld dtype=%s loss=%.4f step_us=%.1f samples_per_s=%.0f "
        "setup_s=%.3f peak_rss_mb=%.1f\n",
        static_cast<long long>(batch), static_cast<long long>(threads), static_cast<long long>(steps),
        static_cast<long long>(replicas), float16 ? "float16" : "float32", session.meanLoss(), 1e6 * seconds / static_cast<double>(steps),
        static_cast<double>(replicas * batch * steps) / seconds, setupSeconds, peakResidentMiB());
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    tessera::dist::abortInstances(1);
    return 1;
  }
  return 0;
}
