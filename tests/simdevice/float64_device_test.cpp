// Float64 on the simulated device: double values in two float slots each,
// computed in double by the elementwise ops, Where, the casts and the shape
// ops, bit for bit as the double reference computes them (values beyond
// float32's range and below its precision), at any replica count, in both
// execution modes, and counted at 8 bytes an element; gradients through a
// float64 graph; float64 values never in streaming memory.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "device_checks.hpp"
#include "tessera/lib/autodiff.hpp"
#include "tessera/lib/ops.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

constexpr DType kF64 = DType::Float64;

struct Built {
  Tensor a;                  // float64 [2, 3] per replica
  Tensor v;                  // float64 [3] per replica
  std::vector<Tensor> wide;  // float64 results
};

Built build(Graph& g) {
  Built b;
  b.a = ops::input(g, "a", {2, 3}, kF64);
  b.v = ops::input(g, "v", {3}, kF64);
  const Tensor big = ops::scalar(g, 1e200, kF64);
  const Tensor tiny = ops::scalar(g, 0x1p-40, kF64);
  // Beyond float32's range on the way, and back: exact in double.
  const Tensor sum = ops::sub(ops::add(ops::add(b.a, big), b.v), big);
  const Tensor product = ops::div(ops::mul(b.a, b.v), ops::add(ops::abs(b.v), tiny));
  const Tensor unary =
      ops::add(ops::add(ops::exp(ops::neg(ops::abs(b.a))), ops::log(ops::add(ops::abs(b.a), tiny))),
               ops::sqrt(ops::reciprocal(ops::add(ops::abs(b.v), tiny))));
  const Tensor bounded = ops::mul(ops::tanh(b.a), ops::sigmoid(b.v));
  const Tensor signs = ops::pow(ops::add(ops::relu(b.a), ops::sign(b.v)), ops::scalar(g, 3.0, kF64));
  const Tensor picked =
      ops::where(ops::greater(ops::cast(b.a, DType::Float32), ops::scalar(g, 0.0)), sum, product);
  const Tensor moved =
      ops::concat({ops::transpose(picked, {1, 0}),
                   ops::slice(ops::broadcastTo(ops::reshape(b.v, {3, 1}), {3, 4}), {0, 1}, {3, 3})},
                  1);
  b.wide = {sum, product, unary, bounded, signs, picked, moved};
  ops::cast(moved, DType::Float32);
  ops::castToInt32(ops::mul(bounded, ops::scalar(g, 1e3, kF64)));
  ops::cast(ops::cast(ops::cast(b.a, DType::Float32), DType::Float16), kF64);
  ops::cast(ops::cast(ops::div(b.a, b.v), DType::Float16), kF64);
  return b;
}

// Per replica: a = r * 1e300-ish and values that float32 cannot hold.
std::map<TensorId, std::vector<float>> feeds(const Built& b, int64_t replicas) {
  std::vector<double> a;
  std::vector<double> v;
  for (int64_t r = 0; r < replicas; ++r) {
    const auto d = static_cast<double>(r);
    for (double x : {1e250 * (d + 1), -(1.0 + 0x1p-40), 0.5 + d, -3e-300, 2.0 + 0x1p-50, -7.25 - d})
      a.push_back(x);
    for (double x : {1.0 + 0x1p-45, -1e-200, 3.0 + d}) v.push_back(x);
  }
  return {{b.a.id(), packDoubles(a)}, {b.v.id(), packDoubles(v)}};
}

}  // namespace

TEST_CASE(
    "float64 ops on the device equal the double reference bit for bit, beyond float32's range and "
    "precision") {
  for (int64_t replicas : {int64_t{1}, int64_t{4}}) {
    for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
      INFO("R = " << replicas << ", " << toString(mode));
      Graph g(replicas);
      const Built b = build(g);
      const auto fed = feeds(b, replicas);
      test::DeviceRun device = test::loadOnDevice(g, mode);
      test::ReferenceEvaluator oracle(g);
      test::feedOracle(oracle, g, fed);
      test::runDevice(*device.executable, fed);
      oracle.run();
      // Tolerance 0: every stored tensor, float64 or not, is the reference's value.
      CHECK(test::compareAll(*device.executable, g, oracle, 0.0) >= static_cast<int64_t>(b.wide.size()));
      // The values float32 cannot hold are there.
      const std::vector<double> sum =
          test::deviceDoubles(*device.executable, g, b.wide[0].id(), replicas - 1);
      CHECK(sum[0] == 1e250 * static_cast<double>(replicas) + (1.0 + 0x1p-45));
      const std::vector<double> picked = test::deviceDoubles(*device.executable, g, b.wide[5].id(), 0);
      // (a * v) / (|v| + 2^-40) for a = -3e-300: 0 in float32.
      CHECK(picked[3] == -3e-300 * (1.0 + 0x1p-45) / ((1.0 + 0x1p-45) + 0x1p-40));
      CHECK(picked[3] != 0.0);
      // No float64 step is fused into a float chain.
      CHECK(device.sim->stats().chainedSteps == 0);
    }
  }
}

TEST_CASE("float64 tensors take 8 bytes an element in the memory report and two floats in the arena") {
  Graph g(2);
  const Tensor x = ops::input(g, "x", {16, 8}, kF64);
  const Tensor y = ops::add(x, x);
  ops::cast(y, DType::Float32);
  test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized);
  int64_t seen = 0;
  for (const TensorMemory& m : device.executable->memory().tensors) {
    if (m.name != y.name() && m.name != x.name()) continue;
    CHECK(m.bytes == 16 * 8 * 8);
    ++seen;
  }
  CHECK(seen == 2);
  // x, y (two replicas of 128 doubles each) and the float32 cast.
  CHECK(device.sim->stats().arenaFloats >= 2 * (2 * 128 * 2) + 2 * 128);
  // A feed of the wrong size names the float count a float64 input needs.
  const std::vector<float> wrong(2 * 128);
  try {
    const std::vector<Executable::Feed> feed = {{x.id(), wrong}};
    device.executable->run(feed);
    FAIL("a float64 input took half its floats");
  } catch (const DeviceError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("float64 (2 floats an element) = 512 floats") != std::string::npos);
  }
}

TEST_CASE(
    "float64 values stay on chip: no remote store takes them, and a float64 remote buffer is refused at "
    "load") {
  Graph g(1);
  const Tensor x = ops::input(g, "x", {4}, kF64);
  const RemoteBuffer buffer = ops::remoteBuffer(g, {4}, kF64);
  TESSERA_CHECK_ERROR(ops::remoteStore(g, buffer, 0, ops::add(x, x)), GraphError, ErrorCode::InvalidOperand);
  try {
    test::loadOnDevice(g, ExecutionMode::Vectorized);
    FAIL("a float64 remote buffer was loaded");
  } catch (const DeviceError& e) {
    CHECK(e.code() == ErrorCode::InvalidProgram);
    CHECK(e.subject() == "remote buffer #0");
    CHECK(std::string(e.what()).find("float64") != std::string::npos);
  }
}

TEST_CASE("gradients through a float64 graph run on the device as the reference computes them") {
  for (const int64_t replicas : {int64_t{1}, int64_t{2}}) {
    INFO("R = " << replicas);
    Graph g(replicas);
    const Tensor w = ops::input(g, "w", {3});
    const Tensor x = ops::input(g, "x", {3}, kF64);
    const Tensor y = ops::mul(ops::cast(w, kF64), ops::exp(x));
    const Tensor back = ops::cast(ops::sqrt(ops::add(ops::mul(y, y), ops::exp(x))), DType::Float32);
    const Tensor loss = ops::reduceSum(back);
    const std::vector<Tensor> grads = autodiff(g, loss, {w, x});
    REQUIRE(grads.size() == 2);
    CHECK(grads[1].dtype() == kF64);
    const auto feeds = test::makeFeeds(g, 5, 9);
    test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized);
    test::ReferenceEvaluator oracle(g);
    test::feedOracle(oracle, g, feeds);
    test::runDevice(*device.executable, feeds);
    oracle.run();
    // The float32 stretch (the loss and the gradient entering the casts)
    // keeps float32's precision.
    CHECK(test::compareAll(*device.executable, g, oracle, 1e-5) > 0);
    const std::vector<double> dx = test::deviceDoubles(*device.executable, g, grads[1].id(), 0);
    REQUIRE(dx.size() == 3);
    for (std::size_t k = 0; k < 3; ++k)
      CHECK(dx[k] == doctest::Approx(oracle.value(grads[1].id(), 0)[k]).epsilon(1e-6));
  }
}

TEST_CASE(
    "a double cast to float16 is rounded once, to the nearest half, on the device as in the reference") {
  // Values whose float32 rounding lands on (or crosses) the midpoint between two halves, where a
  // rounding through float32 ties to the wrong half, and the edges of the half's range.
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<double, double>> cases = {
      {1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-10},  // through float32: 1 + 2^-11, a tie, to 1
      {1.0 + 0x1p-11, 1.0},                      // a true tie: to even
      {1.0 + 0x1p-11 - 0x1p-40, 1.0},
      {-(1.0 + 3 * 0x1p-11 - 0x1p-45), -(1.0 + 0x1p-10)},  // through float32: a tie, to 1 + 2^-9
      {0x1p-25 + 0x1p-60, 0x1p-24},                        // above half the smallest subnormal
      {0x1p-25, 0.0},
      {65520.0 - 0x1p-30, 65504.0},  // through float32: 65520, a tie, to infinity
      {65520.0, inf},
      {1e300, inf},
      {-1e-300, -0.0},
      {0.1, 0.0999755859375},
  };
  for (const ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
    INFO(toString(mode));
    Graph g(1);
    const auto n = static_cast<int64_t>(cases.size());
    const Tensor x = ops::input(g, "x", {n}, kF64);
    const Tensor half = ops::cast(x, DType::Float16);
    CHECK(half.dtype() == DType::Float16);
    std::vector<double> values;
    for (const auto& c : cases) values.push_back(c.first);
    const std::map<TensorId, std::vector<float>> fed{{x.id(), packDoubles(values)}};
    test::DeviceRun device = test::loadOnDevice(g, mode);
    test::runDevice(*device.executable, fed);
    test::ReferenceEvaluator oracle(g);
    test::feedOracle(oracle, g, fed);
    oracle.run();
    const std::vector<float> got = test::deviceValue(*device.executable, g, half.id(), 0);
    const std::vector<double>& expected = oracle.value(half.id(), 0);
    for (std::size_t i = 0; i < cases.size(); ++i) {
      CAPTURE(i);
      CAPTURE(cases[i].first);
      CHECK(static_cast<double>(got[i]) == cases[i].second);
      CHECK(std::signbit(got[i]) == std::signbit(cases[i].second));
      CHECK(expected[i] == cases[i].second);
    }
  }
  // The gradient of the cast is the cast back: float64.
  Graph g(1);
  const Tensor x = ops::input(g, "x", {3}, kF64);
  const Tensor loss = ops::reduceSum(ops::cast(ops::cast(x, DType::Float16), DType::Float32));
  const std::vector<Tensor> grads = autodiff(g, loss, {x});
  REQUIRE(grads.size() == 1);
  CHECK(grads[0].dtype() == kF64);
}
