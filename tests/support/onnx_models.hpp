// Helpers of the tests that import the ONNX fixtures of tests/data/onnx:
// reading their reference JSON, comparing with PyTorch's numbers, and
// importing with the batch axis bound.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tessera/onnx/onnx.hpp"
#include "tessera/sessions/session.hpp"
#include "test_support.hpp"

namespace tessera::test {

// The JSON file at `relative` in the source tree.
inline nlohmann::json readJson(const std::string& relative) {
  return nlohmann::json::parse(readText(sourcePath(relative)));
}

// |got - want| / |want|, with |want| at least 1e-30.
inline double relativeDifference(double got, double want) {
  return std::fabs(got - want) / std::max(std::fabs(want), 1e-30);
}

// The largest relativeDifference of corresponding elements; the sizes must
// be equal.
inline double worstRelativeDifference(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, relativeDifference(got[i], want[i]));
  return worst;
}

// The fixture tests/data/onnx/`file` imported for `replicas` replicas with
// the symbolic "batch" axis bound to `batchPerReplica`.
inline OnnxModel importWithBatch(const std::string& file, int64_t batchPerReplica, int64_t replicas = 1) {
  OnnxImportOptions options;
  options.dimensions = {{"batch", batchPerReplica}};
  options.replicationFactor = replicas;
  return importOnnx(sourcePath("tests/data/onnx/" + file), options);
}

}  // namespace tessera::test
