#include "tessera/lib/autodiff.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "support/reference_evaluator.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "test_support.hpp"

using namespace tessera;
using test::ReferenceEvaluator;

namespace {

constexpr double kStep = 1e-6;
constexpr double kTolerance = 1e-6;

std::vector<float> randomFloats(std::mt19937& rng, std::size_t n, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

std::vector<double> randomDoubles(std::mt19937& rng, std::size_t n, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

std::size_t sizeOf(const Tensor& t) { return static_cast<std::size_t>(numElements(t.shape())); }

// Differentiates loss = sum(y * r) (r random, y = build(inputs)) with respect
// to `wrt` (inputs fed with random values in [lo, hi], different on every
// replica, and variables), evaluates the gradients with the oracle and
// compares every element on every replica with central differences of the
// global loss (the sum of the replicas' losses).
void checkGradients(Graph& g, const std::vector<Tensor>& wrt, Tensor y, double lo, double hi,
                    unsigned seed = 7) {
  std::mt19937 rng(seed);
  const Tensor r = ops::constant(g, "r", randomFloats(rng, sizeOf(y), -1.0, 1.0), y.shape());
  const Tensor loss = ops::reduceSum(ops::mul(y, r));
  const std::vector<Tensor> grads = autodiff(g, loss, wrt);
  REQUIRE(grads.size() == wrt.size());

  ReferenceEvaluator ev(g);
  const int64_t replicas = g.replicationFactor();
  // Every input of the graph gets random values; ints are fed by the tests as constants.
  std::vector<std::vector<std::vector<double>>> feeds(g.tensors().size());
  for (const OpNode& op : g.ops()) {
    if (op.kind != OpKind::Input) continue;
    const TensorId t = op.outputs[0];
    for (int64_t q = 0; q < replicas; ++q) {
      feeds[static_cast<std::size_t>(t)].push_back(
          randomDoubles(rng, static_cast<std::size_t>(numElements(g.tensor(t).shape)), lo, hi));
      ev.feed(t, q, feeds[static_cast<std::size_t>(t)].back());
    }
  }
  auto isInput = [&](const Tensor& t) { return g.op(t.node().producer).kind == OpKind::Input; };
  ev.run();
  std::vector<std::vector<std::vector<double>>> analytic(wrt.size());
  for (std::size_t k = 0; k < wrt.size(); ++k)
    for (int64_t q = 0; q < replicas; ++q) analytic[k].push_back(ev.value(grads[k].id(), q));

  for (std::size_t k = 0; k < wrt.size(); ++k) {
    for (int64_t q = 0; q < replicas; ++q) {
      for (std::size_t i = 0; i < sizeOf(wrt[k]); ++i) {
        auto lossWith = [&](double delta) {
          if (isInput(wrt[k])) {
            std::vector<double> values =
                feeds[static_cast<std::size_t>(wrt[k].id())][static_cast<std::size_t>(q)];
            values[i] += delta;
            ev.feed(wrt[k].id(), q, values);
          } else {
            ev.state(wrt[k].id(), q)[i] += delta;
          }
          ev.run();
          const double value = ev.sumOverReplicas(loss.id());
          if (isInput(wrt[k])) {
            ev.feed(wrt[k].id(), q,
                    feeds[static_cast<std::size_t>(wrt[k].id())][static_cast<std::size_t>(q)]);
          } else {
            ev.state(wrt[k].id(), q)[i] -= delta;
          }
          return value;
        };
        const double numeric = (lossWith(kStep) - lossWith(-kStep)) / (2 * kStep);
        const double exact = analytic[k][static_cast<std::size_t>(q)].at(i);
        INFO("d loss / d " << wrt[k].name() << "[" << i << "] on replica " << q << ": autodiff " << exact
                           << ", finite differences " << numeric);
        CHECK(std::abs(exact - numeric) <= kTolerance * std::max({1.0, std::abs(exact), std::abs(numeric)}));
      }
    }
  }
}

struct UnaryCase {
  std::string name;
  Shape shape;
  double lo;
  double hi;
  std::function<Tensor(Tensor)> op;
};

struct BinaryCase {
  std::string name;
  Shape a;
  Shape b;
  std::function<Tensor(Tensor, Tensor)> op;
  double lo = -1.0;  // inputs are drawn from [lo, hi]
  double hi = 1.0;
};

Tensor helperOp(OpKind kind, Tensor x, OpAttributes attributes) {
  Graph& g = x.graph();
  return {&g, g.op(g.addOp(kind, {x.id()}, std::move(attributes))).outputs[0]};
}

}  // namespace

TEST_CASE("gradient check of every single-input op") {
  const std::vector<UnaryCase> cases = {
      {"neg", {3, 4}, -1, 1, [](Tensor x) { return ops::neg(x); }},
      {"relu", {3, 4}, -1, 1, [](Tensor x) { return ops::relu(x); }},
      {"gelu", {3, 4}, -2, 2, [](Tensor x) { return ops::gelu(x); }},
      {"tanh", {3, 4}, -2, 2, [](Tensor x) { return ops::tanh(x); }},
      {"sigmoid", {3, 4}, -2, 2, [](Tensor x) { return ops::sigmoid(x); }},
      {"exp", {3, 4}, -1, 1, [](Tensor x) { return ops::exp(x); }},
      {"log", {3, 4}, 0.5, 2, [](Tensor x) { return ops::log(x); }},
      {"sqrt", {3, 4}, 0.5, 2, [](Tensor x) { return ops::sqrt(x); }},
      {"softmax", {3, 5}, -2, 2, [](Tensor x) { return ops::softmax(x); }},
      {"logSoftmax", {3, 5}, -2, 2, [](Tensor x) { return ops::logSoftmax(x); }},
      {"softmax of a 3-D tensor", {2, 2, 3}, -2, 2, [](Tensor x) { return ops::softmax(x); }},
      {"reduceSum over axis 1", {2, 3, 4}, -1, 1, [](Tensor x) { return ops::reduceSum(x, {1}); }},
      {"reduceSum keepDims over 0 and 2",
       {2, 3, 4},
       -1,
       1,
       [](Tensor x) {
         return ops::reduceSum(x, {0, 2}, true);
       }},
      {"reduceSum of all", {2, 3}, -1, 1, [](Tensor x) { return ops::reduceSum(x); }},
      {"reduceMean over the last axis", {2, 3, 4}, -1, 1, [](Tensor x) { return ops::reduceMean(x, {-1}); }},
      {"reduceMean of all, keepDims", {2, 3}, -1, 1, [](Tensor x) { return ops::reduceMean(x, {}, true); }},
      {"reshape",
       {3, 4},
       -1,
       1,
       [](Tensor x) {
         return ops::reshape(x, {2, -1});
       }},
      {"transpose",
       {2, 3, 4},
       -1,
       1,
       [](Tensor x) {
         return ops::transpose(x, {2, 0, 1});
       }},
      {"transpose reversed", {2, 3}, -1, 1, [](Tensor x) { return ops::transpose(x); }},
      {"slice",
       {4, 5},
       -1,
       1,
       [](Tensor x) {
         return ops::slice(x, {1, 2}, {3, 5});
       }},
      {"broadcastTo",
       {3, 1},
       -1,
       1,
       [](Tensor x) {
         return ops::broadcastTo(x, {2, 3, 4});
       }},
      {"copy", {3, 2}, -1, 1, [](Tensor x) { return ops::copy(x); }},
      {"abs", {3, 4}, -1, 1, [](Tensor x) { return ops::abs(x); }},
      {"x times sign(x): no gradient through sign",
       {3, 4},
       -1,
       1,
       [](Tensor x) { return ops::mul(x, ops::sign(x)); }},
      {"erf", {3, 4}, -2, 2, [](Tensor x) { return ops::erf(x); }},
      {"reciprocal", {3, 4}, 0.5, 2, [](Tensor x) { return ops::reciprocal(x); }},
      {"softplus", {3, 4}, -3, 3, [](Tensor x) { return ops::softplus(x); }},
      {"leakyRelu", {3, 4}, -1, 1, [](Tensor x) { return ops::leakyRelu(x, 0.2); }},
      {"elu", {3, 4}, -2, 2, [](Tensor x) { return ops::elu(x, 0.7); }},
      {"selu", {3, 4}, -2, 2, [](Tensor x) { return ops::selu(x); }},
      {"clip", {3, 4}, -1, 1, [](Tensor x) { return ops::clip(x, -0.5, 0.4); }},
      {"a chain through one input used twice",
       {3, 4},
       -1,
       1,
       [](Tensor x) { return ops::mul(ops::tanh(x), ops::add(x, x)); }},
      {"ReduceToShape",
       {2, 3, 4},
       -1,
       1,
       [](Tensor x) {
         OpAttributes a;
         a.shape = {3, 1};
         return helperOp(OpKind::ReduceToShape, x, a);
       }},
      {"SlicePad",
       {2, 3},
       -1,
       1,
       [](Tensor x) {
         OpAttributes a;
         a.starts = {1, 0};
         a.ends = {3, 3};
         a.shape = {4, 5};
         return helperOp(OpKind::SlicePad, x, a);
       }},
  };
  for (const UnaryCase& c : cases) {
    SUBCASE(c.name.c_str()) {
      Graph g;
      const Tensor x = ops::input(g, "x", c.shape);
      checkGradients(g, {x}, c.op(x), c.lo, c.hi);
    }
  }
}

TEST_CASE("gradient check of every two-input op, with broadcasting") {
  const std::vector<BinaryCase> cases = {
      {"matmul", {3, 4}, {4, 2}, [](Tensor a, Tensor b) { return ops::matmul(a, b); }},
      {"batched matmul", {2, 3, 4}, {4, 2}, [](Tensor a, Tensor b) { return ops::matmul(a, b); }},
      {"batchMatmul", {2, 3, 4}, {2, 4, 5}, [](Tensor a, Tensor b) { return ops::batchMatmul(a, b); }},
      {"batchMatmul over two batch axes",
       {2, 2, 1, 3},
       {2, 2, 3, 2},
       [](Tensor a, Tensor b) { return ops::batchMatmul(a, b); }},
      {"add", {3, 4}, {3, 4}, [](Tensor a, Tensor b) { return ops::add(a, b); }},
      {"add a row", {3, 4}, {4}, [](Tensor a, Tensor b) { return ops::add(a, b); }},
      {"add both broadcast", {3, 1}, {1, 4}, [](Tensor a, Tensor b) { return ops::add(a, b); }},
      {"sub a column", {2, 3, 4}, {3, 1}, [](Tensor a, Tensor b) { return ops::sub(a, b); }},
      {"mul", {3, 4}, {3, 4}, [](Tensor a, Tensor b) { return ops::mul(a, b); }},
      {"mul a scalar", {3, 4}, {}, [](Tensor a, Tensor b) { return ops::mul(a, b); }},
      {"div", {3, 4}, {3, 4}, [](Tensor a, Tensor b) { return ops::div(a, b); }, 0.5, 2.0},
      {"div by a row", {2, 4}, {4}, [](Tensor a, Tensor b) { return ops::div(a, b); }, 0.5, 2.0},
      {"concat axis 1",
       {2, 3},
       {2, 2},
       [](Tensor a, Tensor b) {
         return ops::concat({a, b}, 1);
       }},
      {"concat axis 0",
       {1, 3},
       {2, 3},
       [](Tensor a, Tensor b) {
         return ops::concat({a, b, a}, 0);
       }},
      {"scaledAddInplace",
       {3, 4},
       {3, 4},
       [](Tensor a, Tensor b) { return ops::scaledAddInplace(a, b, 0.7, -1.3); }},
      {"scaledAddInplace broadcasting y",
       {3, 4},
       {4},
       [](Tensor a, Tensor b) { return ops::scaledAddInplace(a, b, 1.0, 0.25); }},
      {"copyInplace", {3, 2}, {3, 2}, [](Tensor a, Tensor b) { return ops::copyInplace(a, b); }},
      {"pow", {3, 4}, {3, 4}, [](Tensor a, Tensor b) { return ops::pow(a, b); }, 0.5, 2.0},
      {"pow by a scalar exponent", {3, 4}, {}, [](Tensor a, Tensor b) { return ops::pow(a, b); }, 0.5, 2.0},
  };
  for (const BinaryCase& c : cases) {
    SUBCASE(c.name.c_str()) {
      Graph g;
      const Tensor a = ops::input(g, "a", c.a);
      const Tensor b = ops::input(g, "b", c.b);
      checkGradients(g, {a, b}, c.op(a, b), c.lo, c.hi);
    }
  }
}

TEST_CASE("gradient check of where: x and y, each broadcast, summed back to their shapes") {
  SUBCASE("a mask computed from data (no gradient through the comparison)") {
    Graph g(2);
    const Tensor a = ops::input(g, "a", {3, 4});
    const Tensor x = ops::input(g, "x", {3, 1});
    const Tensor y = ops::input(g, "y", {4});
    checkGradients(g, {x, y}, ops::where(ops::greater(a, ops::scalar(g, 0.0)), x, y), -1, 1);
  }
  SUBCASE("a constant mask") {
    Graph g(2);
    const Tensor a = ops::input(g, "a", {3, 4});
    const Tensor y = ops::input(g, "y", {4});
    const Tensor causal = ops::constant(g, "causal", {1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0}, {3, 4});
    checkGradients(g, {a, y}, ops::where(ops::logicalNot(causal), y, a), -1, 1, 11);
  }
}

TEST_CASE("gradient check of dropout: dy through the same mask, on every replica") {
  Graph g(2);
  const Tensor x = ops::input(g, "x", {4, 6});
  const Tensor step = ops::constant(g, "step", {5}, {}, DType::Int32);
  checkGradients(g, {x}, ops::dropout(x, step, 0.35, 9), -1, 1);
}

TEST_CASE("comparisons and logic have no gradient: autodiff goes around them") {
  Graph g;
  const Tensor a = ops::input(g, "a", {3});
  const Tensor b = ops::input(g, "b", {3});
  const Tensor mask = ops::logicalOr(ops::logicalAnd(ops::less(a, b), ops::equal(a, a)), ops::greater(a, b));
  const Tensor loss = ops::reduceSum(ops::mul(mask, a));
  const std::vector<Tensor> grads = autodiff(g, loss, {a, b});
  REQUIRE(grads.size() == 2);
  ReferenceEvaluator ev(g);
  ev.feed(a.id(), 0, {1.0, 2.0, 3.0});
  ev.feed(b.id(), 0, {2.0, 2.0, 1.0});
  ev.run();
  CHECK(ev.value(grads[0].id(), 0) == std::vector<double>{1.0, 0.0, 1.0});
  CHECK(ev.value(grads[1].id(), 0) == std::vector<double>{0.0, 0.0, 0.0});
}

TEST_CASE("gradient check of gather: repeated and negative indices add up") {
  Graph g(2);
  const Tensor table = ops::input(g, "table", {5, 3});
  const Tensor indices = ops::constant(g, "indices", {4, 0, -1, 2, 0, 1}, {2, 3}, DType::Int32);
  checkGradients(g, {table}, ops::gather(table, indices), -1, 1);
}

TEST_CASE("gradient check of gather along inner axes: repeated and negative indices add up") {
  SUBCASE("axis 1 of three, a matrix of indices") {
    Graph g(2);
    const Tensor table = ops::input(g, "table", {2, 5, 3});
    const Tensor indices = ops::constant(g, "indices", {4, 0, -1, 2, 0, 1}, {2, 3}, DType::Int32);
    checkGradients(g, {table}, ops::gather(table, indices, 1), -1, 1);
  }
  SUBCASE("the last axis (-1), one index: a class token") {
    Graph g(2);
    const Tensor table = ops::input(g, "table", {3, 4, 2});
    const Tensor index = ops::constant(g, "index", {-2}, {}, DType::Int32);
    checkGradients(g, {table}, ops::gather(table, index, -1), -1, 1);
  }
}

TEST_CASE("gradient check of gatherElements and scatterElements: repeated and negative indices") {
  SUBCASE("gatherElements along axis 1, indices shorter than the data off the axis") {
    Graph g(2);
    const Tensor data = ops::input(g, "data", {3, 4});
    const Tensor indices =
        ops::constant(g, "indices", {3, 0, -1, 0, 1, 1, 2, -4, 0, 3}, {2, 5}, DType::Int32);
    checkGradients(g, {data}, ops::gatherElements(data, indices, 1), -1, 1);
  }
  SUBCASE("gatherElements along axis 0 of three") {
    Graph g(2);
    const Tensor data = ops::input(g, "data", {3, 2, 2});
    const Tensor indices = ops::constant(g, "indices", {2, 0, -1, 1, 0, 0, 1, 2}, {2, 2, 2}, DType::Int32);
    checkGradients(g, {data}, ops::gatherElements(data, indices, 0), -1, 1);
  }
  SUBCASE("scatterElements writing, negative indices") {
    // Distinct positions: an update another one overwrites has derivative 0, where the rule (as
    // torch.scatter's) gives it its position's gradient (see the next test case).
    Graph g(2);
    const Tensor data = ops::input(g, "data", {3, 4});
    const Tensor updates = ops::input(g, "updates", {2, 3});
    const Tensor indices = ops::constant(g, "indices", {1, 0, -1, 0, 2, -1}, {2, 3}, DType::Int32);
    checkGradients(g, {data, updates}, ops::scatterElements(data, indices, updates, -1), -1, 1);
  }
  SUBCASE("scatterElements adding, repeated indices add up") {
    Graph g(2);
    const Tensor data = ops::input(g, "data", {3, 4});
    const Tensor updates = ops::input(g, "updates", {2, 3});
    const Tensor indices = ops::constant(g, "indices", {2, 2, -1, 2, 0, 1}, {2, 3}, DType::Int32);
    checkGradients(g, {data, updates}, ops::scatterElements(data, indices, updates, 0, true), -1, 1);
  }
}

TEST_CASE("scatterElements' data gradient is dy with the written positions zeroed") {
  Graph g;
  const Tensor data = ops::input(g, "data", {2, 3});
  const Tensor updates = ops::input(g, "updates", {1, 2});
  const Tensor indices = ops::constant(g, "indices", {2, 2}, {1, 2}, DType::Int32);
  const Tensor weights = ops::constant(g, "weights", {1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor loss = ops::reduceSum(ops::mul(ops::scatterElements(data, indices, updates, 1), weights));
  const std::vector<Tensor> grads = autodiff(g, loss, {data, updates});
  ReferenceEvaluator ev(g);
  ev.feed(data.id(), 0, {0.0, 0.0, 0.0, 0.0, 0.0, 0.0});
  ev.feed(updates.id(), 0, {0.0, 0.0});
  ev.run();
  CHECK(ev.value(grads[0].id(), 0) == std::vector<double>{1.0, 2.0, 0.0, 4.0, 5.0, 6.0});
  // Both updates write row 0, column 2 (the second one's value stays); each gets that position's
  // gradient, as torch.scatter's source does.
  CHECK(ev.value(grads[1].id(), 0) == std::vector<double>{3.0, 3.0});
}

TEST_CASE("gradient check of convolutions: 1-D, 2-D with groups, strides, pads and dilations, 3-D") {
  std::mt19937 rng(5);
  SUBCASE("1-D with a stride and uneven pads") {
    Graph g(2);
    const Tensor x = ops::input(g, "x", {2, 3, 8});
    const Tensor w = ops::variable(g, "w", randomFloats(rng, 4 * 3 * 3, -1, 1), {4, 3, 3});
    checkGradients(g, {x, w}, ops::conv(x, w, {.strides = {2}, .pads = {1, 2}}), -1, 1);
  }
  SUBCASE("2-D with groups, strides, pads and dilations") {
    Graph g;
    const Tensor x = ops::input(g, "x", {2, 4, 6, 5});
    const Tensor w = ops::variable(g, "w", randomFloats(rng, 6 * 2 * 3 * 2, -1, 1), {6, 2, 3, 2});
    checkGradients(
        g, {x, w},
        ops::conv(x, w, {.strides = {2, 1}, .pads = {1, 0, 1, 1}, .dilations = {1, 2}, .group = 2}), -1, 1);
  }
  SUBCASE("3-D") {
    Graph g;
    const Tensor x = ops::input(g, "x", {1, 2, 3, 4, 3});
    const Tensor w = ops::variable(g, "w", randomFloats(rng, 2 * 2 * 8, -1, 1), {2, 2, 2, 2, 2});
    checkGradients(g, {x, w}, ops::conv(x, w, {.strides = {1, 2, 1}, .pads = {1, 0, 0, 0, 1, 1}}), -1, 1);
  }
  SUBCASE("ConvTranspose with groups, output padding and dilations") {
    Graph g;
    const Tensor x = ops::input(g, "x", {2, 4, 3, 3});
    const Tensor w = ops::variable(g, "w", randomFloats(rng, 4 * 3 * 3 * 2, -1, 1), {4, 3, 3, 2});
    const Tensor y = ops::convTranspose(
        x, w,
        {.strides = {2, 3}, .pads = {1, 0, 0, 1}, .dilations = {1, 2}, .group = 2, .outputPadding = {1, 2}});
    CHECK(y.shape() == Shape{2, 6, 7, 10});
    checkGradients(g, {x, w}, y, -1, 1);
  }
  SUBCASE("ConvGradWeight, the weight's gradient, has gradients of its own") {
    Graph g;
    const Tensor dy = ops::input(g, "dy", {2, 4, 3, 3});
    const Tensor x = ops::input(g, "x", {2, 2, 5, 5});
    OpAttributes a;
    a.strides = {2, 2};
    a.pads = {1, 1, 1, 1};
    a.group = 2;
    a.shape = {4, 1, 3, 3};
    const Tensor dw = Tensor{&g, g.op(g.addOp(OpKind::ConvGradWeight, {dy.id(), x.id()}, a)).outputs[0]};
    checkGradients(g, {dy, x}, dw, -1, 1);
  }
}

TEST_CASE("gradient check of pools: max (first maximum wins), average with and without pads counted") {
  SUBCASE("MaxPool 2-D with strides, pads, dilations and ceil mode") {
    Graph g(2);
    const Tensor x = ops::input(g, "x", {2, 2, 7, 6});
    checkGradients(g, {x},
                   ops::maxPool(x, {.kernel = {3, 2},
                                    .strides = {2, 2},
                                    .pads = {1, 0, 1, 1},
                                    .dilations = {1, 2},
                                    .ceilMode = true}),
                   -1, 1);
  }
  SUBCASE("MaxPool 1-D and 3-D, global max pool") {
    Graph g;
    const Tensor x1 = ops::input(g, "x1", {2, 3, 9});
    const Tensor x3 = ops::input(g, "x3", {1, 2, 4, 3, 4});
    const Tensor y =
        ops::concat({ops::reshape(ops::maxPool(x1, {.kernel = {3}, .strides = {2}}), {-1}),
                     ops::reshape(ops::maxPool(x3, {.kernel = {2, 2, 2}, .strides = {2, 1, 2}}), {-1}),
                     ops::reshape(ops::globalMaxPool(x1), {-1})},
                    0);
    checkGradients(g, {x1, x3}, y, -1, 1);
  }
  for (bool countIncludePad : {false, true}) {
    SUBCASE(countIncludePad ? "AveragePool counting pads" : "AveragePool not counting pads") {
      Graph g;
      const Tensor x = ops::input(g, "x", {2, 3, 6, 5});
      const Tensor y = ops::averagePool(x, {.kernel = {3, 3},
                                            .strides = {2, 2},
                                            .pads = {1, 1, 2, 1},
                                            .ceilMode = true,
                                            .countIncludePad = countIncludePad});
      checkGradients(g, {x}, y, -1, 1);
      // Its gradient is linear in dy; the gradient of that is the pool again.
      Graph h;
      const Tensor dy = ops::input(h, "dy", y.shape());
      OpAttributes a = g.op(y.node().producer).attributes;
      a.shape = x.shape();
      checkGradients(h, {dy}, Tensor{&h, h.op(h.addOp(OpKind::AveragePoolGrad, {dy.id()}, a)).outputs[0]}, -1,
                     1);
    }
  }
  SUBCASE("global average pool") {
    Graph g;
    const Tensor x = ops::input(g, "x", {2, 3, 4, 2});
    const Tensor y = ops::globalAveragePool(x);
    CHECK(y.shape() == Shape{2, 3, 1, 1});
    checkGradients(g, {x}, y, -1, 1);
  }
}

TEST_CASE("gradient check of batch normalisation in training: through the statistics, and of the statistics") {
  SUBCASE("[3, 2, 2, 3]: the output") {
    Graph g(1);
    const Tensor x = ops::input(g, "x", {3, 2, 2, 3});
    const Tensor scale = ops::variable(g, "scale", {0.5f, 1.5f}, {2});
    const Tensor bias = ops::variable(g, "bias", {0.2f, -0.4f}, {2});
    checkGradients(g, {x, scale, bias}, ops::batchNormTraining(x, scale, bias, 1e-3).y, -1, 2);
  }
  SUBCASE("[5, 3] on 2 replicas: the output, the mean and the variance") {
    Graph g(2);
    const Tensor x = ops::input(g, "x", {5, 3});
    const Tensor scale = ops::variable(g, "scale", {0.5f, 1.5f, -1.0f}, {3});
    const Tensor bias = ops::variable(g, "bias", {0.2f, -0.4f, 0.1f}, {3});
    const ops::BatchNormOutputs bn = ops::batchNormTraining(x, scale, bias);
    const Tensor stats = ops::reshape(ops::add(bn.mean, ops::mul(bn.variance, bn.variance)), {1, 3});
    checkGradients(g, {x, scale, bias}, ops::add(bn.y, stats), -1, 2);
  }
}

TEST_CASE("gradient check of the recurrences: Rnn, Gru (both resets), Lstm, each direction, every output") {
  struct Case {
    const char* name;
    OpKind cell;
    RecurrenceDirection direction;
    bool linearBeforeReset;
  };
  const Case cases[] = {
      {"Rnn forward", OpKind::Rnn, RecurrenceDirection::Forward, false},
      {"Rnn bidirectional", OpKind::Rnn, RecurrenceDirection::Bidirectional, false},
      {"Gru forward, linear before reset (PyTorch's)", OpKind::Gru, RecurrenceDirection::Forward, true},
      {"Gru reverse, reset before the product (ONNX's default)", OpKind::Gru, RecurrenceDirection::Reverse,
       false},
      {"Gru bidirectional, reset before the product", OpKind::Gru, RecurrenceDirection::Bidirectional, false},
      {"Lstm forward", OpKind::Lstm, RecurrenceDirection::Forward, false},
      {"Lstm bidirectional", OpKind::Lstm, RecurrenceDirection::Bidirectional, false},
  };
  for (const Case& c : cases) {
    SUBCASE(c.name) {
      Graph g(2);
      const int64_t steps = 3, batch = 2, features = 3, hidden = 2;
      const int64_t dirs = c.direction == RecurrenceDirection::Bidirectional ? 2 : 1;
      const int64_t gates = c.cell == OpKind::Gru ? 3 : c.cell == OpKind::Lstm ? 4 : 1;
      const bool lstm = c.cell == OpKind::Lstm;
      const Tensor x = ops::input(g, "x", {steps, batch, features});
      const Tensor w = ops::input(g, "w", {dirs, gates * hidden, features});
      const Tensor r = ops::input(g, "rec", {dirs, gates * hidden, hidden});
      const Tensor b = ops::input(g, "b", {dirs, 2 * gates * hidden});
      const Tensor h0 = ops::input(g, "h0", {dirs, batch, hidden});
      const Tensor c0 = lstm ? ops::input(g, "c0", {dirs, batch, hidden}) : Tensor{};
      const ops::RecurrenceOutputs out =
          ops::recurrence(c.cell, x, w, r, b, h0, c0, {c.direction, c.linearBeforeReset});
      CHECK(out.y.shape() == Shape{steps, dirs, batch, hidden});
      CHECK(out.yH.shape() == Shape{dirs, batch, hidden});
      std::vector<Tensor> parts{ops::reshape(out.y, {-1}), ops::reshape(out.yH, {-1})};
      std::vector<Tensor> wrt{x, w, r, b, h0};
      if (lstm) {
        parts.push_back(ops::reshape(out.yC, {-1}));
        wrt.push_back(c0);
      }
      checkGradients(g, wrt, ops::concat(parts, 0), -1, 1);
    }
  }
}

TEST_CASE("MaxPoolGrad routes each window's gradient to its first maximum in scan order") {
  Graph g;
  const Tensor x = ops::input(g, "x", {1, 1, 4});
  const Tensor y = ops::maxPool(x, {.kernel = {2}, .strides = {1}});
  const Tensor loss = ops::reduceSum(y);
  const std::vector<Tensor> grads = autodiff(g, loss, {x});
  ReferenceEvaluator ev(g);
  ev.feed(x.id(), 0, {2.0, 2.0, 1.0, 3.0});
  ev.run();
  // Windows [2, 2] (the first 2 wins; the last would give {0, 2, 0, 1}), [2, 1], [1, 3].
  CHECK(ev.value(grads[0].id(), 0) == std::vector<double>{1.0, 1.0, 0.0, 1.0});
}

TEST_CASE("gradient check of softmax cross-entropy with Sum and Mean") {
  for (ReductionType reduction : {ReductionType::Sum, ReductionType::Mean}) {
    SUBCASE(std::string(toString(reduction)).c_str()) {
      Graph g;
      const Tensor logits = ops::input(g, "logits", {4, 5});
      const Tensor labels = ops::constant(g, "labels", {0, 3, 1, 4}, {4}, DType::Int32);
      checkGradients(g, {logits}, ops::softmaxCrossEntropy(logits, labels, reduction), -2, 2);
    }
  }
}

TEST_CASE("gradient check of the collectives on 4 replicas in three groupings") {
  const std::vector<ReplicaGrouping> groupings = {ReplicaGrouping(4, 1, 4), ReplicaGrouping(4, 1, 2),
                                                  ReplicaGrouping(4, 2, 2)};
  for (const ReplicaGrouping& grouping : groupings) {
    const int64_t gs = grouping.groupSize();
    SUBCASE(grouping.str().c_str()) {
      for (ReductionType reduction : {ReductionType::Sum, ReductionType::Mean}) {
        CAPTURE(toString(reduction));
        {
          Graph g(4);
          const Tensor x = ops::input(g, "x", {3, 5});
          checkGradients(g, {x}, ops::replicatedAllReduce(x, reduction, grouping), -1, 1);
        }
        {
          // 15 elements over the group: the shards carry zero padding.
          Graph g(4);
          const Tensor x = ops::input(g, "x", {3, 5});
          checkGradients(g, {x}, ops::replicatedReduceScatter(x, reduction, grouping), -1, 1);
        }
      }
      {
        Graph g(4);
        const Tensor shard = ops::input(g, "shard", {3});
        checkGradients(g, {shard}, ops::replicatedAllGather(shard, grouping), -1, 1);
      }
      {
        // A shard of a [3, 5] tensor gathered back to its full shape (padding dropped).
        Graph g(4);
        const int64_t s = (15 + gs - 1) / gs;
        const Tensor shard = ops::input(g, "shard", {s});
        checkGradients(g, {shard}, ops::replicatedAllGather(shard, grouping, {3, 5}), -1, 1);
      }
      {
        Graph g(4);
        const Tensor x = ops::input(g, "x", {3, 5});
        checkGradients(g, {x}, ops::replicaShardedSlice(x, grouping), -1, 1);
      }
      {
        Graph g(4);
        const Tensor x = ops::input(g, "x", {(15 + gs - 1) / gs});
        OpAttributes a;
        a.grouping = grouping;
        a.shape = {3, 5};
        checkGradients(g, {x}, helperOp(OpKind::ReplicaShardedPad, x, a), -1, 1);
      }
      {
        // Reduce-scatter then gather back: the RTS round trip.
        Graph g(4);
        const Tensor x = ops::input(g, "x", {2, 5});
        const Tensor y =
            ops::replicatedAllGather(ops::replicatedReduceScatter(x, ReductionType::Sum, grouping), grouping);
        CHECK(y.shape() == Shape{2, 5});
        checkGradients(g, {x}, ops::tanh(y), -1, 1);
      }
    }
  }
}

TEST_CASE("gradient check of a small MLP with relu and softmax cross-entropy") {
  // 784 -> 16 -> 10 scaled down to 20 -> 8 -> 4.
  std::mt19937 rng(3);
  Graph g;
  const Tensor x = ops::input(g, "x", {5, 20});
  const Tensor w0 = ops::variable(g, "W0", randomFloats(rng, 160, -0.5, 0.5), {20, 8});
  const Tensor b0 = ops::variable(g, "b0", randomFloats(rng, 8, -0.1, 0.1), {8});
  const Tensor w1 = ops::variable(g, "W1", randomFloats(rng, 32, -0.5, 0.5), {8, 4});
  const Tensor b1 = ops::variable(g, "b1", randomFloats(rng, 4, -0.1, 0.1), {4});
  const Tensor labels = ops::constant(g, "labels", {0, 3, 1, 2, 3}, {5}, DType::Int32);
  const Tensor h = ops::relu(ops::add(ops::matmul(x, w0), b0));
  const Tensor logits = ops::add(ops::matmul(h, w1), b1);
  checkGradients(g, {w0, b0, w1, b1, x}, ops::softmaxCrossEntropy(logits, labels, ReductionType::Mean), 0, 1);
  CHECK(g.tryFind("W0.grad"));
  CHECK(g.tryFind("b1.grad"));
}

TEST_CASE(
    "gradient check of the seed's RTS MLP on 2 replicas: sharded weights gathered, gradients per shard") {
  std::mt19937 rng(5);
  Graph g(2);
  const Tensor x = ops::input(g, "x", {3, 6});
  const ShardedVariable w0 = ops::replicaShardedVariable(g, "W0", randomFloats(rng, 30, -0.5, 0.5), {6, 5});
  const RemoteBuffer buffer = ops::remoteBuffer(g, {10}, DType::Float32, 2);
  const Tensor w1var =
      ops::remoteReplicaShardedVariable(g, "W1", randomFloats(rng, 20, -0.5, 0.5), {5, 4}, buffer, 0);
  const Tensor w1shard = ops::remoteLoad(g, buffer, 0);
  const Tensor w0full = ops::replicatedAllGather(w0.shard);
  const Tensor w1full = ops::replicatedAllGather(w1shard);
  CHECK(w0full.shape() == Shape{6, 5});
  CHECK(w1full.shape() == Shape{5, 4});
  const Tensor labels = ops::constant(g, "labels", {0, 3, 1}, {3}, DType::Int32);
  const Tensor logits = ops::matmul(ops::gelu(ops::matmul(x, w0full)), w1full);
  // The shard of W0 is a variable: its gradient sums both replicas' contributions.
  checkGradients(g, {w0.shard, x}, ops::softmaxCrossEntropy(logits, labels, ReductionType::Sum), -1, 1);
  CHECK(w1var.node().remoteBuffer == buffer.id());
}

TEST_CASE("autodiff names gradients, gives unused tensors a zero gradient") {
  Graph g;
  const Tensor x = ops::input(g, "x", {2, 3});
  const Tensor unused = ops::variable(g, "unused", {1, 2}, {2});
  const Tensor w = ops::variable(g, "w", {1, 2, 3}, {3});
  const Tensor loss = ops::reduceSum(ops::mul(x, w));
  const std::vector<Tensor> grads = autodiff(g, loss, {w, unused, x});
  CHECK(grads[0].name() == "w.grad");
  CHECK(grads[1].name() == "unused.grad");
  CHECK(grads[2].name() == "x.grad");
  CHECK(grads[0].shape() == Shape{3});
  CHECK(grads[1].shape() == Shape{2});
  ReferenceEvaluator ev(g);
  ev.feed(x.id(), 0, {1, 2, 3, 4, 5, 6});
  ev.run();
  CHECK(ev.value(grads[0].id(), 0) == std::vector<double>{5, 7, 9});
  CHECK(ev.value(grads[1].id(), 0) == std::vector<double>{0, 0});
  CHECK(ev.value(grads[2].id(), 0) == std::vector<double>{1, 2, 3, 1, 2, 3});
}

TEST_CASE("autodiff errors name the loss, the op and the tensor") {
  SUBCASE("the loss must be a float scalar") {
    Graph g;
    const Tensor x = ops::input(g, "x", {2, 3});
    auto e = test::catchError<AutodiffError>([&] { autodiff(g, x, {x}); });
    REQUIRE(e);
    CHECK(e->code() == ErrorCode::LossNotScalar);
    CHECK(e->subject() == "x");
    const Tensor counts = ops::input(g, "counts", {}, DType::Int32);
    e = test::catchError<AutodiffError>([&] { autodiff(g, counts, {x}); });
    REQUIRE(e);
    CHECK(e->code() == ErrorCode::LossNotScalar);
    CHECK(e->subject() == "counts");
  }
  SUBCASE("an op without gradient on the path") {
    Graph g;
    const Tensor x = ops::input(g, "x", {3});
    const Tensor dy = ops::input(g, "dy", {3});
    const Tensor hidden = ops::relu(x);
    const Tensor second{&g, g.op(g.addOp(OpKind::ReluGrad, {dy.id(), hidden.id()})).outputs[0]};
    auto e = test::catchError<AutodiffError>([&] { autodiff(g, ops::reduceSum(second), {x}); });
    REQUIRE(e);
    CHECK(e->code() == ErrorCode::NoGradient);
    CHECK(e->subject() == "ReluGrad");
    CHECK(std::string(e->what()).find("\"Relu\"") != std::string::npos);
  }
  SUBCASE("int tensors have no gradient") {
    Graph g;
    const Tensor labels = ops::input(g, "labels", {3}, DType::Int32);
    const Tensor x = ops::input(g, "x", {3});
    auto e = test::catchError<AutodiffError>([&] { autodiff(g, ops::reduceSum(x), {labels}); });
    REQUIRE(e);
    CHECK(e->code() == ErrorCode::NoGradient);
    CHECK(e->subject() == "labels");
  }
  SUBCASE("handles from another graph") {
    Graph g;
    Graph other;
    const Tensor x = ops::input(other, "x", {});
    auto e = test::catchError<GraphError>([&] { autodiff(g, x, {x}); });
    REQUIRE(e);
    CHECK(e->code() == ErrorCode::InvalidOperand);
    CHECK(e->subject() == "autodiff");
  }
}
