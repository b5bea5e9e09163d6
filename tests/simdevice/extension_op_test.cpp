// An op added at run time, defined the way a family file of lib/ops/
// defines one (one OpDef) and given kernels the way a family file of
// simdevice/ops/ does (one KernelDef): with nothing else, it is checked at
// construction, differentiated, evaluated by the reference, run by the
// device in both execution modes and fused into chains, and costed by the
// time model. This is the claim of docs/adding-an-op.md.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "device_checks.hpp"
#include "kernel_table.hpp"
#include "op_def.hpp"
#include "tessera/lib/autodiff.hpp"
#include "tessera/lib/ops.hpp"

using namespace tessera;
using test::ReferenceEvaluator;

namespace {

constexpr auto kCube = static_cast<OpKind>(kFirstExtensionOpKind);
// Known to the op table but given no kernels.
constexpr auto kNoKernels = static_cast<OpKind>(kFirstExtensionOpKind + 1);
// Takes float64 in the IR, but has float kernels only.
constexpr auto kAnyFloat = static_cast<OpKind>(kFirstExtensionOpKind + 5);

// What lib/ops/<family>.cc would hold.
OpDef cubeDefinition(OpKind kind, std::string_view name) {
  return {.kind = kind,
          .name = name,
          .family = OpFamily::Elementwise,
          .elementwise = true,
          .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
            c.arity(1);
            c.dtype(0, DType::Float32);
            return {{c.shape(0), DType::Float32, c.in(0).metaShape}};
          },
          // d(x^3) = 3 x^2 dx
          .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
            return {ops::mul(g.dy, ops::mul(ops::scalar(g.graph, 3.0), ops::mul(g.in(0), g.in(0))))};
          },
          .reference =
              [](ReferenceOp& r, int64_t replica) {
                const std::vector<double>& x = r.in(0, replica);
                std::vector<double>& out = r.out(replica);
                for (std::size_t i = 0; i < out.size(); ++i) out[i] = x[i] * x[i] * x[i];
              },
          .cost = [](const Graph& graph,
                     const OpNode& op) { return OpCost{.flops = 2.0 * elementsOf(graph, op.outputs[0])}; }};
}

// What simdevice/ops/<family>.cc would hold.
struct CubeF {
  float operator()(float x) const { return x * x * x; }
};

void registerOnce() {
  static const bool registered = [] {
    registerOp(cubeDefinition(kCube, "Cube"));
    sim::registerKernel(sim::unaryKernels<CubeF>(kCube));
    registerOp(cubeDefinition(kNoKernels, "CubeWithoutKernels"));
    OpDef anyFloat = cubeDefinition(kAnyFloat, "CubeOfAnyFloat");
    anyFloat.float64 = true;
    anyFloat.shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
      c.arity(1);
      return {{c.shape(0), c.floating({0}), c.in(0).metaShape}};
    };
    registerOp(anyFloat);
    sim::registerKernel(sim::unaryKernels<CubeF>(kAnyFloat));
    return true;
  }();
  (void)registered;
}

Tensor cube(Tensor x) {
  Graph& g = x.graph();
  return {&g, g.op(g.addOp(kCube, {x.id()})).outputs[0]};
}

}  // namespace

TEST_CASE("an op registered at run time has a name, traits and a shape rule") {
  registerOnce();
  CHECK(opName(kCube) == "Cube");
  CHECK(fmt::format("{}", kCube) == "Cube");
  CHECK(isElementwise(kCube));
  CHECK_FALSE(isInplace(kCube));
  CHECK_FALSE(isCollective(kCube));

  Graph g;
  const Tensor x = ops::input(g, "x", {2, 3});
  const Tensor y = cube(x);
  CHECK(y.shape() == Shape{2, 3});
  CHECK(g.op(y.node().producer).name == "Cube");
  const Tensor labels = ops::input(g, "labels", {2}, DType::Int32);
  try {
    cube(labels);
    FAIL("an int32 operand was accepted");
  } catch (const GraphError& e) {
    CHECK(e.code() == ErrorCode::InvalidOperand);
    CHECK(std::string(e.what()).find("Cube: input 0 \"labels\" [2] int32 must be float32") !=
          std::string::npos);
  }
}

TEST_CASE("an op registered at run time is differentiated as its rule says") {
  registerOnce();
  Graph g(2);
  const Tensor x = ops::input(g, "x", {3, 4});
  const Tensor w = ops::variable(g, "w", test::pseudoRandom(4, 5), {4});
  const Tensor loss = ops::reduceSum(
      ops::mul(cube(ops::mul(x, w)), ops::constant(g, "r", test::pseudoRandom(12, 6), {3, 4})));
  const std::vector<Tensor> grads = autodiff(g, loss, {w});

  ReferenceEvaluator ev(g);
  const std::map<TensorId, std::vector<float>> feeds = test::makeFeeds(g, 1, 11);
  test::feedOracle(ev, g, feeds);
  ev.run();
  // Central differences of the global loss in double precision.
  constexpr double kStep = 1e-6;
  for (int64_t q = 0; q < 2; ++q) {
    for (std::size_t i = 0; i < 4; ++i) {
      const double exact = ev.value(grads[0].id(), q)[i];
      auto lossWith = [&](double delta) {
        ev.state(w.id(), q)[i] += delta;
        ev.run();
        ev.state(w.id(), q)[i] -= delta;
        return ev.sumOverReplicas(loss.id());
      };
      const double numeric = (lossWith(kStep) - lossWith(-kStep)) / (2 * kStep);
      INFO("d loss / d w[" << i << "] on replica " << q << ": " << exact << " vs " << numeric);
      CHECK(std::abs(exact - numeric) <= 1e-6 * std::max(1.0, std::abs(exact)));
    }
  }
}

TEST_CASE("an op registered at run time runs on the device, in chains, like its reference") {
  registerOnce();
  for (const int64_t replicas : {1, 4}) {
    CAPTURE(replicas);
    Graph g(replicas);
    const Tensor x = ops::input(g, "x", {5, 7});
    const Tensor w = ops::variable(g, "w", test::pseudoRandom(7, 8), {7});
    // x * 2, cube and neg run over the same flat range: one chain.
    const Tensor y = ops::neg(cube(ops::mul(x, ops::scalar(g, 2.0))));
    const Tensor loss = ops::reduceSum(ops::mul(cube(ops::mul(x, w)), y));
    autodiff(g, loss, {w});
    const std::map<TensorId, std::vector<float>> feeds = test::makeFeeds(g, 1, 21);
    ReferenceEvaluator oracle(g);
    test::feedOracle(oracle, g, feeds);
    oracle.run();

    test::DeviceRun vectorized = test::loadOnDevice(g, ExecutionMode::Vectorized);
    test::runDevice(*vectorized.executable, feeds);
    CHECK(test::compareAll(*vectorized.executable, g, oracle) > 0);
    CHECK(vectorized.sim->stats().fusedChains >= 1);

    test::DeviceRun perReplica = test::loadOnDevice(g, ExecutionMode::PerReplicaReference);
    test::runDevice(*perReplica.executable, feeds);
    for (int64_t r = 0; r < replicas; ++r) {
      CHECK(test::deviceValue(*vectorized.executable, g, loss.id(), r) ==
            test::deviceValue(*perReplica.executable, g, loss.id(), r));
    }

    // The time model reads the op's cost: 2 flops per element.
    int64_t costed = 0;
    for (const OpTime& op : vectorized.executable->modelledTime().ops) {
      if (op.kind != kCube) continue;
      CHECK(op.flops == doctest::Approx(2.0 * 35));
      ++costed;
    }
    CHECK(costed >= 2);
  }
}

TEST_CASE("the op and kernel tables refuse what they cannot hold") {
  registerOnce();
  CHECK_THROWS_AS(registerOp(cubeDefinition(kCube, "Cube")), InternalError);
  CHECK_THROWS_AS(sim::registerKernel(sim::unaryKernels<CubeF>(kCube)), InternalError);
  // A kind that is neither built in nor registered.
  OpDef unnamed = cubeDefinition(static_cast<OpKind>(kFirstExtensionOpKind + 2), "");
  CHECK_THROWS_AS(registerOp(unnamed), InternalError);
  OpDef shapeless = cubeDefinition(static_cast<OpKind>(kFirstExtensionOpKind + 3), "Shapeless");
  shapeless.shape = nullptr;
  CHECK_THROWS_AS(registerOp(shapeless), InternalError);

  Graph g;
  const Tensor x = ops::input(g, "x", {2});
  try {
    g.addOp(static_cast<OpKind>(kFirstExtensionOpKind + 4), {x.id()});
    FAIL("an unknown kind was accepted");
  } catch (const GraphError& e) {
    CHECK(e.code() == ErrorCode::InvalidOperand);
    CHECK(std::string(e.what()).find("unknown op kind") != std::string::npos);
  }

  // Known to the graph, unknown to the device: refused at load, naming the op.
  g.addOp(kNoKernels, {x.id()}, {}, "lonely");
  try {
    test::loadOnDevice(g, ExecutionMode::Vectorized);
    FAIL("a program with an op the device has no kernel for was loaded");
  } catch (const DeviceError& e) {
    CHECK(e.code() == ErrorCode::InvalidProgram);
    CHECK(e.subject() == "lonely");
    CHECK(std::string(e.what()).find("no kernel for CubeWithoutKernels") != std::string::npos);
  }

  // Float64 in the IR but no float64 kernel (KernelDef::planFloat64): the
  // float32 program loads, the float64 one is refused, naming the op.
  Graph f;
  const Tensor wide = ops::input(f, "wide", {3}, DType::Float64);
  f.addOp(kAnyFloat, {ops::input(f, "narrow", {3}).id()}, {}, "narrow cube");
  CHECK_NOTHROW(test::loadOnDevice(f, ExecutionMode::Vectorized));
  f.addOp(kAnyFloat, {wide.id()}, {}, "wide cube");
  try {
    test::loadOnDevice(f, ExecutionMode::PerReplicaReference);
    FAIL("a float64 op without a float64 kernel was loaded");
  } catch (const DeviceError& e) {
    CHECK(e.code() == ErrorCode::InvalidProgram);
    CHECK(e.subject() == "wide cube");
    const std::string message = e.what();
    INFO(message);
    CHECK(message.find("CubeOfAnyFloat") != std::string::npos);
    CHECK(message.find("no float64 kernel") != std::string::npos);
  }
}
