// Helpers of the device suites: run a graph on the simulated device and on
// the double-precision reference evaluator and compare every tensor.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "executor.hpp"
#include "support/reference_evaluator.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/graph.hpp"

namespace tessera::test {

// Deterministic values in [lo, hi).
inline std::vector<float> pseudoRandom(std::size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> out(n);
  uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (float& v : out) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const double unit = static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53);
    v = static_cast<float>(lo + (hi - lo) * unit);
  }
  return out;
}

// Host data of every Input, [replicas, ...shape]: floats in [-1, 1) for
// float inputs (float64 inputs: those values as doubles, two floats each),
// integers in [0, classes) for int32 inputs.
inline std::map<TensorId, std::vector<float>> makeFeeds(const Graph& graph, int64_t classes, uint64_t seed) {
  std::map<TensorId, std::vector<float>> feeds;
  for (const OpNode& op : graph.ops()) {
    if (op.kind != OpKind::Input) continue;
    const TensorNode& node = graph.tensor(op.outputs[0]);
    const auto n = static_cast<std::size_t>(graph.replicationFactor() * numElements(node.shape));
    std::vector<float> data = pseudoRandom(n, seed + static_cast<uint64_t>(op.outputs[0]));
    if (node.dtype == DType::Int32) {
      for (float& v : data) v = std::floor((v + 1.0f) / 2.0f * static_cast<float>(classes));
    }
    if (node.dtype == DType::Float64) data = packDoubles(std::vector<double>(data.begin(), data.end()));
    feeds[op.outputs[0]] = std::move(data);
  }
  return feeds;
}

struct DeviceRun {
  std::unique_ptr<Executable> executable;
  sim::SimExecutable* sim = nullptr;
};

inline DeviceRun loadOnDevice(const Graph& graph, ExecutionMode mode, DeviceSpec spec = {},
                              std::optional<std::vector<TensorId>> hostReads = std::nullopt) {
  Program program{graph};
  program.replicas.localReplicas = graph.replicationFactor();
  program.replicas.globalReplicas = graph.replicationFactor();
  program.hostReads = std::move(hostReads);
  DeviceRun run;
  run.executable = makeSimDevice(spec, mode)->load(std::move(program));
  run.sim = dynamic_cast<sim::SimExecutable*>(run.executable.get());
  REQUIRE(run.sim != nullptr);
  return run;
}

inline void runDevice(Executable& executable, const std::map<TensorId, std::vector<float>>& feeds) {
  std::vector<Executable::Feed> list;
  for (const auto& [t, data] : feeds) list.push_back({t, data});
  executable.run(list);
}

inline void feedOracle(ReferenceEvaluator& oracle, const Graph& graph,
                       const std::map<TensorId, std::vector<float>>& feeds) {
  const int64_t replicas = graph.replicationFactor();
  for (const auto& [t, data] : feeds) {
    const auto n = data.size() / static_cast<std::size_t>(replicas);
    for (int64_t r = 0; r < replicas; ++r) {
      const std::span<const float> value(data.data() + static_cast<std::size_t>(r) * n, n);
      oracle.feed(t, r,
                  graph.tensor(t).dtype == DType::Float64 ? unpackDoubles(value)
                                                          : std::vector<double>(value.begin(), value.end()));
    }
  }
}

// Replica r's value of a tensor on the device as its floats (a float64
// tensor's doubles two floats each), or empty when the device does not store
// the tensor (fused away).
inline std::vector<float> deviceValue(const Executable& executable, const Graph& graph, TensorId t,
                                      int64_t r) {
  const ReplicaGrouping layout = executable.layout(t);
  const auto n =
      static_cast<std::size_t>(numElements(graph.tensor(t).shape) * dtypeSlots(graph.tensor(t).dtype));
  std::vector<float> all(static_cast<std::size_t>(layout.numGroups()) * n);
  try {
    executable.read(t, all);
  } catch (const DeviceError&) {
    return {};
  }
  const auto first =
      all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(layout.groupAt(r)) * n);
  return {first, first + static_cast<std::ptrdiff_t>(n)};
}

// The same as the values' doubles.
inline std::vector<double> deviceDoubles(const Executable& executable, const Graph& graph, TensorId t,
                                         int64_t r) {
  const std::vector<float> floats = deviceValue(executable, graph, t, r);
  if (graph.tensor(t).dtype == DType::Float64) return unpackDoubles(floats);
  return {floats.begin(), floats.end()};
}

inline bool close(double device, double expected, double tolerance) {
  // Equal infinities (a -inf kept by a select) are close too.
  return device == expected || std::abs(device - expected) <= tolerance * std::max(1.0, std::abs(expected));
}

// Compares one tensor on every replica with the reference.
inline void compareTensor(const Executable& executable, const Graph& graph, const ReferenceEvaluator& oracle,
                          TensorId t, double tolerance = 1e-5) {
  for (int64_t r = 0; r < graph.replicationFactor(); ++r) {
    const std::vector<float> got = deviceValue(executable, graph, t, r);
    const std::vector<double>& want = oracle.value(t, r);
    REQUIRE(got.size() == want.size());
    for (std::size_t k = 0; k < got.size(); ++k) CHECK(close(got[k], want[k], tolerance));
  }
}

// Compares every stored tensor on every replica; returns how many tensors
// were compared.
inline int64_t compareAll(const Executable& executable, const Graph& graph, const ReferenceEvaluator& oracle,
                          double tolerance = 1e-5) {
  int64_t compared = 0;
  for (std::size_t i = 0; i < graph.tensors().size(); ++i) {
    const auto t = static_cast<TensorId>(i);
    const TensorNode& node = graph.tensor(t);
    bool stored = true;
    for (int64_t r = 0; r < graph.replicationFactor() && stored; ++r) {
      const std::vector<double> got = deviceDoubles(executable, graph, t, r);
      const std::vector<double>& want = oracle.value(t, r);
      if (got.empty() && !want.empty()) {
        stored = false;
        break;
      }
      REQUIRE(got.size() == want.size());
      for (std::size_t k = 0; k < got.size(); ++k) {
        if (!close(got[k], want[k], tolerance)) {
          FAIL_CHECK("tensor \"" << node.name << "\" replica " << r << " element " << k << ": device "
                                 << got[k] << ", reference " << want[k]);
          break;
        }
      }
    }
    if (stored) ++compared;
  }
  return compared;
}

}  // namespace tessera::test
