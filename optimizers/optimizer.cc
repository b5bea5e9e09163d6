// The optimizer base: hyper-parameter scalars, operand checks, the factory.
#include "tessera/optimizers/optimizer.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "tessera/optimizers/adam.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/session_options.hpp"
#include "tessera/optimizers/sgd.hpp"

namespace tessera {
namespace {

constexpr std::string_view kHyperParameterPrefix = "optimizer.";

void checkLearningRate(double learningRate) {
  if (!(learningRate > 0)) {
    throw ConfigError(ErrorCode::OutOfRange, "/optimizer/learningRate",
                      fmt::format("learning rate {} is not allowed; it must be > 0", learningRate));
  }
}

// The scale must be a float32 scalar of the graph; automatic scaling adjusts
// it, so it must be its variable.
void checkScaling(const Graph& graph, const GradientScaling& scaling, std::string_view optimizer) {
  if (scaling.scale == kNoTensor) {
    if (!scaling.automatic.enabled) return;
    throw GraphError(ErrorCode::InvalidOperand, std::string(kLossScaleTensor),
                     fmt::format("{}: automatic loss scaling needs the loss scale variable \"{}\", but no "
                                 "scale was given",
                                 optimizer, kLossScaleTensor));
  }
  const TensorNode& scale = graph.tensor(scaling.scale);
  const bool variable = graph.op(scale.producer).kind == OpKind::Variable;
  if (scale.dtype != DType::Float32 || !scale.shape.empty() ||
      (scaling.automatic.enabled && (!variable || scale.name != kLossScaleTensor))) {
    throw GraphError(
        ErrorCode::InvalidOperand, scale.name,
        fmt::format("{}: the loss scale \"{}\" is a {} {} {} tensor; it must be a float32 scalar "
                    "(shape []), and the variable \"{}\" for automatic loss scaling",
                    optimizer, scale.name, scale.dtype, shapeStr(scale.shape), graph.op(scale.producer).kind,
                    kLossScaleTensor));
  }
}

}  // namespace

Optimizer::Optimizer(double learningRate, double lossScaling)
    : learningRate_(learningRate), lossScaling_(lossScaling) {
  checkLearningRate(learningRate);
}

void Optimizer::setLearningRate(double learningRate) {
  checkLearningRate(learningRate);
  learningRate_ = learningRate;
}

void Optimizer::addUpdates(Graph& graph, const std::vector<GradientPair>& pairs,
                           const GradientScaling& scaling) {
  // Check every pair before adding anything, so that a bad pair leaves the
  // graph as it was.
  for (const GradientPair& pair : pairs) {
    const TensorNode& weight = graph.tensor(pair.weight);
    const TensorNode& gradient = graph.tensor(pair.gradient);
    if (graph.op(weight.producer).kind != OpKind::Variable ||
        (weight.dtype != DType::Float32 && weight.dtype != DType::Float16)) {
      throw GraphError(ErrorCode::InvalidOperand, weight.name,
                       fmt::format("{}: \"{}\" is a {} {} tensor; only float32 and float16 variables can be "
                                   "updated",
                                   name(), weight.name, weight.dtype, graph.op(weight.producer).kind));
    }
    const bool dtypeFits = gradient.dtype == weight.dtype ||
                           (weight.dtype == DType::Float16 && gradient.dtype == DType::Float32);
    if (gradient.shape != weight.shape || !dtypeFits) {
      throw GraphError(ErrorCode::ShapeMismatch, weight.name,
                       fmt::format("{}: gradient \"{}\" is {} {} but weight \"{}\" is {} {}; they must match",
                                   name(), gradient.name, gradient.dtype, shapeStr(gradient.shape),
                                   weight.name, weight.dtype, shapeStr(weight.shape)));
    }
  }
  checkScaling(graph, scaling, name());
  hyperTensors_.clear();
  finite_ = kNoTensor;
  for (const auto& [hyperName, value] : hyperParameterValues(0)) {
    // The step-0 value initialises the scalar, so a program run without host
    // writes still performs a correct first step.
    const Tensor t = ops::variable(graph, fmt::format("{}{}", kHyperParameterPrefix, hyperName),
                                   {static_cast<float>(value)}, {}, std::nullopt, RetrievalMode::OnePerGroup,
                                   TensorCategory::OptimizerState);
    hyperTensors_.emplace_back(std::string(hyperName), t.id());
  }
  std::vector<Tensor> gradients;
  gradients.reserve(pairs.size());
  for (const GradientPair& pair : pairs) {
    Tensor gradient = asFloat32(Tensor{&graph, pair.gradient});
    if (scaling.scale != kNoTensor) {
      gradient = ops::div(gradient, Tensor{&graph, scaling.scale});
      graph.rename(gradient.id(), graph.uniqueName(graph.tensor(pair.gradient).name + ".unscaled"));
    }
    gradients.push_back(gradient);
  }
  Tensor finite;
  if (scaling.automatic.enabled) {
    finite = finiteFlag(graph, gradients);
    finite_ = finite.id();
  }
  for (std::size_t k = 0; k < pairs.size(); ++k)
    addWeightUpdate(graph, Tensor{&graph, pairs[k].weight}, gradients[k]);
  current_ = kNoTensor;
  directView_ = kNoTensor;
  // Created after every reader of the scale (the seed's consumers, the
  // divisions above), so the in-place update runs after them.
  if (scaling.automatic.enabled)
    addScaleUpdate(graph, Tensor{&graph, scaling.scale}, finite, scaling.automatic);
}

void Optimizer::addWeightUpdate(Graph& graph, Tensor weight, Tensor gradient) {
  current_ = weight.id();
  currentGraph_ = &graph;
  directView_ = kNoTensor;
  if (weight.dtype() == DType::Float32) {
    addUpdate(graph, weight, gradient);
    return;
  }
  if (!masterWeights()) {
    const Tensor view = asFloat32(weight);
    directView_ = view.id();
    addUpdate(graph, view, gradient);
    return;
  }
  const TensorNode& node = weight.node();
  const Tensor master = variableLike(weight, node.name + ".master", TensorCategory::OptimizerState,
                                     DType::Float32, node.initial);
  addUpdate(graph, master, gradient);
  // Created after the master's update, so it reads the updated value.
  updateState(weight, master);
}

Tensor Optimizer::stateVariable(std::string_view suffix, DType dtype) const {
  if (current_ == kNoTensor) {
    throw InternalError(
        ErrorCode::Internal, std::string(suffix),
        fmt::format("{}: optimizer state is made only while a weight's update is added", name()));
  }
  const Tensor weight{currentGraph_, current_};
  return zeroVariableLike(weight, weight.name() + std::string(suffix), TensorCategory::OptimizerState, dtype);
}

Tensor Optimizer::asFloat32(Tensor t) {
  return t.dtype() == DType::Float32 ? t : ops::cast(t, DType::Float32);
}

Tensor Optimizer::finiteFlag(Graph& graph, const std::vector<Tensor>& gradients) const {
  // x * 0 is 0 for a finite x and NaN for an infinite or NaN one, so the sum
  // of the products is 0 exactly when every element is finite (summing x
  // itself could overflow from finite values).
  const Tensor zero = ops::scalar(graph, 0.0);
  Tensor total = zero;
  for (const Tensor& gradient : gradients) total = ops::add(total, ops::reduceSum(ops::mul(gradient, zero)));
  // Sharded gradients differ between replicas, and every replica (and
  // instance) must take the same decision.
  if (graph.replicationFactor() > 1) total = ops::replicatedAllReduce(total, ReductionType::Sum);
  const Tensor finite = ops::equal(total, zero);
  graph.rename(finite.id(), graph.uniqueName("lossScaling.finite"));
  return finite;
}

void Optimizer::addScaleUpdate(Graph& graph, Tensor scale, Tensor finite,
                               const AutomaticLossScalingSettings& settings) {
  const auto counter = [&graph](std::string_view counterName) {
    return ops::variable(graph, std::string(counterName), {0.0F}, {}, std::nullopt,
                         RetrievalMode::OnePerGroup, TensorCategory::OptimizerState);
  };
  const Tensor clean = counter(kLossScaleCleanStepsTensor);
  const Tensor skipped = counter(kLossScaleSkippedStepsTensor);
  const Tensor zero = ops::scalar(graph, 0.0);
  const Tensor one = ops::scalar(graph, 1.0);
  const Tensor counted = ops::where(finite, ops::add(clean, one), zero);
  const Tensor grow =
      ops::logicalNot(ops::less(counted, ops::scalar(graph, static_cast<double>(settings.updatePeriod))));
  const Tensor grown = ops::clip(ops::mul(scale, ops::scalar(graph, settings.growthFactor)),
                                 settings.minLossScale, settings.maxLossScale);
  const Tensor shrunk = ops::clip(ops::mul(scale, ops::scalar(graph, settings.backoffFactor)),
                                  settings.minLossScale, settings.maxLossScale);
  const Tensor nextScale = ops::where(finite, ops::where(grow, grown, scale), shrunk);
  const Tensor nextClean = ops::where(grow, zero, counted);
  const Tensor nextSkipped = ops::add(skipped, ops::sub(one, finite));
  ops::copyInplace(scale, nextScale);
  ops::copyInplace(clean, nextClean);
  ops::copyInplace(skipped, nextSkipped);
}

Tensor Optimizer::updateState(Tensor state, Tensor next) const {
  if (next.dtype() != state.dtype()) next = ops::cast(next, state.dtype());
  if (finite_ == kNoTensor) return ops::copyInplace(state, next);
  return ops::copyInplace(state, ops::where(Tensor{&state.graph(), finite_}, next, state));
}

Tensor Optimizer::applyUpdate(Tensor weight, Tensor delta) const {
  Graph& graph = weight.graph();
  if (finite_ != kNoTensor) delta = ops::where(Tensor{&graph, finite_}, delta, ops::scalar(graph, 0.0));
  // A float16 weight without a master weight: w = float16(float32(w) - delta).
  if (weight.id() == directView_) {
    return ops::copyInplace(Tensor{&graph, current_}, ops::cast(ops::sub(weight, delta), DType::Float16));
  }
  return ops::scaledAddInplace(weight, delta, 1.0, -1.0);
}

void checkLossScaling(double lossScaling, const AutomaticLossScalingSettings& automatic) {
  if (!automatic.enabled) return;
  if (lossScaling >= automatic.minLossScale && lossScaling <= automatic.maxLossScale) return;
  throw ConfigError(
      ErrorCode::InvalidLossScaling, "/optimizer/lossScaling",
      fmt::format("lossScaling {} is the initial scale of automatic loss scaling, which keeps the scale in "
                  "[minLossScale, maxLossScale] = [{}, {}]; set a lossScaling in that range or widen "
                  "{}/automaticLossScalingSettings",
                  lossScaling, automatic.minLossScale, automatic.maxLossScale, kSessionOptionsPath));
}

std::vector<HyperParameter> Optimizer::hyperParameters(int64_t step) const {
  std::vector<HyperParameter> result;
  if (hyperTensors_.empty()) return result;
  for (const auto& entry : hyperParameterValues(step)) {
    const auto it = std::find_if(hyperTensors_.begin(), hyperTensors_.end(),
                                 [&](const auto& created) { return created.first == entry.first; });
    result.push_back({it->second, entry.second});
  }
  return result;
}

void Optimizer::rebindHyperParameters(const Graph& graph) {
  for (auto& [hyperName, tensor] : hyperTensors_)
    tensor = graph.find(fmt::format("{}{}", kHyperParameterPrefix, hyperName));
}

Tensor Optimizer::hyperParameter(Graph& graph, std::string_view hyperName) const {
  const auto it = std::find_if(hyperTensors_.begin(), hyperTensors_.end(),
                               [&](const auto& entry) { return entry.first == hyperName; });
  if (it == hyperTensors_.end()) {
    throw InternalError(ErrorCode::Internal, std::string(hyperName),
                        fmt::format("{}: hyper-parameter \"{}\" was not created", name(), hyperName));
  }
  return {&graph, it->second};
}

Tensor zeroVariableLike(Tensor weight, std::string name, TensorCategory category,
                        std::optional<DType> dtype) {
  const TensorNode& node = weight.node();
  const int64_t groups = node.grouping ? node.grouping->numGroups() : 1;
  const int64_t elements = groups * numElements(node.metaShape.empty() ? node.shape : node.metaShape);
  return variableLike(weight, std::move(name), category, dtype.value_or(node.dtype),
                      InitialValues::filled(elements, 0.0F));
}

Tensor variableLike(Tensor weight, std::string name, TensorCategory category, DType dtype,
                    InitialValues values) {
  const TensorNode& node = weight.node();
  Graph& graph = weight.graph();
  if (!node.metaShape.empty()) {
    const std::optional<ReplicaGrouping> domain = node.shardDomain;
    const Tensor state = ops::replicaShardedVariable(graph, std::move(name), std::move(values),
                                                     node.metaShape, node.grouping, node.shardCount, category)
                             .shard;
    graph.tensor(state.id()).shardDomain = domain;
    graph.tensor(state.id()).dtype = dtype;
    return state;
  }
  return ops::variable(graph, std::move(name), std::move(values), node.shape, node.grouping,
                       node.retrievalMode, category, dtype);
}

std::unique_ptr<Optimizer> makeOptimizer(const OptimizerConfig& config) {
  switch (config.type) {
    case OptimizerType::Sgd: return std::make_unique<Sgd>(config.sgd);
    case OptimizerType::Adam:
    case OptimizerType::AdamW: {
      AdamOptions options = config.adam;
      options.decoupledWeightDecay = config.type == OptimizerType::AdamW;
      return std::make_unique<Adam>(options);
    }
  }
  throw ConfigError(
      ErrorCode::InvalidEnumValue, "/optimizer/type",
      fmt::format("optimizer type {} is not one of sgd, adam, adamw", static_cast<int>(config.type)));
}

}  // namespace tessera
