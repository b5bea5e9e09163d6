// Adam and AdamW: the update ops against a scalar hand computation of the
// textbook rules, run by the reference evaluator in double precision.
#include "tessera/optimizers/adam.hpp"

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
const std::vector<std::vector<double>> kGradients{{0.25, -0.5, 1.0}, {-0.75, 0.125, 0.5}, {0.5, 0.25, -1.5}};

// Adam for one element: bias-corrected moments, L2 or decoupled decay.
std::vector<double> handAdam(const AdamOptions& o, const std::vector<double>& learningRates,
                             std::size_t element) {
  double w = kInitial[element];
  double m = 0.0;
  double v = 0.0;
  std::vector<double> history;
  for (std::size_t step = 0; step < learningRates.size(); ++step) {
    const double lr = learningRates[step];
    double g = kGradients[step][element];
    if (!o.decoupledWeightDecay) g += o.weightDecay * w;
    m = o.beta1 * m + (1 - o.beta1) * g;
    v = o.beta2 * v + (1 - o.beta2) * g * g;
    const double t = static_cast<double>(step + 1);
    const double mhat = o.biasCorrection ? m / (1 - std::pow(o.beta1, t)) : m;
    const double vhat = o.biasCorrection ? v / (1 - std::pow(o.beta2, t)) : v;
    if (o.decoupledWeightDecay) w -= lr * o.weightDecay * w;
    w -= lr * mhat / (std::sqrt(vhat) + o.eps);
    history.push_back(w);
  }
  return history;
}

void writeHyperParameters(test::ReferenceEvaluator& evaluator, const Optimizer& optimizer, int64_t step) {
  for (const HyperParameter& h : optimizer.hyperParameters(step)) {
    for (int64_t r = 0; r < evaluator.replicas(); ++r) evaluator.state(h.tensor, r).assign(1, h.value);
  }
}

// Dyadic betas, eps and decay keep the float32 constants exact.
constexpr AdamOptions kBase{.learningRate = 0.125, .beta1 = 0.875, .beta2 = 0.9375, .eps = 1.0 / 1024};

struct AdamCase {
  std::string name;
  AdamOptions options;
  std::string expectedName;
};

TEST_CASE("Adam and AdamW match the textbook update over three steps") {
  AdamOptions noCorrection = kBase;
  noCorrection.biasCorrection = false;
  AdamOptions l2 = kBase;
  l2.weightDecay = 0.0625;
  AdamOptions decoupled = l2;
  decoupled.decoupledWeightDecay = true;
  const std::vector<AdamCase> cases{
      {"adam", kBase, "Adam"},
      {"adam without bias correction", noCorrection, "Adam"},
      {"adam with L2 weight decay", l2, "Adam"},
      {"adamw", decoupled, "AdamW"},
  };
  for (const AdamCase& c : cases) {
    CAPTURE(c.name);
    Adam adam(c.options);
    CHECK(adam.name() == c.expectedName);
    Graph graph(1);
    const Tensor w = ops::variable(graph, "w", {0.5F, -1.25F, 2.0F}, {3});
    const Tensor g = ops::input(graph, "g", {3});
    adam.addUpdates(graph, {{w.id(), g.id()}});
    test::ReferenceEvaluator evaluator(graph);
    const std::vector<double> rates(3, c.options.learningRate);
    for (int64_t step = 0; step < 3; ++step) {
      writeHyperParameters(evaluator, adam, step);
      evaluator.feed(g.id(), 0, kGradients[static_cast<std::size_t>(step)]);
      evaluator.run();
      for (std::size_t e = 0; e < 3; ++e) {
        CHECK(evaluator.value(w.id(), 0)[e] ==
              doctest::Approx(handAdam(c.options, rates, e)[static_cast<std::size_t>(step)]).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("Adam's learning rate changes between steps without rebuilding the graph") {
  AdamOptions options = kBase;
  options.weightDecay = 0.25;
  options.decoupledWeightDecay = true;
  Adam adam(options);
  Graph graph(1);
  const Tensor w = ops::variable(graph, "w", {0.5F, -1.25F, 2.0F}, {3});
  const Tensor g = ops::input(graph, "g", {3});
  adam.addUpdates(graph, {{w.id(), g.id()}});
  test::ReferenceEvaluator evaluator(graph);
  const std::vector<double> rates{0.125, 0.5, 0.0625};
  for (int64_t step = 0; step < 3; ++step) {
    adam.setLearningRate(rates[static_cast<std::size_t>(step)]);
    writeHyperParameters(evaluator, adam, step);
    evaluator.feed(g.id(), 0, kGradients[static_cast<std::size_t>(step)]);
    evaluator.run();
  }
  for (std::size_t e = 0; e < 3; ++e) {
    CHECK(evaluator.value(w.id(), 0)[e] == doctest::Approx(handAdam(options, rates, e)[2]).epsilon(1e-12));
  }
}

TEST_CASE("Adam's hyper-parameters and state") {
  Adam adam(kBase);
  Graph graph(4);
  const ReplicaGrouping grouping(4, 2, 2);
  const Tensor w = ops::variable(graph, "w", {1, 2, 3, 4}, {2}, grouping);
  const Tensor g = ops::input(graph, "g", {2});
  adam.addUpdates(graph, {{w.id(), g.id()}});
  for (const char* name : {"w.adamM", "w.adamV"}) {
    CAPTURE(name);
    const TensorNode& state = graph.tensor(graph.find(name));
    CHECK(state.category == TensorCategory::OptimizerState);
    CHECK(state.grouping == grouping);
    CHECK(state.shape == Shape{2});
    CHECK(graph.op(state.producer).kind == OpKind::Variable);
  }
  const auto step2 = adam.hyperParameters(2);
  REQUIRE(step2.size() == 3);
  CHECK(graph.tensor(step2[0].tensor).name == "optimizer.learningRate");
  CHECK(graph.tensor(step2[1].tensor).name == "optimizer.biasCorrection1");
  CHECK(graph.tensor(step2[2].tensor).name == "optimizer.biasCorrection2");
  CHECK(step2[0].value == 0.125);
  CHECK(step2[1].value == doctest::Approx(1.0 / (1.0 - std::pow(0.875, 3))));
  CHECK(step2[2].value == doctest::Approx(1.0 / std::sqrt(1.0 - std::pow(0.9375, 3))));
  for (const HyperParameter& h : step2)
    CHECK(graph.tensor(h.tensor).category == TensorCategory::OptimizerState);
}

TEST_CASE("Adam updates the shards of a replica-sharded weight elementwise") {
  Graph graph(2);
  const ShardedVariable w = ops::replicaShardedVariable(graph, "w", {0.5F, -1.25F, 2.0F}, {3});
  const Tensor g = ops::input(graph, "g", w.shard.shape());
  Adam adam(kBase);
  adam.addUpdates(graph, {{w.shard.id(), g.id()}});
  CHECK(graph.tensor(graph.find("w.adamV")).metaShape == Shape{3});
  test::ReferenceEvaluator evaluator(graph);
  std::vector<std::vector<double>> expected(2), m(2), v(2);
  for (std::size_t r = 0; r < 2; ++r) {
    expected[r] = evaluator.state(w.shard.id(), static_cast<int64_t>(r));
    m[r].assign(2, 0.0);
    v[r].assign(2, 0.0);
  }
  for (int64_t step = 0; step < 3; ++step) {
    writeHyperParameters(evaluator, adam, step);
    const double t = static_cast<double>(step + 1);
    for (std::size_t r = 0; r < 2; ++r) {
      const std::vector<double> gradient{0.25 * t, -0.5 * static_cast<double>(r + 1)};
      evaluator.feed(g.id(), static_cast<int64_t>(r), gradient);
      for (std::size_t e = 0; e < 2; ++e) {
        m[r][e] = kBase.beta1 * m[r][e] + (1 - kBase.beta1) * gradient[e];
        v[r][e] = kBase.beta2 * v[r][e] + (1 - kBase.beta2) * gradient[e] * gradient[e];
        const double mhat = m[r][e] / (1 - std::pow(kBase.beta1, t));
        const double vhat = v[r][e] / (1 - std::pow(kBase.beta2, t));
        expected[r][e] -= kBase.learningRate * mhat / (std::sqrt(vhat) + kBase.eps);
      }
    }
    evaluator.run();
  }
  for (std::size_t r = 0; r < 2; ++r) {
    for (std::size_t e = 0; e < 2; ++e) {
      CHECK(evaluator.value(w.shard.id(), static_cast<int64_t>(r))[e] == doctest::Approx(expected[r][e]));
    }
  }
}

TEST_CASE("Adam rejects invalid options") {
  struct ConfigCase {
    AdamOptions options;
    std::string subject;
  };
  const std::vector<ConfigCase> cases{
      {{.learningRate = -1}, "/optimizer/learningRate"},
      {{.beta1 = 1.0}, "/optimizer/beta1"},
      {{.beta2 = -0.1}, "/optimizer/beta2"},
      {{.eps = 0}, "/optimizer/eps"},
      {{.weightDecay = -0.5}, "/optimizer/weightDecay"},
  };
  for (const ConfigCase& c : cases) {
    CAPTURE(c.subject);
    const auto error = test::catchError<ConfigError>([&] { Adam adam(c.options); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::OutOfRange);
    CHECK(error->subject() == c.subject);
  }
}

}  // namespace
}  // namespace tessera
