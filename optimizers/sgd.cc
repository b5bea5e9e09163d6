// SGD update ops, PyTorch semantics (see include/tessera/optimizers/sgd.hpp).
#include "tessera/optimizers/sgd.hpp"

#include "json_reader.hpp"
#include "optimizer_options_json.hpp"

namespace tessera {
namespace {

const SgdOptions& checked(const SgdOptions& options) {
  jsonio::checkRules(options, "/optimizer");
  return options;
}

}  // namespace

Sgd::Sgd(const SgdOptions& options)
    : Optimizer(checked(options).learningRate, options.lossScaling), options_(options) {}

SgdOptions Sgd::options() const {
  SgdOptions current = options_;
  current.learningRate = learningRate();
  return current;
}

std::vector<std::pair<std::string_view, double>> Sgd::hyperParameterValues(int64_t step) const {
  std::vector<std::pair<std::string_view, double>> values{{"learningRate", learningRate()}};
  if (options_.momentum > 0) {
    // PyTorch starts the momentum buffer with the gradient itself.
    const bool first = step == 0;
    values.emplace_back("momentumFactor", first ? 0.0 : options_.momentum);
    values.emplace_back("dampeningFactor", first ? 1.0 : 1.0 - options_.dampening);
  }
  return values;
}

void Sgd::addUpdate(Graph& graph, Tensor weight, Tensor gradient) {
  Tensor direction = gradient;
  if (options_.weightDecay > 0) {
    direction = ops::add(direction, ops::mul(weight, ops::scalar(graph, options_.weightDecay)));
  }
  if (options_.momentum > 0) {
    Tensor velocity = stateVariable(".momentum", options_.accl1Type);
    // Without dampening the factor of the gradient is 1 at every step.
    const Tensor damped =
        options_.dampening == 0 ? direction : ops::mul(direction, hyperParameter(graph, "dampeningFactor"));
    const Tensor next =
        ops::add(ops::mul(asFloat32(velocity), hyperParameter(graph, "momentumFactor")), damped);
    velocity = asFloat32(updateState(velocity, next));
    direction = options_.nesterov
                    ? ops::add(direction, ops::mul(velocity, ops::scalar(graph, options_.momentum)))
                    : velocity;
  }
  applyUpdate(weight, ops::mul(direction, hyperParameter(graph, "learningRate")));
}

}  // namespace tessera
