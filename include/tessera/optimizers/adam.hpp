// Adam, and AdamW (decoupled weight decay), see AdamOptions.
//
// Hyper-parameter scalars: "optimizer.learningRate" and the bias corrections
// "optimizer.biasCorrection1" = 1 / (1 - beta1^t) and
// "optimizer.biasCorrection2" = 1 / sqrt(1 - beta2^t) for step t (1-based),
// both 1 without biasCorrection. The update
//   w -= learningRate * (c1 m / (c2 sqrt(v) + eps) + (decoupled ? weightDecay w : 0))
// is then exactly bias-corrected Adam: c1 m / (c2 sqrt(v) + eps) =
// mhat / (sqrt(vhat) + eps).
#pragma once

#include <memory>

#include <string_view>

#include "tessera/optimizers/optimizer.hpp"
#include "tessera/optimizers/optimizer_options.hpp"

namespace tessera {

class Adam final : public Optimizer {
 public:
  // Throws ConfigError for options out of range (paths under /optimizer).
  explicit Adam(const AdamOptions& options);

  // "AdamW" when weight decay is decoupled, else "Adam".
  std::string_view name() const noexcept override;
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<Adam>(options()); }
  // The options with the current learning rate.
  AdamOptions options() const;

 protected:
  std::vector<std::pair<std::string_view, double>> hyperParameterValues(int64_t step) const override;
  void addUpdate(Graph& graph, Tensor weight, Tensor gradient) override;
  bool masterWeights() const noexcept override { return options_.masterWeights; }

 public:
  DType accumType() const noexcept override { return options_.accumType; }

 private:
  AdamOptions options_;
};

}  // namespace tessera
