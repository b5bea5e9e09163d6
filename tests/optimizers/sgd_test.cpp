// SGD: the update ops against a scalar hand computation of PyTorch's rules,
// run by the reference evaluator in double precision.
#include "tessera/optimizers/sgd.hpp"

#include <cmath>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "support/reference_evaluator.hpp"
#include "tessera/lib/ops.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

const std::vector<double> kInitial{0.5, -1.25, 2.0};
// The gradient of each step; dyadic values keep float32 constants exact.
const std::vector<std::vector<double>> kGradients{{0.25, -0.5, 1.0}, {-0.75, 0.125, 0.5}, {0.5, 0.25, -1.5}};

std::vector<float> toFloat(const std::vector<double>& values) { return {values.begin(), values.end()}; }

// PyTorch's SGD for one element, with a learning rate per step.
std::vector<double> handSgd(const SgdOptions& o, const std::vector<double>& learningRates,
                            std::size_t element) {
  double w = kInitial[element];
  double v = 0.0;
  std::vector<double> history;
  for (std::size_t step = 0; step < learningRates.size(); ++step) {
    double g = kGradients[step][element] + o.weightDecay * w;
    if (o.momentum > 0) {
      v = step == 0 ? g : o.momentum * v + (1.0 - o.dampening) * g;
      g = o.nesterov ? g + o.momentum * v : v;
    }
    w -= learningRates[step] * g;
    history.push_back(w);
  }
  return history;
}

struct Fixture {
  Graph graph{1};
  Tensor weight;
  Tensor gradient;

  explicit Fixture(Optimizer& optimizer) {
    weight = ops::variable(graph, "w", toFloat(kInitial), {3});
    gradient = ops::input(graph, "g", {3});
    optimizer.addUpdates(graph, {{weight.id(), gradient.id()}});
  }
};

void writeHyperParameters(test::ReferenceEvaluator& evaluator, const Optimizer& optimizer, int64_t step) {
  for (const HyperParameter& h : optimizer.hyperParameters(step)) {
    for (int64_t r = 0; r < evaluator.replicas(); ++r) evaluator.state(h.tensor, r).assign(1, h.value);
  }
}

struct SgdCase {
  std::string name;
  SgdOptions options;
};

TEST_CASE("SGD matches PyTorch's update over three steps") {
  const std::vector<SgdCase> cases{
      {"plain", {.learningRate = 0.1}},
      {"momentum", {.learningRate = 0.1, .momentum = 0.75}},
      {"momentum and dampening", {.learningRate = 0.1, .momentum = 0.75, .dampening = 0.25}},
      {"nesterov", {.learningRate = 0.1, .momentum = 0.5, .nesterov = true}},
      {"weight decay", {.learningRate = 0.1, .weightDecay = 0.0625}},
      {"everything", {.learningRate = 0.2, .momentum = 0.875, .weightDecay = 0.125, .nesterov = true}},
  };
  for (const SgdCase& c : cases) {
    CAPTURE(c.name);
    Sgd sgd(c.options);
    Fixture f(sgd);
    test::ReferenceEvaluator evaluator(f.graph);
    const std::vector<double> rates(3, c.options.learningRate);
    for (int64_t step = 0; step < 3; ++step) {
      writeHyperParameters(evaluator, sgd, step);
      evaluator.feed(f.gradient.id(), 0, kGradients[static_cast<std::size_t>(step)]);
      evaluator.run();
      for (std::size_t e = 0; e < 3; ++e) {
        CHECK(evaluator.value(f.weight.id(), 0)[e] ==
              doctest::Approx(handSgd(c.options, rates, e)[static_cast<std::size_t>(step)]).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("a new learning rate takes effect at the next step without rebuilding the graph") {
  const SgdOptions options{.learningRate = 0.1, .momentum = 0.75};
  Sgd sgd(options);
  Fixture f(sgd);
  test::ReferenceEvaluator evaluator(f.graph);
  const std::vector<double> rates{0.1, 0.025, 0.5};
  for (int64_t step = 0; step < 3; ++step) {
    sgd.setLearningRate(rates[static_cast<std::size_t>(step)]);
    writeHyperParameters(evaluator, sgd, step);
    evaluator.feed(f.gradient.id(), 0, kGradients[static_cast<std::size_t>(step)]);
    evaluator.run();
  }
  for (std::size_t e = 0; e < 3; ++e) {
    CHECK(evaluator.value(f.weight.id(), 0)[e] ==
          doctest::Approx(handSgd(options, rates, e)[2]).epsilon(1e-12));
  }
  CHECK(sgd.learningRate() == 0.5);
  CHECK(sgd.options().learningRate == 0.5);
}

TEST_CASE("SGD hyper-parameters are float32 scalar variables written per step") {
  Sgd sgd({.learningRate = 0.1, .momentum = 0.9, .dampening = 0.25});
  CHECK(sgd.hyperParameters(0).empty());
  Fixture f(sgd);
  const auto first = sgd.hyperParameters(0);
  const auto later = sgd.hyperParameters(4);
  REQUIRE(first.size() == 3);
  const std::vector<std::string> names{"optimizer.learningRate", "optimizer.momentumFactor",
                                       "optimizer.dampeningFactor"};
  const std::vector<double> firstValues{0.1, 0.0, 1.0};
  const std::vector<double> laterValues{0.1, 0.9, 0.75};
  for (std::size_t i = 0; i < 3; ++i) {
    const TensorNode& node = f.graph.tensor(first[i].tensor);
    CHECK(node.name == names[i]);
    CHECK(node.shape.empty());
    CHECK(node.dtype == DType::Float32);
    CHECK(node.category == TensorCategory::OptimizerState);
    CHECK(f.graph.op(node.producer).kind == OpKind::Variable);
    CHECK(first[i].value == doctest::Approx(firstValues[i]));
    CHECK(later[i].tensor == first[i].tensor);
    CHECK(later[i].value == doctest::Approx(laterValues[i]));
  }
  Sgd plain({.learningRate = 0.1});
  Fixture p(plain);
  CHECK(plain.hyperParameters(1).size() == 1);
  CHECK_FALSE(p.graph.tryFind("w.momentum").has_value());
}

TEST_CASE("the momentum buffer is optimizer state grouped like its weight") {
  Graph graph(4);
  const ReplicaGrouping grouping(4, 1, 2);
  const Tensor w = ops::variable(graph, "w", {1, 2, 3, 4}, {2}, grouping);
  const Tensor g = ops::input(graph, "g", {2});
  Sgd sgd({.learningRate = 0.1, .momentum = 0.5});
  sgd.addUpdates(graph, {{w.id(), g.id()}});
  const TensorNode& momentum = graph.tensor(graph.find("w.momentum"));
  CHECK(momentum.category == TensorCategory::OptimizerState);
  CHECK(momentum.grouping == grouping);
  CHECK(momentum.shape == Shape{2});
}

TEST_CASE("SGD updates the shards of a replica-sharded weight elementwise") {
  Graph graph(2);
  const ShardedVariable w = ops::replicaShardedVariable(graph, "w", {0.5F, -1.25F, 2.0F}, {3});
  const Tensor g = ops::input(graph, "g", w.shard.shape());
  const SgdOptions options{.learningRate = 0.25, .momentum = 0.5, .weightDecay = 0.125};
  Sgd sgd(options);
  sgd.addUpdates(graph, {{w.shard.id(), g.id()}});
  CHECK(graph.tensor(graph.find("w.momentum")).metaShape == Shape{3});
  test::ReferenceEvaluator evaluator(graph);
  std::vector<std::vector<double>> expected(2), velocity(2);
  for (int64_t r = 0; r < 2; ++r) {
    expected[r] = evaluator.state(w.shard.id(), r);
    velocity[r].assign(expected[r].size(), 0.0);
  }
  for (int64_t step = 0; step < 3; ++step) {
    writeHyperParameters(evaluator, sgd, step);
    for (int64_t r = 0; r < 2; ++r) {
      std::vector<double> gradient{0.25 * static_cast<double>(step + 1), -0.5 * static_cast<double>(r + 1)};
      evaluator.feed(g.id(), r, gradient);
      for (std::size_t e = 0; e < 2; ++e) {
        const double gd = gradient[e] + options.weightDecay * expected[r][e];
        velocity[r][e] = step == 0 ? gd : options.momentum * velocity[r][e] + gd;
        expected[r][e] -= options.learningRate * velocity[r][e];
      }
    }
    evaluator.run();
  }
  for (int64_t r = 0; r < 2; ++r) {
    for (std::size_t e = 0; e < 2; ++e)
      CHECK(evaluator.value(w.shard.id(), r)[e] == doctest::Approx(expected[r][e]));
  }
}

TEST_CASE("SGD rejects invalid options and operands") {
  struct ConfigCase {
    SgdOptions options;
    ErrorCode code;
    std::string subject;
  };
  const std::vector<ConfigCase> cases{
      {{.learningRate = 0}, ErrorCode::OutOfRange, "/optimizer/learningRate"},
      {{.momentum = 1.0}, ErrorCode::OutOfRange, "/optimizer/momentum"},
      {{.dampening = -0.5}, ErrorCode::OutOfRange, "/optimizer/dampening"},
      {{.weightDecay = -1}, ErrorCode::OutOfRange, "/optimizer/weightDecay"},
      {{.momentum = 0, .nesterov = true}, ErrorCode::InvalidOptimizer, "/optimizer/nesterov"},
  };
  for (const ConfigCase& c : cases) {
    CAPTURE(c.subject);
    const auto error = test::catchError<ConfigError>([&] { Sgd sgd(c.options); });
    REQUIRE(error);
    CHECK(error->code() == c.code);
    CHECK(error->subject() == c.subject);
  }

  Sgd sgd({});
  const auto rate = test::catchError<ConfigError>([&] { sgd.setLearningRate(0.0); });
  REQUIRE(rate);
  CHECK(rate->code() == ErrorCode::OutOfRange);
  CHECK(rate->subject() == "/optimizer/learningRate");
  CHECK(sgd.learningRate() == SgdOptions{}.learningRate);

  Graph graph(1);
  const Tensor w = ops::variable(graph, "w", {1, 2, 3}, {3});
  const Tensor wrongShape = ops::input(graph, "g", {2});
  const auto shape = test::catchError<GraphError>([&] {
    sgd.addUpdates(graph, {{w.id(), wrongShape.id()}});
  });
  REQUIRE(shape);
  CHECK(shape->code() == ErrorCode::ShapeMismatch);
  CHECK(shape->subject() == "w");
  CHECK(std::string(shape->what()).find("[3]") != std::string::npos);

  const Tensor x = ops::input(graph, "x", {3});
  const auto notVariable = test::catchError<GraphError>([&] { sgd.addUpdates(graph, {{x.id(), w.id()}}); });
  REQUIRE(notVariable);
  CHECK(notVariable->code() == ErrorCode::InvalidOperand);
  CHECK(notVariable->subject() == "x");
}

TEST_CASE("makeOptimizer builds the configured optimizer") {
  OptimizerConfig config;
  config.sgd.learningRate = 0.5;
  const auto sgd = makeOptimizer(config);
  CHECK(sgd->name() == "SGD");
  CHECK(sgd->learningRate() == 0.5);
  config.type = OptimizerType::Adam;
  config.adam.learningRate = 0.002;
  config.adam.decoupledWeightDecay = true;
  const auto adam = makeOptimizer(config);
  CHECK(adam->name() == "Adam");
  CHECK(adam->learningRate() == 0.002);
  config.type = OptimizerType::AdamW;
  config.adam.decoupledWeightDecay = false;
  CHECK(makeOptimizer(config)->name() == "AdamW");
  config.adam.beta1 = 1.0;
  const auto error = test::catchError<ConfigError>([&] { makeOptimizer(config); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::OutOfRange);
  CHECK(error->subject() == "/optimizer/beta1");
}

}  // namespace
}  // namespace tessera
