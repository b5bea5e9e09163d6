// Sessions: compile a graph once for a SessionOptions and a device, then run
// steps and move tensors between host and device.
//
//   tessera::Graph g(options.getGlobalReplicationFactor());
//   ... build the model with tessera::ops, ending in a scalar loss ...
//   tessera::TrainingSession session(std::move(g), loss.id(), tessera::makeOptimizer(config),
//                                    options, tessera::makeSimDevice(spec));
//   session.run({{"x", images}, {"labels", labels}});
//
// Host input streams have shape [accumulationFactor, localReplicas, ...shape]
// where shape is the input's per-replica, per-micro-batch shape and a leading
// dimension of size 1 is omitted (so [R, B, 28, 28], or [B, 28, 28] when R = 1
// and there is no accumulation). Outputs come back the same way: one value
// per micro-batch and local replica.
//
// With a DataFlow (tessera/sessions/data_flow.hpp) of batchesPerStep > 1, one run()
// consumes that many batches: inputs take [batchesPerStep, ...] in front of
// the shape above, every batch gets its own weight update exactly as that
// many one-batch run() calls would, and each anchor comes back in the shape
// its return type gives.
//
// Variables are read and written in their host shape: [numGroups, ...shape]
// for a grouped variable (the group dimension omitted for one group), or
// [replicas, ...shape] when read with RetrievalMode::AllReplicas; sharded
// variables are reassembled through their ShardLayout, so the host always
// sees the full tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/sessions/data_flow.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/lib/session_options.hpp"

namespace tessera {

// A host tensor: a shape and its values (int32 tensors hold exact integer
// values as floats). A float64 tensor (an output of a float64 graph) holds
// its values in `doubles` and leaves `data` empty.
struct HostTensor {
  Shape shape;
  std::vector<float> data;
  std::vector<double> doubles{};
  bool operator==(const HostTensor&) const = default;
};

// One host input of a step: the stream's name and its data in host shape.
// Int32 streams (labels) may be given as int32 or as exact floats; float64
// streams as doubles, or as floats (exact in double).
struct StepInput {
  std::string_view name;
  std::span<const float> floats{};
  std::span<const int32_t> ints{};
  std::span<const double> doubles{};
  StepInput(std::string_view n, std::span<const float> values) : name(n), floats(values) {}
  StepInput(std::string_view n, std::span<const int32_t> values) : name(n), ints(values) {}
  StepInput(std::string_view n, std::span<const double> values) : name(n), doubles(values) {}
};

class TrainingSession {
 public:
  // Validates `options` against the device, checks that the graph's
  // replication factor is the options' global one, then runs the training
  // pipeline (autodiff, gradient accumulation, replication, optimizer
  // update), loads the program on `device` and writes every variable's
  // initial value. `outputs` names extra tensors returned by run() besides
  // the loss. Throws ConfigError, GraphError, AutodiffError, DeviceError.
  TrainingSession(Graph graph, TensorId loss, std::unique_ptr<Optimizer> optimizer, SessionOptions options,
                  std::unique_ptr<Device> device, std::vector<std::string> outputs = {});
  // PopART's form: the data flow's anchors other than the loss are the extra
  // outputs, and one run() consumes dataFlow.batchesPerStep batches.
  // Throws ConfigError(InvalidBatchesPerStep, InvalidAnchorReturnType,
  // InvalidAnchor) for a bad data flow (see validate(DataFlow)).
  TrainingSession(Graph graph, TensorId loss, std::unique_ptr<Optimizer> optimizer, SessionOptions options,
                  std::unique_ptr<Device> device, DataFlow dataFlow);
  ~TrainingSession();
  TrainingSession(TrainingSession&&) noexcept;
  TrainingSession& operator=(TrainingSession&&) noexcept;

  // The host shape an input stream expects, and how it was derived.
  Shape inputHostShape(std::string_view name) const;

  // One training step: for each of batchesPerStep batches, every local
  // replica runs accumulationFactor micro-batches, then the weights are
  // updated. Every input stream must be given once, in its host shape
  // (GraphError(HostShapeMismatch) naming the stream, the expected shape and
  // its derivation).
  void run(std::span<const StepInput> inputs);
  void run(std::initializer_list<StepInput> inputs) {
    run(std::span<const StepInput>(inputs.begin(), inputs.size()));
  }

  // Host work for the device's host threads to do while they wait between
  // the parallel parts of a step, such as gathering the next step's batch:
  // `work` is called in short pieces, each returning whether it did
  // anything, from the device's worker threads only (never on one thread,
  // or on a device without spare threads), so whatever it must finish the
  // caller finishes itself. It must not throw (an exception ends the
  // process). An empty function removes it, once no piece is running; keep
  // what it refers to alive until then.
  void setIdleWork(std::function<bool()> work);

  // The loss of the last step per micro-batch and local replica, host shape
  // [accumulationFactor, localReplicas] with size-1 dimensions omitted, or
  // with batchesPerStep > 1 or another return type the loss anchor's shape
  // (tessera/sessions/data_flow.hpp).
  const HostTensor& loss() const;
  // The mean loss of the last batch of the last step (the mean over the
  // global batch when every replica's micro-batch has the same size).
  double meanLoss() const;
  // The mean loss of each batch of the last step, in order, whatever the
  // loss anchor's return type.
  const std::vector<double>& batchMeanLosses() const;
  // Whether each batch of the last step skipped its update (automatic loss
  // scaling), in order.
  const std::vector<bool>& batchesSkipped() const;
  // An extra output named at construction, after the last step, with host
  // shape [accumulationFactor, localReplicas, ...shape] (size-1 omitted), or
  // the anchor's shape for its return type.
  const HostTensor& output(std::string_view name) const;
  const DataFlow& dataFlow() const;

  double learningRate() const;
  // Takes effect from the next step; nothing is recompiled.
  void setLearningRate(double learningRate);
  // Weight updates (batches) run so far: batchesPerStep per run().
  int64_t step() const;
  // Sets the step count, e.g. when resuming from a checkpoint: the optimizer's
  // step-dependent values (SGD's first-step momentum, Adam's bias correction)
  // follow it, less the skipped steps. Throws ConfigError(OutOfRange) for a
  // negative step.
  void setStep(int64_t step);

  // Loss scaling (tessera/lib/loss_scaling.hpp). The current loss scale: the
  // optimizer's lossScaling, or with automatic loss scaling the scale the
  // next step uses.
  double lossScale() const;
  // Steps skipped because a gradient overflowed (automatic loss scaling
  // only), read from the variable kLossScaleSkippedStepsTensor: a
  // checkpoint restores it. The optimizer's step-dependent values count
  // step() - skippedSteps() applied steps.
  int64_t skippedSteps() const;
  // Whether the last batch of the last run() skipped its update.
  bool lastStepSkipped() const;

  // Variables by name (weights, optimizer state, accumulators).
  HostTensor readVariable(std::string_view name, std::optional<RetrievalMode> mode = std::nullopt) const;
  void writeVariable(std::string_view name, const HostTensor& value);
  // Every variable of category Weight, by name.
  std::vector<std::pair<std::string, HostTensor>> readWeights() const;
  void writeWeights(const std::vector<std::pair<std::string, HostTensor>>& weights);

  // The transformed per-replica graph the device runs.
  const Graph& graph() const;
  const SessionOptions& options() const;
  const MemoryReport& memory() const;
  // The modelled time of one step of the compiled program (time_model.hpp).
  const TimeReport& modelledTime() const;
  Optimizer& optimizer();
  const Optimizer& optimizer() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class InferenceSession {
 public:
  // Compiles `graph` as it is (no autodiff, no updates); `outputs` are the
  // tensors run() returns. Gradient accumulation is rejected
  // (ConfigError(UnsupportedCombination)): it only exists for training.
  InferenceSession(Graph graph, std::vector<std::string> outputs, SessionOptions options,
                   std::unique_ptr<Device> device);
  // PopART's form: the data flow's anchors are the outputs; one run()
  // consumes dataFlow.batchesPerStep batches.
  InferenceSession(Graph graph, DataFlow dataFlow, SessionOptions options, std::unique_ptr<Device> device);
  ~InferenceSession();
  InferenceSession(InferenceSession&&) noexcept;
  InferenceSession& operator=(InferenceSession&&) noexcept;

  Shape inputHostShape(std::string_view name) const;
  void run(std::span<const StepInput> inputs);
  void run(std::initializer_list<StepInput> inputs) {
    run(std::span<const StepInput>(inputs.begin(), inputs.size()));
  }
  // Host shape [localReplicas, ...shape] (size-1 omitted), or the anchor's
  // shape for its return type.
  const HostTensor& output(std::string_view name) const;
  const DataFlow& dataFlow() const;

  HostTensor readVariable(std::string_view name, std::optional<RetrievalMode> mode = std::nullopt) const;
  void writeVariable(std::string_view name, const HostTensor& value);
  std::vector<std::pair<std::string, HostTensor>> readWeights() const;
  void writeWeights(const std::vector<std::pair<std::string, HostTensor>>& weights);

  const Graph& graph() const;
  const MemoryReport& memory() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
