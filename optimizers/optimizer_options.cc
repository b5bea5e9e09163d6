// Field tables, ranges and rules of the optimizer options and of the run
// config's optimizer section, and their JSON.
#include "optimizer_options_json.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "json_reader.hpp"
#include "tessera/lib/error.hpp"

namespace tessera {

// 2^127: a scale above it would not survive the float32 variable it lives in
// after one growth.
constexpr jsonio::FieldSpec kLossScalingSpec{
    .exclusiveMin = 0,
    .max = 0x1p127,
    .doc =
        "The loss gradient is seeded with it and every gradient divided by it (in float32) before the "
        "update; the initial scale of automatic loss scaling. In (0, 2^127]; 1 changes nothing."};

constexpr jsonio::FieldSpec kAccumTypeSpec{
    .doc = "The dtype of the gradient accumulators of gradient accumulation: float32 or float16."};

constexpr jsonio::FieldSpec kMasterWeightsSpec{
    .doc =
        "A float16 weight gets a float32 copy <weight>.master (optimizer state) that the update changes; "
        "the weight is the master rounded to float16. false: float16 weights are updated directly and "
        "updates below half a float16 ulp are lost."};

// Optimizer state is float32 or float16.
void checkStateType(const jsonio::RuleSite& site, std::string_view field, DType dtype) {
  if (dtype == DType::Float32 || dtype == DType::Float16) return;
  const std::string path = site.path(field);
  throw ConfigError(ErrorCode::InvalidOptimizer, path,
                    fmt::format("{} is \"{}\"; optimizer state is \"float32\" or \"float16\"{}", field, dtype,
                                site.origin(path)));
}

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
  v.field("lossScaling", value.lossScaling, kLossScalingSpec);
  v.field("accumType", value.accumType, kAccumTypeSpec);
  v.field("accl1Type", value.accl1Type,
          {.doc = "The dtype of the momentum: float32 or float16 (updated in float32 either way)."});
  v.field("masterWeights", value.masterWeights, kMasterWeightsSpec);
  v.rule([&value](const jsonio::RuleSite& site) { checkStateType(site, "accumType", value.accumType); });
  v.rule([&value](const jsonio::RuleSite& site) { checkStateType(site, "accl1Type", value.accl1Type); });
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
  v.field("lossScaling", value.lossScaling, kLossScalingSpec);
  v.field("accumType", value.accumType, kAccumTypeSpec);
  v.field("accl1Type", value.accl1Type,
          {.doc = "The dtype of the first moment m: float32 or float16 (updated in float32 either way)."});
  v.field("accl2Type", value.accl2Type,
          {.doc = "The dtype of the second moment v: float32 or float16 (updated in float32 either way)."});
  v.field("masterWeights", value.masterWeights, kMasterWeightsSpec);
  v.rule([&value](const jsonio::RuleSite& site) { checkStateType(site, "accumType", value.accumType); });
  v.rule([&value](const jsonio::RuleSite& site) { checkStateType(site, "accl1Type", value.accl1Type); });
  v.rule([&value](const jsonio::RuleSite& site) { checkStateType(site, "accl2Type", value.accl2Type); });
}

TESSERA_INSTANTIATE_VISIT_FIELDS(SgdOptions);
TESSERA_INSTANTIATE_VISIT_FIELDS(AdamOptions);

namespace {

constexpr jsonio::FieldSpec kOptimizerTypeSpec{
    .doc =
        "The optimizer: SGD, Adam, or AdamW (Adam with decoupled weight decay). The other keys of the "
        "section are the options of that type."};

// The keys of an options struct, from its field table.
template <class T>
std::vector<std::string> fieldKeys() {
  std::vector<std::string> keys = jsonio::leafPaths(T{}, {});
  for (std::string& key : keys) key.erase(0, 1);
  return keys;
}

bool contains(const std::vector<std::string>& keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

// The optimizer section is flat: "type" and the fields of that type's
// options. Every visitor but the reader and the schema sees it this way.
template <class V>
void visitSelected(V& v, OptimizerConfig& value) {
  v.field("type", value.type, kOptimizerTypeSpec);
  if (value.type == OptimizerType::Sgd) {
    visitFields(v, value.sgd);
    return;
  }
  v.skip("decoupledWeightDecay");
  visitFields(v, value.adam);
}

}  // namespace

void visitFields(jsonio::JsonReader& v, OptimizerConfig& value) {
  v.field("type", value.type, kOptimizerTypeSpec);
  v.setKeyContext(fmt::format("for optimizer type \"{}\"", value.type));
  const std::vector<std::string> sgdKeys = fieldKeys<SgdOptions>();
  const std::vector<std::string> adamKeys = fieldKeys<AdamOptions>();
  const bool sgd = value.type == OptimizerType::Sgd;
  for (const std::string& key : sgd ? adamKeys : sgdKeys) {
    if (contains(sgd ? sgdKeys : adamKeys, key)) continue;
    v.explainKey(key, sgd ? "it is an option of optimizer types \"Adam\" and \"AdamW\""
                          : "it is an option of optimizer type \"SGD\"");
  }
  // Registered last, so it wins over the explanation above.
  v.explainKey("decoupledWeightDecay",
               "the optimizer type decides it (\"AdamW\" decouples weight decay, \"Adam\" does not)");
  if (sgd) {
    visitFields(v, value.sgd);
    return;
  }
  v.skip("decoupledWeightDecay");
  visitFields(v, value.adam);
  value.adam.decoupledWeightDecay = value.type == OptimizerType::AdamW;
}

void visitFields(jsonio::JsonWriter& v, OptimizerConfig& value) { visitSelected(v, value); }

void visitFields(jsonio::LeafLister& v, OptimizerConfig& value) { visitSelected(v, value); }

void visitFields(jsonio::RuleChecker& v, OptimizerConfig& value) {
  visitSelected(v, value);
  v.rule([&value](const jsonio::RuleSite& site) {
    if (value.type == OptimizerType::Sgd ||
        value.adam.decoupledWeightDecay == (value.type == OptimizerType::AdamW)) {
      return;
    }
    throw ConfigError(
        ErrorCode::InvalidOptimizer, site.path("type"),
        fmt::format("type is \"{}\" but adam.decoupledWeightDecay is {}; the type decides it, so use "
                    "type \"{}\"",
                    value.type, value.adam.decoupledWeightDecay,
                    value.adam.decoupledWeightDecay ? OptimizerType::AdamW : OptimizerType::Adam));
  });
}

// One closed alternative per optimizer type ("oneOf"), so that a schema
// validator rejects the options of another type as this reader does.
void visitFields(jsonio::SchemaBuilder& v, OptimizerConfig&) {
  nlohmann::json& schema = v.schema();
  schema.erase("properties");
  schema.erase("additionalProperties");
  nlohmann::json alternatives = nlohmann::json::array();
  for (const auto& [type, name] : EnumNames<OptimizerType>::kNames) {
    OptimizerConfig defaults;
    nlohmann::json alternative;
    jsonio::SchemaBuilder builder(alternative);
    if (type == OptimizerType::Sgd) {
      visitFields(builder, defaults.sgd);
    } else {
      builder.skip("decoupledWeightDecay");
      visitFields(builder, defaults.adam);
    }
    alternative["title"] = name;
    alternative["properties"]["type"] = {{"const", name}, {"description", kOptimizerTypeSpec.doc}};
    // "type" may be left out only for the default type.
    if (type == OptimizerConfig{}.type) {
      alternative["properties"]["type"]["default"] = name;
    } else {
      alternative["required"] = {"type"};
    }
    alternatives.push_back(std::move(alternative));
  }
  schema["oneOf"] = std::move(alternatives);
}

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

void to_json(nlohmann::json& j, const OptimizerConfig& value) { j = jsonio::writeValue(value); }
void from_json(const nlohmann::json& j, OptimizerConfig& value) {
  value = jsonio::readValue<OptimizerConfig>(j, {}, jsonio::SourceMap{});
}

}  // namespace tessera
