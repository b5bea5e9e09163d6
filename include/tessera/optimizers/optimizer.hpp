// Optimizers: the ops that update trainable weights from their gradients.
//
// An optimizer appends its update to a graph with the same public ops a user
// can write by hand (mul, add, sqrt, div, copyInplace, scaledAddInplace), so
// every update is elementwise and runs unchanged on the shards of a
// replica-sharded weight. Per-weight state (momentum, Adam moments) lives in
// variables of category OptimizerState, grouped and sharded like the weight.
//
// Values that change between steps (the learning rate, the first-step
// momentum factors of SGD, Adam's bias corrections) are float32 scalar
// variables named "optimizer.<name>" that the host writes before each step
// from hyperParameters(step): the learning rate can change without
// recompiling. Values fixed for the session (betas, eps, weight decay) are
// constants.
//
// Loss scaling (tessera/lib/loss_scaling.hpp): given the scale the loss gradient
// was seeded with, the base divides every gradient by it before the derived
// update sees it. With automatic loss scaling it also computes whether every
// gradient is finite, agreed over all replicas (and instances) by an
// all-reduce, and every state update of the derived classes goes through
// updateState()/applyUpdate(), which keep the old value exactly when the
// step is skipped; then it updates the scale. The host counts only applied
// steps in hyperParameters(step).
//
//   auto optimizer = makeOptimizer(config.optimizer);
//   optimizer->addUpdates(graph, {{w.id(), gradient.id()}});
//   for (int64_t step = 0; ...; ++step) {
//     for (auto [tensor, value] : optimizer->hyperParameters(step)) writeScalar(tensor, value);
//     run();
//   }
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/lib/graph.hpp"
#include "tessera/lib/loss_scaling.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/optimizers/optimizer_options.hpp"

namespace tessera {

// A trainable weight and the gradient its update consumes.
struct GradientPair {
  TensorId weight = kNoTensor;
  TensorId gradient = kNoTensor;
  bool operator==(const GradientPair&) const = default;
};

// A hyper-parameter scalar and the value the host writes into it.
struct HyperParameter {
  TensorId tensor = kNoTensor;
  double value = 0.0;
  bool operator==(const HyperParameter&) const = default;
};

// How the gradients given to addUpdates() are scaled.
struct GradientScaling {
  // The float32 scalar (shape []) the loss gradient was seeded with;
  // kNoTensor: 1, the gradients are used as they are.
  TensorId scale = kNoTensor;
  // With enabled set, `scale` must be the variable kLossScaleTensor, which
  // the update then adjusts (and steps with an overflow are skipped).
  AutomaticLossScalingSettings automatic{};
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // "SGD", "Adam" or "AdamW" (the run config's optimizer type).
  virtual std::string_view name() const noexcept = 0;

  // A new optimizer with the same options and current learning rate, not
  // yet bound to a graph (sessions plan alternative programs with it).
  virtual std::unique_ptr<Optimizer> clone() const = 0;

  // Appends the update of every pair to `graph`: the hyper-parameter scalars
  // "optimizer.<name>" (once), the state of each weight ("<weight>.momentum",
  // "<weight>.adamM", ...), then the in-place update of each weight. Call it
  // once per graph; a later call targets a new graph and forgets the old
  // one's scalars. A float16 weight is updated through its float32 master
  // weight "<weight>.master" (optimizer state, initialised with the weight's
  // initial values; see SgdOptions::masterWeights), from its gradient cast to
  // float32. Throws GraphError: InvalidOperand when a weight is not a
  // float32 or float16 variable, ShapeMismatch when a gradient's shape differs from its
  // weight's (subject: the weight), DuplicateTensorName when a state name is
  // taken, InvalidOperand when `scaling` names no float32 scalar (or, for
  // automatic scaling, not the variable kLossScaleTensor).
  void addUpdates(Graph& graph, const std::vector<GradientPair>& pairs, const GradientScaling& scaling = {});

  // Every hyper-parameter scalar of the last addUpdates() graph with its
  // value for `step` (0 = the first step); the host writes them before the
  // step. Empty before addUpdates().
  std::vector<HyperParameter> hyperParameters(int64_t step) const;
  // Finds the hyper-parameter scalars again, by name, in `graph`: a
  // transform that rebuilt the graph after addUpdates() gave them new ids.
  // Throws GraphError(UnknownTensor) when one is missing.
  void rebindHyperParameters(const Graph& graph);

  double learningRate() const noexcept { return learningRate_; }
  // Used from the next hyperParameters() call on. Throws
  // ConfigError(OutOfRange) at /optimizer/learningRate unless it is > 0.
  void setLearningRate(double learningRate);

  // The options' lossScaling: the static loss scale, or the initial one of
  // automatic loss scaling.
  double lossScaling() const noexcept { return lossScaling_; }
  // The options' accumType: the dtype of the gradient accumulators.
  virtual DType accumType() const noexcept { return DType::Float32; }

 protected:
  // `learningRate` must be > 0 (ConfigError(OutOfRange)); `lossScaling` is
  // checked by the derived class's options.
  explicit Optimizer(double learningRate, double lossScaling = 1.0);

  // Name (without the "optimizer." prefix) and value at `step` of every
  // hyper-parameter scalar the update reads: the same names, in the same
  // order, at every step.
  virtual std::vector<std::pair<std::string_view, double>> hyperParameterValues(int64_t step) const = 0;
  // Appends the update of one weight; hyperParameter() gives the scalars.
  virtual void addUpdate(Graph& graph, Tensor weight, Tensor gradient) = 0;
  // The scalar "optimizer.<name>" of the graph being updated.
  Tensor hyperParameter(Graph& graph, std::string_view name) const;

  // The in-place updates of addUpdate(): state = next, and weight -= delta.
  // When automatic loss scaling skips the step, both keep the old value
  // exactly. `next` and `delta` are float32; a float16 state gets `next`
  // rounded. Return the updated tensor.
  Tensor updateState(Tensor state, Tensor next) const;
  Tensor applyUpdate(Tensor weight, Tensor delta) const;
  // A zero-initialised optimizer state variable "<weight><suffix>" of
  // `dtype`, like the weight of the current addUpdate() call.
  Tensor stateVariable(std::string_view suffix, DType dtype) const;
  // `t` as float32 (a float16 state is read through a cast).
  static Tensor asFloat32(Tensor t);
  // Whether float16 weights get float32 master weights.
  virtual bool masterWeights() const noexcept { return true; }

 private:
  // Whether every gradient is finite (1) or not (0), the same on every
  // replica: a float32 scalar.
  Tensor finiteFlag(Graph& graph, const std::vector<Tensor>& gradients) const;
  // The scale's update after the step (automatic loss scaling).
  void addScaleUpdate(Graph& graph, Tensor scale, Tensor finite,
                      const AutomaticLossScalingSettings& settings);

  // The update of one weight: a float32 weight directly, a float16 one
  // through its master weight or a float32 view of it.
  void addWeightUpdate(Graph& graph, Tensor weight, Tensor gradient);

  double learningRate_;
  double lossScaling_;
  // The variable whose update addUpdate() is adding, and for a float16
  // weight updated without a master weight, the float32 view given to
  // addUpdate() in its place.
  TensorId current_ = kNoTensor;
  Graph* currentGraph_ = nullptr;
  TensorId directView_ = kNoTensor;
  std::vector<std::pair<std::string, TensorId>> hyperTensors_;
  // The finite flag of the graph being updated; kNoTensor without
  // automatic loss scaling.
  TensorId finite_ = kNoTensor;
};

// Checks that the initial loss scale `lossScaling` lies within the bounds of
// automatic loss scaling when it is enabled: ConfigError(InvalidLossScaling)
// at /optimizer/lossScaling otherwise.
void checkLossScaling(double lossScaling, const AutomaticLossScalingSettings& automatic);

// A zero-initialised variable `name` of `category` with the shape, grouping
// and sharding of the variable `weight`: optimizer state, gradient
// accumulators; of the weight's dtype unless `dtype` is given. Throws
// GraphError(DuplicateTensorName) when `name` is taken.
Tensor zeroVariableLike(Tensor weight, std::string name, TensorCategory category,
                        std::optional<DType> dtype = std::nullopt);
// As zeroVariableLike, initialised with `values` (one-per-group host order,
// as the weight's own initial values).
Tensor variableLike(Tensor weight, std::string name, TensorCategory category, DType dtype,
                    InitialValues values);

// The optimizer `config` describes: Sgd for sgd, Adam for adam (L2 weight
// decay) and adamw (decoupled weight decay; the type decides, not
// config.adam.decoupledWeightDecay). Throws ConfigError for options out of
// range (the same checks and JSON paths as the run config's reader).
std::unique_ptr<Optimizer> makeOptimizer(const OptimizerConfig& config);

}  // namespace tessera
