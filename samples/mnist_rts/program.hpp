// The programs of the mnist_rts sample, built with the explicit API the way
// a PopXL user writes them by hand (see main.cc). A test also compares them
// with what the location transforms make from a plain graph.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/lib/ops.hpp"
#include "tessera/lib/session_options.hpp"

namespace mnist_rts {

using namespace tessera;

struct Options {
  int64_t replicationFactor = 1;
  int64_t batchSize = 8;
  int64_t testBatchSize = 80;
  int64_t epochs = 1;
  double lr = 0.05;
  bool rts = false;
  std::string dataset = "FashionMnist";
  std::string dataPath;
  int64_t limitTrainSamples = 0;
  int64_t limitTestSamples = 0;
  int64_t seed = 0;
  std::string summaryPath;
};

inline constexpr int64_t kHidden = 32;
inline constexpr int64_t kPixels = 28 * 28;
inline constexpr int64_t kClasses = 10;

struct InitialWeights {
  std::vector<float> w0, b0, w1, b1;
};
InitialWeights initialWeights(int64_t seed);

// One training step: forward, autodiff, gradients averaged over the
// replicas, then the updates; with opts.rts (and more than one replica) W0
// is a replica-sharded variable and W1 a remote replica-sharded one.
struct TrainProgram {
  Graph graph;
  Tensor loss;
};
TrainProgram buildTrainProgram(const Options& opts, const InitialWeights& init);

// Predictions of the test batch with plain variables.
struct TestProgram {
  Graph graph;
  Tensor predictions;
};
TestProgram buildTestProgram(const Options& opts, const InitialWeights& init);

SessionOptions sessionOptions(const Options& opts);

}  // namespace mnist_rts
