// The optimizer base: hyper-parameter scalars, operand checks, the factory.
#include "tessera/optimizer.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "tessera/adam.hpp"
#include "tessera/error.hpp"
#include "tessera/sgd.hpp"

namespace tessera {
namespace {

constexpr std::string_view kHyperParameterPrefix = "optimizer.";

void checkLearningRate(double learningRate) {
  if (!(learningRate > 0)) {
    throw ConfigError(ErrorCode::OutOfRange, "/optimizer/learningRate",
                      fmt::format("learning rate {} is not allowed; it must be > 0", learningRate));
  }
}

}  // namespace

Optimizer::Optimizer(double learningRate) : learningRate_(learningRate) { checkLearningRate(learningRate); }

void Optimizer::setLearningRate(double learningRate) {
  checkLearningRate(learningRate);
  learningRate_ = learningRate;
}

void Optimizer::addUpdates(Graph& graph, const std::vector<GradientPair>& pairs) {
  // Check every pair before adding anything, so that a bad pair leaves the
  // graph as it was.
  for (const GradientPair& pair : pairs) {
    const TensorNode& weight = graph.tensor(pair.weight);
    const TensorNode& gradient = graph.tensor(pair.gradient);
    if (graph.op(weight.producer).kind != OpKind::Variable || weight.dtype != DType::Float32) {
      throw GraphError(ErrorCode::InvalidOperand, weight.name,
                       fmt::format("{}: \"{}\" is a {} {} tensor; only float32 variables can be updated",
                                   name(), weight.name, weight.dtype, graph.op(weight.producer).kind));
    }
    if (gradient.shape != weight.shape || gradient.dtype != weight.dtype) {
      throw GraphError(ErrorCode::ShapeMismatch, weight.name,
                       fmt::format("{}: gradient \"{}\" is {} {} but weight \"{}\" is {} {}; they must match",
                                   name(), gradient.name, gradient.dtype, shapeStr(gradient.shape),
                                   weight.name, weight.dtype, shapeStr(weight.shape)));
    }
  }
  hyperTensors_.clear();
  for (const auto& [hyperName, value] : hyperParameterValues(0)) {
    // The step-0 value initialises the scalar, so a program run without host
    // writes still performs a correct first step.
    const Tensor t = ops::variable(graph, fmt::format("{}{}", kHyperParameterPrefix, hyperName),
                                   {static_cast<float>(value)}, {}, std::nullopt, RetrievalMode::OnePerGroup,
                                   TensorCategory::OptimizerState);
    hyperTensors_.emplace_back(std::string(hyperName), t.id());
  }
  for (const GradientPair& pair : pairs)
    addUpdate(graph, Tensor{&graph, pair.weight}, Tensor{&graph, pair.gradient});
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

Tensor zeroVariableLike(Tensor weight, std::string name, TensorCategory category) {
  const TensorNode& node = weight.node();
  Graph& graph = weight.graph();
  const int64_t groups = node.grouping ? node.grouping->numGroups() : 1;
  if (!node.metaShape.empty()) {
    InitialValues zeros = InitialValues::filled(groups * numElements(node.metaShape), 0.0F);
    const std::optional<ReplicaGrouping> domain = node.shardDomain;
    const Tensor state = ops::replicaShardedVariable(graph, std::move(name), std::move(zeros), node.metaShape,
                                                     node.grouping, node.shardCount, category)
                             .shard;
    graph.tensor(state.id()).shardDomain = domain;
    return state;
  }
  InitialValues zeros = InitialValues::filled(groups * numElements(node.shape), 0.0F);
  return ops::variable(graph, std::move(name), std::move(zeros), node.shape, node.grouping,
                       node.retrievalMode, category, node.dtype);
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
