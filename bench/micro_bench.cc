// Micro-benchmarks (Google Benchmark): how the cost of compiling and
// configuring grows with the size of the model, collectives against a
// plain memcpy of the same bytes, and the device's GEMMs (the MLP step's
// products, on 1 and 2 threads) against the cores' FMA peak.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "gemm.hpp"

#include "tessera/lib/location_resolver.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/app/run_plan.hpp"
#include "tessera/sessions/session.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

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

// The products of the MLP 784-256-128-10 step at batch 64 (forward, weight
// gradients read transposed, input gradients), each one device program of
// one MatMul between two variables, on range(6) threads: GFLOP/s.
void gemmProduct(benchmark::State& state) {
  const int64_t m = state.range(0);
  const int64_t n = state.range(1);
  const int64_t k = state.range(2);
  const bool transA = state.range(3) != 0;
  const bool transB = state.range(4) != 0;
  tessera::Graph g(1);
  const std::vector<float> a(static_cast<size_t>(m * k), 0.5f);
  const std::vector<float> b(static_cast<size_t>(k * n), 0.25f);
  tessera::Tensor x = tessera::ops::variable(g, "a", a, transA ? tessera::Shape{k, m} : tessera::Shape{m, k});
  tessera::Tensor w = tessera::ops::variable(g, "b", b, transB ? tessera::Shape{n, k} : tessera::Shape{k, n});
  if (transA) x = tessera::ops::transpose(x);
  if (transB) w = tessera::ops::transpose(w);
  const std::string y = tessera::ops::matmul(x, w).name();
  tessera::DeviceSpec spec;
  spec.numThreads = state.range(5);
  tessera::InferenceSession session(std::move(g), {y}, tessera::SessionOptions{},
                                    tessera::makeSimDevice(spec));
  for (auto _ : state) session.run({});
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(2 * m * n * k) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(gemmProduct)
    ->ArgNames({"m", "n", "k", "tA", "tB", "threads"})
    ->ArgsProduct({{64}, {256}, {784}, {0}, {0}, {1, 2}})
    ->ArgsProduct({{64}, {128}, {256}, {0}, {0}, {1, 2}})
    ->ArgsProduct({{784}, {256}, {64}, {1}, {0}, {1, 2}})
    ->ArgsProduct({{256}, {128}, {64}, {1}, {0}, {1, 2}})
    ->ArgsProduct({{64}, {256}, {128}, {0}, {1}, {1, 2}})
    ->UseRealTime();

// The same products as the device's kernel alone, on one thread: sim::gemm
// on operands already in place, without the session around it (gemmProduct
// also copies the product to the host after each run, 800 KB for the
// layer-1 weight gradient).
void gemmKernel(benchmark::State& state) {
  namespace sim = tessera::sim;
  sim::GemmShape shape;
  shape.m = state.range(0);
  shape.n = state.range(1);
  shape.k = state.range(2);
  shape.transA = state.range(3) != 0;
  shape.transB = state.range(4) != 0;
  const sim::GemmPlan plan = sim::planGemm(sim::bestGemmIsa(), shape.m, shape.n, shape.k);
  const auto aligned = [](int64_t n, float value) {
    const auto bytes = static_cast<std::size_t>((n * 4 + 63) / 64 * 64);
    auto* p = static_cast<float*>(std::aligned_alloc(64, std::max<std::size_t>(bytes, 64)));
    std::fill_n(p, n, value);
    return std::unique_ptr<float, decltype(&std::free)>(p, &std::free);
  };
  const auto a = aligned(shape.m * shape.k, 0.5f);
  const auto b = aligned(shape.k * shape.n, 0.25f);
  const auto c = aligned(shape.m * shape.n, 0.0f);
  const auto lhs = aligned(plan.lhsFloats, 0.0f);
  const auto rhs = aligned(plan.rhsFloats, 0.0f);
  const auto partial = aligned(plan.partialFloats, 0.0f);
  for (auto _ : state) {
    sim::gemm(plan, shape, a.get(), b.get(), c.get(), 1.0f, lhs.get(), rhs.get(), partial.get());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(2 * shape.m * shape.n * shape.k) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(gemmKernel)
    ->ArgNames({"m", "n", "k", "tA", "tB"})
    ->ArgsProduct({{64}, {256}, {784}, {0}, {0}})
    ->ArgsProduct({{64}, {128}, {256}, {0}, {0}})
    ->ArgsProduct({{784}, {256}, {64}, {1}, {0}})
    ->ArgsProduct({{256}, {128}, {64}, {1}, {0}})
    ->ArgsProduct({{64}, {256}, {128}, {0}, {1}})
    ->UseRealTime();

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The FMA peak of range(0) cores: 12 independent chains of vfmadd231ps on
// 512-bit registers per thread (AVX2: 256-bit), 2 FLOP per lane.
__attribute__((target("avx512f"))) float fmaLoop512(int64_t iterations) {
  __m512 acc[12];
  for (auto& v : acc) v = _mm512_set1_ps(1.0f);
  const __m512 x = _mm512_set1_ps(0.999999f);
  const __m512 y = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i)
    for (auto& v : acc) v = _mm512_fmadd_ps(v, x, y);
  alignas(64) float lanes[16];
  __m512 total = _mm512_setzero_ps();
  for (auto& v : acc) total = _mm512_add_ps(total, v);
  _mm512_store_ps(lanes, total);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}

__attribute__((target("avx2,fma"))) float fmaLoop256(int64_t iterations) {
  __m256 acc[12];
  for (auto& v : acc) v = _mm256_set1_ps(1.0f);
  const __m256 x = _mm256_set1_ps(0.999999f);
  const __m256 y = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i)
    for (auto& v : acc) v = _mm256_fmadd_ps(v, x, y);
  alignas(32) float lanes[8];
  __m256 total = _mm256_setzero_ps();
  for (auto& v : acc) total = _mm256_add_ps(total, v);
  _mm256_store_ps(lanes, total);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}

void fmaPeak(benchmark::State& state) {
  const auto threads = static_cast<int>(state.range(0));
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
    state.SkipWithError("no FMA unit");
    return;
  }
  constexpr int64_t kIterations = 1 << 20;
  for (auto _ : state) {
    std::vector<std::thread> pool;
    std::vector<float> sums(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        sums[static_cast<size_t>(t)] = avx512 ? fmaLoop512(kIterations) : fmaLoop256(kIterations);
      });
    for (std::thread& t : pool) t.join();
    benchmark::DoNotOptimize(sums.data());
  }
  const double flops = 12.0 * (avx512 ? 16 : 8) * 2 * kIterations * threads;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(fmaPeak)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();
#endif

}  // namespace

BENCHMARK_MAIN();
