// Micro-benchmarks (Google Benchmark): how the cost of compiling and
// configuring grows with the size of the model, and collectives against a
// plain memcpy of the same bytes.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "tessera/location_resolver.hpp"
#include "tessera/placement.hpp"
#include "tessera/ops.hpp"
#include "tessera/run_config.hpp"
#include "tessera/session.hpp"

namespace {

// A graph of N small variables, each added into one output; returns the
// output's name.
std::string variablesGraph(tessera::Graph& g, int64_t n) {
  tessera::Tensor sum = tessera::ops::variable(g, "v0", {1.0f, 2.0f}, {2});
  for (int64_t i = 1; i < n; ++i) {
    sum = tessera::ops::add(sum, tessera::ops::variable(g, fmt::format("v{}", i), {1.0f, 2.0f}, {2}));
  }
  return sum.name();
}

// Compiling (transforming, planning and loading on the device) a graph of N
// small variables. Building the graph and destroying the session are not
// timed; compileAndDestroy times both steps together.
void compileVariables(benchmark::State& state) {
  const auto n = static_cast<int64_t>(state.range(0));
  for (auto _ : state) {
    state.PauseTiming();
    tessera::Graph g(1);
    const std::string out = variablesGraph(g, n);
    state.ResumeTiming();
    auto session = std::make_unique<tessera::InferenceSession>(std::move(g), std::vector<std::string>{out},
                                                               tessera::SessionOptions{}, tessera::makeSimDevice());
    benchmark::DoNotOptimize(session->memory());
    state.PauseTiming();
    session.reset();
    state.ResumeTiming();
  }
  state.SetComplexityN(n);
}
BENCHMARK(compileVariables)->Arg(1000)->Arg(10000)->Arg(100000)->Unit(benchmark::kMillisecond)->Complexity();

void compileAndDestroy(benchmark::State& state) {
  const auto n = static_cast<int64_t>(state.range(0));
  for (auto _ : state) {
    state.PauseTiming();
    tessera::Graph g(1);
    const std::string out = variablesGraph(g, n);
    state.ResumeTiming();
    tessera::InferenceSession session(std::move(g), {out}, tessera::SessionOptions{}, tessera::makeSimDevice());
    benchmark::DoNotOptimize(session.memory());
  }
  state.SetComplexityN(n);
}
BENCHMARK(compileAndDestroy)->Arg(10000)->Arg(100000)->Unit(benchmark::kMillisecond)->Complexity();

// Resolving the location of N tensors against N overrides.
void resolveOverrides(benchmark::State& state) {
  const auto n = static_cast<int64_t>(state.range(0));
  tessera::SessionOptions options;
  for (int64_t i = 0; i < n; ++i) {
    options.tensorLocationSettingsOverride[fmt::format("t{}", i)] =
        tessera::TensorLocation(tessera::TensorStorage::OffChip);
  }
  std::vector<tessera::TensorInfo> tensors;
  for (int64_t i = 0; i < n; ++i) tensors.push_back({fmt::format("t{}", i), tessera::TensorCategory::Weight, 1024});
  for (auto _ : state) {
    for (const tessera::TensorInfo& t : tensors) benchmark::DoNotOptimize(tessera::resolveTensorLocation(options, t));
  }
  state.SetComplexityN(n);
}
BENCHMARK(resolveOverrides)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond)->Complexity();

// A run config with N tensor location overrides.
std::string overridesConfig(int64_t n) {
  std::string text = R"({"sessionOptions": {"tensorLocationSettingsOverride": {)";
  for (int64_t i = 0; i < n; ++i) {
    text += fmt::format(R"({}"t{}": {{"storage": "OffChip"}})", i == 0 ? "" : ",", i);
  }
  return text + "}}}";
}

// Parsing a run config with N overrides.
void parseConfig(benchmark::State& state) {
  const auto n = static_cast<int64_t>(state.range(0));
  const std::string text = overridesConfig(n);
  for (auto _ : state) benchmark::DoNotOptimize(tessera::parseRunConfig(text, "bench"));
  state.SetComplexityN(n);
}
BENCHMARK(parseConfig)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond)->Complexity();

// What `tessera explain` does for a config with N overrides: parse, validate,
// and plan the compiled training program of its model (MLP 784-256-128-10,
// batch 64): transforms, the placement of every tensor, memory and time.
void explainOverrides(benchmark::State& state) {
  const auto n = static_cast<int64_t>(state.range(0));
  const std::string text = overridesConfig(n);
  for (auto _ : state) {
    const tessera::LoadedRunConfig loaded = tessera::parseRunConfig(text, "bench");
    tessera::validate(loaded.config);
    const tessera::RunPlan plan = tessera::planRun(loaded.config);
    benchmark::DoNotOptimize(plan.memory.perReplica.data());
  }
  state.SetComplexityN(n);
}
BENCHMARK(explainOverrides)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond)->Complexity();

// An all-reduce of N floats over 8 replicas, per step, against memcpy of the
// same bytes (the floor any simulated collective has to move).
void allReduce(benchmark::State& state) {
  const auto n = static_cast<int64_t>(state.range(0));
  tessera::Graph g(8);
  tessera::Tensor x = tessera::ops::input(g, "x", {n});
  const std::string y = tessera::ops::replicatedAllReduce(x).name();
  tessera::SessionOptions options;
  options.enableReplicatedGraphs = true;
  options.replicatedGraphCount = 8;
  tessera::InferenceSession session(std::move(g), {y}, options, tessera::makeSimDevice());
  const std::vector<float> data(static_cast<size_t>(8 * n), 1.0f);
  for (auto _ : state) session.run({tessera::StepInput("x", data)});
  state.SetBytesProcessed(state.iterations() * 8 * n * static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(allReduce)->Arg(1 << 16)->Arg(1 << 20);

void memcpyBaseline(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  std::vector<float> from(8 * n, 1.0f);
  std::vector<float> to(8 * n);
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), from.size() * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(8 * n * sizeof(float)));
}
BENCHMARK(memcpyBaseline)->Arg(1 << 16)->Arg(1 << 20);

}  // namespace

BENCHMARK_MAIN();
