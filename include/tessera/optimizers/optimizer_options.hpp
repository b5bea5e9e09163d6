// Optimizer hyper-parameters: plain, JSON-serializable aggregates, and the
// run config's optimizer section that chooses among them. The
// optimizers themselves (optimizers/) turn them into update ops whose
// learning rate can change between steps without recompiling.
#pragma once

#include <variant>

#include <nlohmann/json_fwd.hpp>

#include "tessera/lib/enum_names.hpp"
#include "tessera/lib/graph.hpp"

namespace tessera {

// Stochastic gradient descent, PyTorch semantics:
//   g' = g + weightDecay * w
//   v  = momentum * v + (1 - dampening) * g'    (v = g' on the first step)
//   d  = nesterov ? g' + momentum * v : v       (d = g' without momentum)
//   w -= learningRate * d
struct SgdOptions {
  double learningRate = 0.01;  // > 0
  double momentum = 0.0;       // in [0, 1); a momentum tensor per weight when > 0
  double dampening = 0.0;      // in [0, 1]
  double weightDecay = 0.0;    // >= 0
  bool nesterov = false;       // needs momentum > 0 and dampening 0
  // The loss gradient is seeded with it and every gradient divided by it
  // (in float32) before the update; the initial scale of automatic loss
  // scaling (tessera/lib/loss_scaling.hpp). > 0 and at most 2^127; 1 changes
  // nothing.
  double lossScaling = 1.0;
  // PopART's names: the dtype of the gradient accumulators of gradient
  // accumulation (float32 or float16), and of the momentum (float32 or
  // float16, updated in float32 either way).
  DType accumType = DType::Float32;
  DType accl1Type = DType::Float32;
  // A float16 weight gets a float32 copy "<weight>.master" (optimizer state)
  // that the update changes; the weight is the master rounded to float16.
  // false: float16 weights are updated directly (in float32 arithmetic,
  // rounded to float16 every step, so updates below half an ulp are lost).
  bool masterWeights = true;
  bool operator==(const SgdOptions&) const = default;
};

// Adam, and AdamW when decoupledWeightDecay is set:
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   mhat = m / (1 - beta1^t), vhat = v / (1 - beta2^t)  (with biasCorrection)
//   w -= learningRate * (mhat / (sqrt(vhat) + eps) + decoupled ? weightDecay w : 0)
// Without decoupling, weightDecay is added to the gradient (L2) instead.
struct AdamOptions {
  double learningRate = 0.001;  // > 0
  double beta1 = 0.9;           // in [0, 1)
  double beta2 = 0.999;         // in [0, 1)
  double eps = 1e-8;            // > 0
  double weightDecay = 0.0;     // >= 0
  bool biasCorrection = true;
  bool decoupledWeightDecay = false;  // true for AdamW
  // As SgdOptions::lossScaling.
  double lossScaling = 1.0;
  // PopART's names: the dtype of the gradient accumulators (as
  // SgdOptions::accumType), and of the first (m) and second (v) moments,
  // float32 or float16; their updates are computed in float32 either way.
  DType accumType = DType::Float32;
  DType accl1Type = DType::Float32;
  DType accl2Type = DType::Float32;
  // As SgdOptions::masterWeights.
  bool masterWeights = true;
  bool operator==(const AdamOptions&) const = default;
};

enum class OptimizerType { Sgd, Adam, AdamW };

template <>
struct EnumNames<OptimizerType> {
  static constexpr std::string_view kTypeName = "OptimizerType";
  static constexpr std::array kNames = {std::pair{OptimizerType::Sgd, std::string_view{"SGD"}},
                                        std::pair{OptimizerType::Adam, std::string_view{"Adam"}},
                                        std::pair{OptimizerType::AdamW, std::string_view{"AdamW"}}};
};

// The run config's optimizer section: the type and the options of each
// type (only those of `type` are used).
struct OptimizerConfig {
  OptimizerType type = OptimizerType::Sgd;
  SgdOptions sgd{};    // used when type is sgd
  AdamOptions adam{};  // used when type is adam or adamw
  // The learning rate of the options the type uses.
  double& learningRate() { return type == OptimizerType::Sgd ? sgd.learningRate : adam.learningRate; }
  double learningRate() const { return type == OptimizerType::Sgd ? sgd.learningRate : adam.learningRate; }
  bool operator==(const OptimizerConfig&) const = default;
};

// JSON (see tessera/lib/json.hpp for the conventions). OptimizerConfig is flat:
// {"type": "Adam", "learningRate": 0.001, ...} holds the options of its type
// only (the other type's options read as their defaults), and the type
// decides AdamOptions::decoupledWeightDecay.
void to_json(nlohmann::json& j, OptimizerType value);
void from_json(const nlohmann::json& j, OptimizerType& value);
void to_json(nlohmann::json& j, const SgdOptions& value);
void from_json(const nlohmann::json& j, SgdOptions& value);
void to_json(nlohmann::json& j, const AdamOptions& value);
void from_json(const nlohmann::json& j, AdamOptions& value);
void to_json(nlohmann::json& j, const OptimizerConfig& value);
void from_json(const nlohmann::json& j, OptimizerConfig& value);

}  // namespace tessera
