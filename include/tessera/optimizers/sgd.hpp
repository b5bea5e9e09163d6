// Stochastic gradient descent with PyTorch's semantics (see SgdOptions),
// including the first step: the momentum buffer starts as the gradient.
//
// Hyper-parameter scalars: "optimizer.learningRate" and, with momentum,
// "optimizer.momentumFactor" / "optimizer.dampeningFactor", written by the
// host as 0 / 1 on the first step and momentum / (1 - dampening) afterwards,
// so that one program computes both v = g' and v = m v + (1 - d) g'.
#pragma once

#include <memory>

#include <string_view>

#include "tessera/optimizers/optimizer.hpp"
#include "tessera/optimizers/optimizer_options.hpp"

namespace tessera {

class Sgd final : public Optimizer {
 public:
  // Throws ConfigError for options out of range (paths under /optimizer).
  explicit Sgd(const SgdOptions& options);

  std::string_view name() const noexcept override { return toString(OptimizerType::Sgd); }
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<Sgd>(options()); }
  // The options with the current learning rate.
  SgdOptions options() const;

 protected:
  std::vector<std::pair<std::string_view, double>> hyperParameterValues(int64_t step) const override;
  void addUpdate(Graph& graph, Tensor weight, Tensor gradient) override;
  bool masterWeights() const noexcept override { return options_.masterWeights; }

 public:
  DType accumType() const noexcept override { return options_.accumType; }

 private:
  SgdOptions options_;
};

}  // namespace tessera
