// Adam / AdamW update ops (see include/tessera/optimizers/adam.hpp).
#include "tessera/optimizers/adam.hpp"

#include <cmath>

#include "json_reader.hpp"
#include "optimizer_options_json.hpp"

namespace tessera {
namespace {

const AdamOptions& checked(const AdamOptions& options) {
  jsonio::checkRules(options, "/optimizer");
  return options;
}

}  // namespace

Adam::Adam(const AdamOptions& options)
    : Optimizer(checked(options).learningRate, options.lossScaling), options_(options) {}

std::string_view Adam::name() const noexcept { return toString(options_.decoupledWeightDecay ? OptimizerType::AdamW : OptimizerType::Adam); }

AdamOptions Adam::options() const {
  AdamOptions current = options_;
  current.learningRate = learningRate();
  return current;
}

std::vector<std::pair<std::string_view, double>> Adam::hyperParameterValues(int64_t step) const {
  double c1 = 1.0;
  double c2 = 1.0;
  if (options_.biasCorrection) {
    const double t = static_cast<double>(step + 1);
    c1 = 1.0 / (1.0 - std::pow(options_.beta1, t));
    c2 = 1.0 / std::sqrt(1.0 - std::pow(options_.beta2, t));
  }
  return {{"learningRate", learningRate()}, {"biasCorrection1", c1}, {"biasCorrection2", c2}};
}

void Adam::addUpdate(Graph& graph, Tensor weight, Tensor gradient) {
  const auto constant = [&graph](double value) { return ops::scalar(graph, value); };
  Tensor g = gradient;
  if (options_.weightDecay > 0 && !options_.decoupledWeightDecay) {
    g = ops::add(g, ops::mul(weight, constant(options_.weightDecay)));
  }
  Tensor m = stateVariable(".adamM", options_.accl1Type);
  Tensor v = stateVariable(".adamV", options_.accl2Type);
  m = asFloat32(updateState(m, ops::add(ops::mul(asFloat32(m), constant(options_.beta1)),
                                        ops::mul(g, constant(1.0 - options_.beta1)))));
  v = asFloat32(updateState(v, ops::add(ops::mul(asFloat32(v), constant(options_.beta2)),
                                        ops::mul(ops::mul(g, g), constant(1.0 - options_.beta2)))));
  const Tensor denominator =
      ops::add(ops::mul(ops::sqrt(v), hyperParameter(graph, "biasCorrection2")), constant(options_.eps));
  Tensor step = ops::div(ops::mul(m, hyperParameter(graph, "biasCorrection1")), denominator);
  if (options_.weightDecay > 0 && options_.decoupledWeightDecay) {
    // Read before the in-place update below: PyTorch decays the old weight.
    step = ops::add(step, ops::mul(weight, constant(options_.weightDecay)));
  }
  applyUpdate(weight, ops::mul(step, hyperParameter(graph, "learningRate")));
}

}  // namespace tessera
