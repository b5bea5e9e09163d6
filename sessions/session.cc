#include "tessera/session.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

#include <fmt/format.h>

#include "memory_planner.hpp"
#include "session_runtime.hpp"
#include "tessera/error.hpp"
#include "tessera/loss_scaling.hpp"
#include "tessera/placement.hpp"
#include "tessera/transform.hpp"
#include "time_model.hpp"
#include "training_pipeline.hpp"

namespace tessera {
namespace {

void checkOptions(const Graph& graph, const SessionOptions& options, const Device& device) {
  validate(options, device.spec());
  if (graph.replicationFactor() != options.getGlobalReplicationFactor()) {
    throw GraphError(
        ErrorCode::ReplicationFactorMismatch, "Graph",
        fmt::format("the graph was built for {} replica(s) but the session options give a global "
                    "replication factor of {}; build the graph with Graph({})",
                    graph.replicationFactor(), options.getGlobalReplicationFactor(),
                    options.getGlobalReplicationFactor()));
  }
}

std::vector<TensorId> findOutputs(const Graph& graph, const std::vector<std::string>& names) {
  std::vector<TensorId> ids;
  for (const std::string& name : names) {
    const auto id = graph.tryFind(name);
    if (!id) {
      throw GraphError(ErrorCode::UnknownStream, name, "no tensor of that name to return from the session");
    }
    ids.push_back(*id);
  }
  return ids;
}

std::string bytesText(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / (1 << 10));
  return fmt::format("{} B", bytes);
}

// The device's out-of-memory error with the settings that would lower the
// short space's peak, each planned on its own.
DeviceError outOfMemoryWithSuggestions(const DeviceError& error, const Graph& graph, TensorId loss,
                                       const Optimizer& optimizer, const SessionOptions& options,
                                       const DeviceSpec& spec) {
  const RunPlan plan = planTraining(graph, loss, optimizer, options, spec);
  const std::optional<MemoryShortfall> shortfall = findShortfall(plan.memory);
  if (!shortfall) return error;
  const std::vector<MemorySuggestion> suggestions =
      suggestMemorySettings(graph, loss, optimizer, options, spec, *shortfall);
  std::string text = error.detail();
  if (suggestions.empty()) {
    text +=
        "\nno single location setting lowers that peak; use a device with more memory per tile, or a smaller "
        "batch or model";
  } else {
    text += "\nsettings that lower it (each planned on its own):";
    for (const MemorySuggestion& s : suggestions) {
      text += fmt::format("\n  set {} to {}: peak {} -> {} (saves {}){}", s.setting, s.value,
                          bytesText(shortfall->neededBytes), bytesText(s.neededBytes),
                          bytesText(s.savingBytes), s.fits ? ", fits" : ", still too large");
    }
  }
  return DeviceError(error.code(), error.subject(), text);
}

}  // namespace

void requireTrainingFits(const Graph& graph, TensorId loss, const Optimizer& optimizer,
                         const SessionOptions& options, const DeviceSpec& spec) {
  const RunPlan plan = planTraining(graph, loss, optimizer, options, spec);
  try {
    sim::requireFits(plan.memory);
  } catch (const DeviceError& error) {
    if (error.code() != ErrorCode::OutOfMemory) throw;
    throw outOfMemoryWithSuggestions(error, graph, loss, optimizer, options, spec);
  }
}

namespace {

size_t outputIndex(const std::vector<std::string>& names, std::string_view name) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return i;
  throw GraphError(ErrorCode::UnknownStream, std::string(name),
                   "not an output of this session; name it in the session's outputs");
}

}  // namespace

// ---------------------------------------------------------------------------
// TrainingSession
// ---------------------------------------------------------------------------

struct TrainingSession::Impl {
  SessionOptions options;
  std::unique_ptr<Optimizer> optimizer;
  std::vector<std::string> outputNames;
  std::unique_ptr<detail::SessionRuntime> runtime;
  std::vector<TensorId> weights;
  HostTensor noLoss;
  int64_t step = 0;
  double meanLoss = 0.0;
  TimeReport time;  // of the final program, modelled once
  // Loss scaling: read back from the device with automatic scaling.
  bool automaticLossScaling = false;
  double lossScale = 1.0;
  int64_t skippedSteps = 0;
  bool lastStepSkipped = false;

  // Reads the automatic loss scaling state after a step or a write.
  void readLossScaling() {
    if (!automaticLossScaling) return;
    lossScale = runtime->readVariable(kLossScaleTensor, std::nullopt).data.at(0);
    skippedSteps =
        static_cast<int64_t>(runtime->readVariable(kLossScaleSkippedStepsTensor, std::nullopt).data.at(0));
  }
};

TrainingSession::TrainingSession(Graph graph, TensorId loss, std::unique_ptr<Optimizer> optimizer,
                                 SessionOptions options, std::unique_ptr<Device> device,
                                 std::vector<std::string> outputs)
    : impl_(std::make_unique<Impl>()) {
  Impl& impl = *impl_;
  if (!optimizer) throw ConfigError(ErrorCode::InvalidOptimizer, "/optimizer", "no optimizer given");
  if (!device) throw DeviceError(ErrorCode::InvalidProgram, "device", "no device given");
  checkOptions(graph, options, *device);
  impl.options = std::move(options);
  impl.optimizer = std::move(optimizer);
  impl.outputNames = std::move(outputs);
  const int64_t af = impl.options.getAccumulationFactor();
  if (af > 1 && !impl.outputNames.empty()) {
    throw ConfigError(ErrorCode::UnsupportedCombination, "/sessionOptions/accumulationFactor",
                      fmt::format("extra training outputs ({}) cannot be returned with gradient accumulation "
                                  "(factor {}); read them from an InferenceSession instead",
                                  fmt::join(impl.outputNames, ", "), af));
  }

  // Kept to plan alternatives when the program does not fit the device.
  const Graph original = graph;
  TrainingGraph training{std::move(graph), TrainingTensors{loss, {}, {}}};
  runTrainingPipeline(training, impl.options, *impl.optimizer);
  impl.weights = training.tensors.weights;

  std::vector<TensorId> outputIds{training.tensors.loss};
  const std::vector<TensorId> extra = findOutputs(training.graph, impl.outputNames);
  outputIds.insert(outputIds.end(), extra.begin(), extra.end());
  const DeviceSpec spec = device->spec();
  try {
    impl.runtime = std::make_unique<detail::SessionRuntime>(std::move(training.graph), impl.options,
                                                            std::move(device), af, outputIds);
  } catch (const DeviceError& error) {
    if (error.code() != ErrorCode::OutOfMemory) throw;
    throw outOfMemoryWithSuggestions(error, original, loss, *impl.optimizer, impl.options, spec);
  }
  const Graph& program = impl.runtime->graph();
  impl.time = sim::modelTime(program,
                             {impl.runtime->localReplicas(), impl.options.getGlobalReplicationFactor(),
                              impl.options.getGlobalReplicaOffset()},
                             program.schedule(), spec);
  // After accumulation the loss holds one value per micro-batch.
  impl.runtime->setOutputMicroBatchLeading(0, af > 1);
  impl.automaticLossScaling = impl.options.automaticLossScalingSettings.enabled;
  impl.lossScale = impl.optimizer->lossScaling();
  impl.readLossScaling();
}

TrainingSession::~TrainingSession() = default;
TrainingSession::TrainingSession(TrainingSession&&) noexcept = default;
TrainingSession& TrainingSession::operator=(TrainingSession&&) noexcept = default;

Shape TrainingSession::inputHostShape(std::string_view name) const {
  return impl_->runtime->inputHostShape(name);
}

void TrainingSession::run(std::span<const StepInput> inputs) {
  Impl& impl = *impl_;
  // Skipped steps do not count for the optimizer's step-dependent values.
  for (const HyperParameter& hyper :
       impl.optimizer->hyperParameters(std::max<int64_t>(impl.step - impl.skippedSteps, 0))) {
    impl.runtime->writeScalar(hyper.tensor, hyper.value);
  }
  impl.runtime->run(inputs);
  ++impl.step;
  const int64_t skippedBefore = impl.skippedSteps;
  impl.readLossScaling();
  impl.lastStepSkipped = impl.skippedSteps > skippedBefore;
  const std::vector<float>& losses = impl.runtime->output(0).data;
  double sum = 0.0;
  for (float v : losses) sum += v;
  impl.meanLoss = losses.empty() ? 0.0 : sum / static_cast<double>(losses.size());
}

void TrainingSession::setIdleWork(std::function<bool()> work) {
  impl_->runtime->setIdleWork(std::move(work));
}

const HostTensor& TrainingSession::loss() const { return impl_->runtime->output(0); }
double TrainingSession::meanLoss() const { return impl_->meanLoss; }

const HostTensor& TrainingSession::output(std::string_view name) const {
  return impl_->runtime->output(1 + outputIndex(impl_->outputNames, name));
}

double TrainingSession::learningRate() const { return impl_->optimizer->learningRate(); }
void TrainingSession::setLearningRate(double learningRate) {
  impl_->optimizer->setLearningRate(learningRate);
}
int64_t TrainingSession::step() const { return impl_->step; }

void TrainingSession::setStep(int64_t step) {
  if (step < 0) {
    throw ConfigError(ErrorCode::OutOfRange, "step",
                      fmt::format("step {} is not allowed; it must be >= 0", step));
  }
  impl_->step = step;
}

double TrainingSession::lossScale() const { return impl_->lossScale; }
int64_t TrainingSession::skippedSteps() const { return impl_->skippedSteps; }
bool TrainingSession::lastStepSkipped() const { return impl_->lastStepSkipped; }

HostTensor TrainingSession::readVariable(std::string_view name, std::optional<RetrievalMode> mode) const {
  return impl_->runtime->readVariable(name, mode);
}

void TrainingSession::writeVariable(std::string_view name, const HostTensor& value) {
  impl_->runtime->writeVariable(name, value.data, value.shape);
  if (name == kLossScaleTensor || name == kLossScaleSkippedStepsTensor) impl_->readLossScaling();
}

std::vector<std::pair<std::string, HostTensor>> TrainingSession::readWeights() const {
  return impl_->runtime->readVariables(TensorCategory::Weight);
}

void TrainingSession::writeWeights(const std::vector<std::pair<std::string, HostTensor>>& weights) {
  for (const auto& [name, value] : weights) writeVariable(name, value);
}

const Graph& TrainingSession::graph() const { return impl_->runtime->graph(); }
const SessionOptions& TrainingSession::options() const { return impl_->options; }
const MemoryReport& TrainingSession::memory() const { return impl_->runtime->memory(); }
const TimeReport& TrainingSession::modelledTime() const { return impl_->time; }
Optimizer& TrainingSession::optimizer() { return *impl_->optimizer; }
const Optimizer& TrainingSession::optimizer() const { return *impl_->optimizer; }

// ---------------------------------------------------------------------------
// InferenceSession
// ---------------------------------------------------------------------------

struct InferenceSession::Impl {
  std::vector<std::string> outputNames;
  std::unique_ptr<detail::SessionRuntime> runtime;
};

InferenceSession::InferenceSession(Graph graph, std::vector<std::string> outputs, SessionOptions options,
                                   std::unique_ptr<Device> device)
    : impl_(std::make_unique<Impl>()) {
  if (!device) throw DeviceError(ErrorCode::InvalidProgram, "device", "no device given");
  checkOptions(graph, options, *device);
  if (options.enableGradientAccumulation) {
    throw ConfigError(
        ErrorCode::UnsupportedCombination, "/sessionOptions/enableGradientAccumulation",
        "gradient accumulation only exists for training; set it to false for an inference session");
  }
  impl_->outputNames = std::move(outputs);
  runInferencePipeline(graph, options);
  const std::vector<TensorId> ids = findOutputs(graph, impl_->outputNames);
  impl_->runtime =
      std::make_unique<detail::SessionRuntime>(std::move(graph), options, std::move(device), 1, ids);
}

InferenceSession::~InferenceSession() = default;
InferenceSession::InferenceSession(InferenceSession&&) noexcept = default;
InferenceSession& InferenceSession::operator=(InferenceSession&&) noexcept = default;

Shape InferenceSession::inputHostShape(std::string_view name) const {
  return impl_->runtime->inputHostShape(name);
}
void InferenceSession::run(std::span<const StepInput> inputs) { impl_->runtime->run(inputs); }

const HostTensor& InferenceSession::output(std::string_view name) const {
  return impl_->runtime->output(outputIndex(impl_->outputNames, name));
}

HostTensor InferenceSession::readVariable(std::string_view name, std::optional<RetrievalMode> mode) const {
  return impl_->runtime->readVariable(name, mode);
}

void InferenceSession::writeVariable(std::string_view name, const HostTensor& value) {
  impl_->runtime->writeVariable(name, value.data, value.shape);
}

std::vector<std::pair<std::string, HostTensor>> InferenceSession::readWeights() const {
  return impl_->runtime->readVariables(TensorCategory::Weight);
}

void InferenceSession::writeWeights(const std::vector<std::pair<std::string, HostTensor>>& weights) {
  for (const auto& [name, value] : weights) writeVariable(name, value);
}

const Graph& InferenceSession::graph() const { return impl_->runtime->graph(); }
const MemoryReport& InferenceSession::memory() const { return impl_->runtime->memory(); }

}  // namespace tessera
