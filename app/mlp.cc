#include "tessera/app/mlp.hpp"

#include <cmath>
#include <numbers>
#include <string>

#include <fmt/format.h>

#include "tessera/lib/error.hpp"

namespace tessera {
namespace {

// splitmix64: a tiny, well-mixed generator fully specified by its code.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1]: never 0, so log() below is finite.
  double uniform() { return (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

Tensor applyActivation(Activation activation, Tensor x) {
  switch (activation) {
    case Activation::Relu: return ops::relu(x);
    case Activation::Gelu: return ops::gelu(x);
    case Activation::Tanh: return ops::tanh(x);
    case Activation::Sigmoid: return ops::sigmoid(x);
  }
  return x;
}

}  // namespace

void fillNormal(std::span<float> out, uint64_t seed, double stddev) {
  SplitMix64 rng(seed);
  const std::size_t count = out.size();
  for (std::size_t i = 0; i < count; i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(rng.uniform()));
    const double angle = 2.0 * std::numbers::pi * rng.uniform();
    out[i] = static_cast<float>(stddev * radius * std::cos(angle));
    if (i + 1 < count) out[i + 1] = static_cast<float>(stddev * radius * std::sin(angle));
  }
}

std::vector<float> normalSamples(int64_t count, uint64_t seed, double stddev) {
  std::vector<float> out(static_cast<size_t>(count));
  fillNormal(out, seed, stddev);
  return out;
}

InitialValues normalValues(int64_t count, uint64_t seed, double stddev) {
  return InitialValues::generated(count, fmt::format("normal(seed {}, stddev {})", seed, stddev),
                                  [seed, stddev](std::span<float> out) { fillNormal(out, seed, stddev); });
}

MlpGraph buildMlp(const ModelConfig& model, int64_t batchSize, int64_t replicationFactor, int64_t seed) {
  if (model.type != kMlpModel) {
    throw ConfigError(ErrorCode::InvalidModel, "/model/type",
                      fmt::format("unknown model type \"{}\"; expected \"{}\"", model.type, kMlpModel));
  }
  if (model.layers.size() < 2) {
    throw ConfigError(ErrorCode::InvalidModel, "/model/layers",
                      fmt::format("{} layer width(s) given; an MLP needs at least 2 (inputs and classes)",
                                  model.layers.size()));
  }
  for (size_t i = 0; i < model.layers.size(); ++i) {
    if (model.layers[i] < 1) {
      throw ConfigError(ErrorCode::InvalidModel, fmt::format("/model/layers/{}", i),
                        fmt::format("layer width {} must be >= 1", model.layers[i]));
    }
  }
  if (batchSize < 1) {
    throw ConfigError(ErrorCode::InvalidData, "/data/batchSize",
                      fmt::format("batch size {} must be >= 1", batchSize));
  }
  if (!isFloating(model.dtype)) {
    throw ConfigError(ErrorCode::InvalidModel, "/model/dtype",
                      fmt::format("dtype \"{}\" is not a model dtype; expected \"float32\" or \"float16\"",
                                  toString(model.dtype)));
  }
  const DType dtype = model.dtype;

  MlpGraph mlp;
  mlp.graph = Graph(replicationFactor);
  Graph& g = mlp.graph;
  Tensor x = ops::input(g, "input", {batchSize, model.layers.front()}, dtype);
  Tensor labels = ops::input(g, "labels", {batchSize}, DType::Int32);
  mlp.input = x.id();
  mlp.labels = labels.id();

  const size_t numLayers = model.layers.size() - 1;
  for (size_t i = 0; i < numLayers; ++i) {
    const int64_t in = model.layers[i];
    const int64_t out = model.layers[i + 1];
    // He-normal: stddev sqrt(2 / fan_in). Each layer draws from its own
    // stream so that changing one width leaves the others' values alone.
    const uint64_t layerSeed = static_cast<uint64_t>(seed) * 1000003ull + i;
    const Tensor w =
        ops::variable(g, fmt::format("W{}", i), normalValues(in * out, layerSeed, std::sqrt(2.0 / in)), {in, out},
                      std::nullopt, RetrievalMode::OnePerGroup, TensorCategory::Weight, dtype);
    const Tensor b = ops::variable(g, fmt::format("b{}", i), InitialValues::filled(out, 0.0F), {out},
                                   std::nullopt, RetrievalMode::OnePerGroup, TensorCategory::Weight, dtype);
    mlp.weights.push_back(w.id());
    mlp.weights.push_back(b.id());
    x = ops::add(ops::matmul(x, w), b);
    if (i + 1 < numLayers) x = applyActivation(model.activation, x);
  }
  // Mixed precision: the loss (and the argmax) of float32 logits.
  if (dtype != DType::Float32) x = ops::cast(x, DType::Float32);
  mlp.logits = x.id();
  mlp.loss = ops::softmaxCrossEntropy(x, labels, ReductionType::Mean).id();
  mlp.predictions = ops::argmax(x).id();
  return mlp;
}

}  // namespace tessera
