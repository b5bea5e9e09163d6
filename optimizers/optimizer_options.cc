// Field tables, ranges and rules of the optimizer options, and their JSON.
#include "optimizer_options_json.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "json_reader.hpp"
#include "tessera/error.hpp"
#include "tessera/json.hpp"

namespace tessera {

template <class V>
void visitFields(V& v, SgdOptions& value) {
  v.field("learningRate", value.learningRate, {.exclusiveMin = 0, .doc = "Step size. Must be > 0."});
  v.field("momentum", value.momentum,
          {.min = 0,
           .exclusiveMax = 1,
           .doc = "Momentum factor, in [0, 1); a momentum tensor per weight (optimizer state) when > 0."});
  v.field("dampening", value.dampening,
          {.min = 0, .max = 1, .doc = "Dampening of the gradient added to the momentum, in [0, 1]."});
  v.field("weightDecay", value.weightDecay,
          {.min = 0, .doc = "L2 penalty added to the gradient (weightDecay * w). Must be >= 0."});
  v.field("nesterov", value.nesterov, {.doc = "Nesterov momentum; needs momentum > 0 and dampening 0."});
  v.rule([&value](const jsonio::RuleSite& site) {
    if (!value.nesterov || (value.momentum > 0 && value.dampening == 0)) return;
    const std::string path = site.path("nesterov");
    throw ConfigError(
        ErrorCode::InvalidOptimizer, path,
        fmt::format("nesterov needs momentum > 0 and dampening 0, found momentum {} and dampening {}; "
                    "set a momentum (and no dampening) or turn nesterov off{}",
                    value.momentum, value.dampening, site.origin(path)));
  });
}

template <class V>
void visitFields(V& v, AdamOptions& value) {
  v.field("learningRate", value.learningRate, {.exclusiveMin = 0, .doc = "Step size. Must be > 0."});
  v.field(
      "beta1", value.beta1,
      {.min = 0, .exclusiveMax = 1, .doc = "Decay rate of the first moment (mean of gradients), in [0, 1)."});
  v.field("beta2", value.beta2,
          {.min = 0,
           .exclusiveMax = 1,
           .doc = "Decay rate of the second moment (mean of squared gradients), in [0, 1)."});
  v.field(
      "eps", value.eps,
      {.exclusiveMin = 0, .doc = "Added to the root of the second moment to avoid division by zero. > 0."});
  v.field("weightDecay", value.weightDecay,
          {.min = 0,
           .doc = "Weight decay: decoupled (w -= learningRate * weightDecay * w) for AdamW, else an L2 term "
                  "added to the gradient. Must be >= 0."});
  v.field("biasCorrection", value.biasCorrection,
          {.doc = "Divide the moments by (1 - beta^t) to correct their bias towards zero in early steps."});
  v.field(
      "decoupledWeightDecay", value.decoupledWeightDecay,
      {.doc = "Apply weight decay to the weights directly (AdamW) instead of adding it to the gradient."});
}

TESSERA_INSTANTIATE_VISIT_FIELDS(SgdOptions);
TESSERA_INSTANTIATE_VISIT_FIELDS(AdamOptions);

void to_json(nlohmann::json& j, OptimizerType value) { j = jsonio::enumToJson(value); }
void from_json(const nlohmann::json& j, OptimizerType& value) {
  value = jsonio::enumFromJson<OptimizerType>(j);
}

void to_json(nlohmann::json& j, const SgdOptions& value) { j = jsonio::writeValue(value); }
void from_json(const nlohmann::json& j, SgdOptions& value) {
  value = jsonio::readValue<SgdOptions>(j, {}, jsonio::SourceMap{});
}

void to_json(nlohmann::json& j, const AdamOptions& value) { j = jsonio::writeValue(value); }
void from_json(const nlohmann::json& j, AdamOptions& value) {
  value = jsonio::readValue<AdamOptions>(j, {}, jsonio::SourceMap{});
}

}  // namespace tessera
