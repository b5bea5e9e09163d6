// A toy classification problem for session tests: `features` inputs, 4
// classes; sample s has label s % 4 and a 1 in every feature f with
// f % 4 == label, plus Gaussian noise (stddev 0.3) drawn from `seed`.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/app/mlp.hpp"

namespace tessera::test {

struct ToyData {
  std::vector<float> images;   // [samples, features]
  std::vector<int32_t> labels;  // [samples]
};

inline ToyData toyData(int64_t samples, int64_t features, uint64_t seed) {
  ToyData d;
  const std::vector<float> noise = normalSamples(samples * features, seed, 0.3);
  for (int64_t s = 0; s < samples; ++s) {
    const auto label = static_cast<int32_t>(s % 4);
    d.labels.push_back(label);
    for (int64_t f = 0; f < features; ++f) {
      d.images.push_back((f % 4 == label ? 1.0f : 0.0f) + noise[static_cast<size_t>(s * features + f)]);
    }
  }
  return d;
}

}  // namespace tessera::test
