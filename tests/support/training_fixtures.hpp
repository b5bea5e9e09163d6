// Fixtures of the tests that compare a training run with and without a
// feature (pipelining, phased execution): run-config overrides for gradient
// accumulation, the ONNX exports of tests/data/onnx as run configs, and a
// counting-token dataset for the transformer config.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "safetensors.hpp"
#include "tessera/app/run_config.hpp"
#include "test_support.hpp"

namespace tessera::test {

inline std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// Accumulation over `factor` micro-batches of `batch` samples, two steps.
inline std::vector<std::string> accumulation(int64_t factor, int64_t batch, int64_t replicas = 1) {
  return {"/sessionOptions/enableGradientAccumulation=true",
          fmt::format("/sessionOptions/accumulationFactor={}", factor), fmt::format("/data/batchSize={}", batch),
          fmt::format("/data/limitTrainSamples={}", 2 * factor * batch * replicas)};
}

// The export `model` of tests/data/onnx trained on its `prefix`_train set with
// the reference's Adam settings, batch 8, in order; `name` names the config
// in errors.
inline RunConfig onnxTrainingConfig(const std::string& prefix, const std::string& model, const std::string& name,
                                    const std::vector<std::string>& overrides) {
  const auto dataPath = [](const std::string& file) { return sourcePath("tests/data/onnx/" + file); };
  const nlohmann::json reference =
      nlohmann::json::parse(readText(dataPath(prefix + "_training_reference.json")));
  const nlohmann::json document = {{"model", {{"type", "Onnx"}, {"path", dataPath(model)}, {"loss", "loss"}}},
                                   {"optimizer", reference.at("runs").at("adam").at("optimizer")},
                                   {"data",
                                    {{"dataset", "Tensors"},
                                     {"path", dataPath(prefix + "_train.safetensors")},
                                     {"batchSize", 8},
                                     {"epochs", 1},
                                     {"shuffle", false}}}};
  return parseRunConfig(document.dump(), name, overrides).config;
}

// Counting sequences: sample k starts at token 5 k mod vocab. Written to
// `folder`/counting.safetensors; returns its path.
inline std::string writeCountingTokens(const std::filesystem::path& folder, int64_t samples, int64_t sequence,
                                       int64_t vocab) {
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
  for (int64_t k = 0; k < samples; ++k) {
    for (int64_t i = 0; i < sequence; ++i) {
      tokens.push_back(static_cast<int32_t>((k * 5 + i) % vocab));
      targets.push_back(static_cast<int32_t>((k * 5 + i + 1) % vocab));
    }
  }
  const auto bytes = [](const std::vector<int32_t>& v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(int32_t));
  };
  const std::vector<uint64_t> shape = {static_cast<uint64_t>(samples), static_cast<uint64_t>(sequence)};
  const std::vector<safetensors::TensorBytes> entries = {{"tokens", "I32", shape, bytes(tokens)},
                                                         {"targets", "I32", shape, bytes(targets)}};
  const std::vector<uint8_t> file = safetensors::encode(entries, {});
  const std::filesystem::path path = folder / "counting.safetensors";
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
  return path.string();
}

}  // namespace tessera::test
