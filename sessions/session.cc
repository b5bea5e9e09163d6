#include "tessera/sessions/session.hpp"

#include <algorithm>
#include <functional>
#include <optional>
#include <numeric>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "memory_planner.hpp"
#include "session_runtime.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/loss_scaling.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/sessions/transform.hpp"
#include "time_model.hpp"
#include "training_pipeline.hpp"

namespace tessera {
namespace {

// Validates the options against the device and derives the session's
// replica topology, the one value the transforms and the device get, after
// checking that the graph was built for it.
ReplicaTopology checkOptions(const Graph& graph, const SessionOptions& options, const Device& device) {
  validate(options, device.spec());
  const ReplicaTopology topology = ReplicaTopology::fromOptions(options, device.spec().ipusPerReplica);
  checkReplicationFactor(graph, topology);
  return topology;
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

// The device's out-of-memory error with the location settings that would
// lower the short space's peak, each planned on its own (a session of a
// graph has no run config to search the other levers in).
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
  // Without a run config there is nothing to search the other levers in.
  text += "\nrecomputation, pipelining, more IPUs per replica, phased execution and float16 can lower it too: "
          "`tessera explain CONFIG` searches combinations of them for a run config";
  return DeviceError(error.code(), error.subject(), text);
}

}  // namespace

RunPlan requireTrainingFits(const Graph& graph, TensorId loss, const Optimizer& optimizer,
                            const SessionOptions& options, const DeviceSpec& spec) {
  RunPlan plan = planTraining(graph, loss, optimizer, options, spec);
  try {
    sim::requireFits(plan.memory);
  } catch (const DeviceError& error) {
    if (error.code() != ErrorCode::OutOfMemory) throw;
    throw outOfMemoryWithSuggestions(error, graph, loss, optimizer, options, spec);
  }
  return plan;
}

namespace {

size_t outputIndex(const std::vector<std::string>& names, std::string_view name) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return i;
  throw GraphError(ErrorCode::UnknownStream, std::string(name),
                   "not an output of this session; name it in the session's outputs");
}

// The anchors of a step of several batches, or of return types other than
// All: collected from the runtime's one-batch outputs after every batch.
class StepAnchors {
 public:
  // `leadingMicroBatch[i]`: output i's one-batch host shape starts with the
  // accumulation dimension.
  StepAnchors(int64_t batchesPerStep, std::vector<AnchorReturnType> types, std::vector<bool> leadingMicroBatch)
      : batchesPerStep_(batchesPerStep),
        types_(std::move(types)),
        leadingMicroBatch_(std::move(leadingMicroBatch)),
        values_(types_.size()) {
    direct_ = batchesPerStep_ == 1;
    for (const AnchorReturnType& t : types_) {
      if (t.id == AnchorReturnTypeId::Final || t.id == AnchorReturnTypeId::Sum) direct_ = false;
    }
  }

  // The runtime's outputs are the anchors as they are.
  bool direct() const { return direct_; }

  // Batch `batch` of the step produced `value` for output `index`.
  void add(int64_t batch, size_t index, const HostTensor& value) {
    const AnchorReturnType& type = types_[index];
    HostTensor& to = values_[index];
    const bool first = batch == 0;
    const bool last = batch + 1 == batchesPerStep_;
    switch (type.id) {
      case AnchorReturnTypeId::All:
      case AnchorReturnTypeId::EveryN: {
        const int64_t period = type.id == AnchorReturnTypeId::All ? 1 : type.returnPeriod;
        if (first) to = HostTensor{{}, {}, {}};
        if ((batch + 1) % period != 0) break;
        to.data.insert(to.data.end(), value.data.begin(), value.data.end());
        to.doubles.insert(to.doubles.end(), value.doubles.begin(), value.doubles.end());
        if (last) {
          to.shape = value.shape;
          const int64_t count = batchesPerStep_ / period;
          if (count > 1) to.shape.insert(to.shape.begin(), count);
        }
        break;
      }
      case AnchorReturnTypeId::Final:
        if (!last) break;
        to = lastMicroBatch(index, value);
        break;
      case AnchorReturnTypeId::Sum: {
        // Micro-batch by micro-batch, in order, read in place.
        const bool leading = leadingMicroBatch_[index];
        const auto slices = static_cast<size_t>(leading ? value.shape.at(0) : 1);
        const size_t floats = value.data.size() / slices;
        const size_t doubles = value.doubles.size() / slices;
        size_t m = 0;
        if (first) {
          to = HostTensor{leading ? Shape(value.shape.begin() + 1, value.shape.end()) : value.shape,
                          {value.data.begin(), value.data.begin() + static_cast<std::ptrdiff_t>(floats)},
                          {value.doubles.begin(), value.doubles.begin() + static_cast<std::ptrdiff_t>(doubles)}};
          m = 1;
        }
        for (; m < slices; ++m) {
          for (size_t k = 0; k < floats; ++k) to.data[k] += value.data[m * floats + k];
          for (size_t k = 0; k < doubles; ++k) to.doubles[k] += value.doubles[m * doubles + k];
        }
        break;
      }
    }
  }

  const HostTensor& value(size_t index) const { return values_.at(index); }

 private:
  // Micro-batch m of a one-batch output (the whole output without an
  // accumulation dimension).
  HostTensor microBatch(size_t index, const HostTensor& value, int64_t m) const {
    if (!leadingMicroBatch_[index]) return value;
    const int64_t slices = value.shape.at(0);
    HostTensor out{Shape(value.shape.begin() + 1, value.shape.end()), {}, {}};
    const size_t floats = value.data.size() / static_cast<size_t>(slices);
    const size_t doubles = value.doubles.size() / static_cast<size_t>(slices);
    const auto mm = static_cast<size_t>(m);
    out.data.assign(value.data.begin() + static_cast<std::ptrdiff_t>(mm * floats),
                    value.data.begin() + static_cast<std::ptrdiff_t>((mm + 1) * floats));
    out.doubles.assign(value.doubles.begin() + static_cast<std::ptrdiff_t>(mm * doubles),
                       value.doubles.begin() + static_cast<std::ptrdiff_t>((mm + 1) * doubles));
    return out;
  }
  HostTensor lastMicroBatch(size_t index, const HostTensor& value) const {
    if (!leadingMicroBatch_[index]) return value;
    return microBatch(index, value, value.shape.at(0) - 1);
  }

  int64_t batchesPerStep_;
  std::vector<AnchorReturnType> types_;
  std::vector<bool> leadingMicroBatch_;
  std::vector<HostTensor> values_;
  bool direct_ = true;
};

// The anchors other than `lossName`, in order, and the return type of each
// output (the loss first when `lossName` is set).
std::vector<std::string> anchorNames(const DataFlow& flow, const std::string* lossName) {
  std::vector<std::string> names;
  for (const auto& anchor : flow.anchors) {
    if (lossName == nullptr || anchor.first != *lossName) names.push_back(anchor.first);
  }
  return names;
}

AnchorReturnType anchorType(const DataFlow& flow, std::string_view name) {
  for (const auto& anchor : flow.anchors) {
    if (anchor.first == name) return anchor.second;
  }
  return AnchorReturnType::all();
}

// One run()'s inputs cut into its batches: the one-batch inputs of batch b.
class BatchInputs {
 public:
  BatchInputs(std::span<const StepInput> inputs, int64_t batchesPerStep,
              const std::function<Shape(std::string_view)>& batchShape)
      : inputs_(inputs) {
    for (const StepInput& input : inputs) {
      const Shape shape = batchShape(input.name);
      const auto perBatch = static_cast<size_t>(numElements(shape));
      const size_t received = input.floats.size() + input.ints.size() + input.doubles.size();
      if (received != perBatch * static_cast<size_t>(batchesPerStep)) {
        Shape step = shape;
        step.insert(step.begin(), batchesPerStep);
        throw GraphError(ErrorCode::HostShapeMismatch, std::string(input.name),
                         fmt::format("expected host shape {} = {} elements (batchesPerStep {} in front of the "
                                     "one-batch shape {}); received {} elements",
                                     shapeStr(step), perBatch * static_cast<size_t>(batchesPerStep),
                                     batchesPerStep, shapeStr(shape), received));
      }
      perBatch_.push_back(perBatch);
    }
  }

  std::vector<StepInput> batch(int64_t b) const {
    std::vector<StepInput> out;
    out.reserve(inputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const StepInput& input = inputs_[i];
      const size_t from = static_cast<size_t>(b) * perBatch_[i];
      if (!input.ints.empty()) {
        out.emplace_back(input.name, input.ints.subspan(from, perBatch_[i]));
      } else if (!input.doubles.empty()) {
        out.emplace_back(input.name, input.doubles.subspan(from, perBatch_[i]));
      } else {
        out.emplace_back(input.name, input.floats.subspan(from, perBatch_[i]));
      }
    }
    return out;
  }

 private:
  std::span<const StepInput> inputs_;
  std::vector<size_t> perBatch_;
};

Shape withBatches(Shape shape, int64_t batchesPerStep) {
  if (batchesPerStep > 1) shape.insert(shape.begin(), batchesPerStep);
  return shape;
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
  DataFlow dataFlow{1};
  std::optional<StepAnchors> anchors;
  std::vector<double> batchMeanLosses;
  std::vector<bool> batchesSkipped;

  void construct(Graph graph, TensorId loss, std::unique_ptr<Optimizer> optimizer, SessionOptions options,
                 std::unique_ptr<Device> device, std::vector<std::string> outputs);
  // One batch: the optimizer's values for this step, the program, the loss
  // scaling state read back.
  void runBatch(std::span<const StepInput> inputs);

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
  impl_->construct(std::move(graph), loss, std::move(optimizer), std::move(options), std::move(device),
                   std::move(outputs));
}

TrainingSession::TrainingSession(Graph graph, TensorId loss, std::unique_ptr<Optimizer> optimizer,
                                 SessionOptions options, std::unique_ptr<Device> device, DataFlow dataFlow)
    : impl_(std::make_unique<Impl>()) {
  validate(dataFlow);
  const std::string lossName = graph.tensor(loss).name;
  std::vector<std::string> outputs = anchorNames(dataFlow, &lossName);
  impl_->dataFlow = std::move(dataFlow);
  impl_->construct(std::move(graph), loss, std::move(optimizer), std::move(options), std::move(device),
                   std::move(outputs));
  std::vector<AnchorReturnType> types{anchorType(impl_->dataFlow, lossName)};
  std::vector<bool> leading{impl_->options.getAccumulationFactor() > 1};
  for (const std::string& name : impl_->outputNames) {
    types.push_back(anchorType(impl_->dataFlow, name));
    leading.push_back(false);
  }
  impl_->anchors.emplace(impl_->dataFlow.batchesPerStep, std::move(types), std::move(leading));
}

void TrainingSession::Impl::construct(Graph graph, TensorId loss, std::unique_ptr<Optimizer> optimizer_,
                                      SessionOptions options_, std::unique_ptr<Device> device,
                                      std::vector<std::string> outputs) {
  Impl& impl = *this;
  if (!optimizer_) throw ConfigError(ErrorCode::InvalidOptimizer, "/optimizer", "no optimizer given");
  if (!device) throw DeviceError(ErrorCode::InvalidProgram, "device", "no device given");
  const ReplicaTopology topology = checkOptions(graph, options_, *device);
  impl.options = std::move(options_);
  impl.optimizer = std::move(optimizer_);
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
  const std::string lossName = graph.tensor(loss).name;
  TrainingGraph training{std::move(graph), TrainingTensors{loss, {}, {}}};
  runTrainingPipeline(training, impl.options, *impl.optimizer, topology);
  impl.weights = training.tensors.weights;

  std::vector<TensorId> outputIds{training.tensors.loss};
  const std::vector<TensorId> extra = findOutputs(training.graph, impl.outputNames);
  outputIds.insert(outputIds.end(), extra.begin(), extra.end());
  const DeviceSpec spec = device->spec();
  // The host streams of the outputs: the loss (one value per micro-batch)
  // first, then the other anchors.
  detail::HostIo io{impl.dataFlow.batchesPerStep, {}, {af > 1}};
  io.outputTypes.push_back(anchorType(impl.dataFlow, lossName));
  for (const std::string& name : impl.outputNames) {
    io.outputTypes.push_back(anchorType(impl.dataFlow, name));
    io.microBatchLeading.push_back(false);
  }
  try {
    impl.runtime = std::make_unique<detail::SessionRuntime>(std::move(training.graph), impl.options, topology,
                                                            std::move(device), af, outputIds, io);
  } catch (const DeviceError& error) {
    if (error.code() != ErrorCode::OutOfMemory) throw;
    throw outOfMemoryWithSuggestions(error, original, loss, *impl.optimizer, impl.options, spec);
  }
  impl.time = impl.runtime->modelledTime();
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
  return withBatches(impl_->runtime->inputHostShape(name), impl_->dataFlow.batchesPerStep);
}

void TrainingSession::Impl::runBatch(std::span<const StepInput> inputs) {
  // Skipped steps do not count for the optimizer's step-dependent values.
  for (const HyperParameter& hyper : optimizer->hyperParameters(std::max<int64_t>(step - skippedSteps, 0))) {
    runtime->writeScalar(hyper.tensor, hyper.value);
  }
  runtime->run(inputs);
  ++step;
  const int64_t skippedBefore = skippedSteps;
  readLossScaling();
  lastStepSkipped = skippedSteps > skippedBefore;
  const std::vector<float>& losses = runtime->output(0).data;
  double sum = 0.0;
  for (float v : losses) sum += v;
  meanLoss = losses.empty() ? 0.0 : sum / static_cast<double>(losses.size());
  batchMeanLosses.push_back(meanLoss);
  batchesSkipped.push_back(lastStepSkipped);
}

void TrainingSession::run(std::span<const StepInput> inputs) {
  Impl& impl = *impl_;
  impl.batchMeanLosses.clear();
  impl.batchesSkipped.clear();
  const int64_t batches = impl.dataFlow.batchesPerStep;
  if (batches == 1 && (!impl.anchors || impl.anchors->direct())) {
    impl.runBatch(inputs);
    return;
  }
  const BatchInputs cut(inputs, batches,
                        [&impl](std::string_view name) { return impl.runtime->inputHostShape(name); });
  for (int64_t b = 0; b < batches; ++b) {
    const std::vector<StepInput> batch = cut.batch(b);
    impl.runBatch(batch);
    for (size_t i = 0; i <= impl.outputNames.size(); ++i) impl.anchors->add(b, i, impl.runtime->output(i));
  }
}

void TrainingSession::setIdleWork(std::function<bool()> work) {
  impl_->runtime->setIdleWork(std::move(work));
}

const HostTensor& TrainingSession::loss() const {
  if (impl_->anchors && !impl_->anchors->direct()) return impl_->anchors->value(0);
  return impl_->runtime->output(0);
}
double TrainingSession::meanLoss() const { return impl_->meanLoss; }
const std::vector<double>& TrainingSession::batchMeanLosses() const { return impl_->batchMeanLosses; }
const std::vector<bool>& TrainingSession::batchesSkipped() const { return impl_->batchesSkipped; }

const HostTensor& TrainingSession::output(std::string_view name) const {
  const size_t index = 1 + outputIndex(impl_->outputNames, name);
  if (impl_->anchors && !impl_->anchors->direct()) return impl_->anchors->value(index);
  return impl_->runtime->output(index);
}
const DataFlow& TrainingSession::dataFlow() const { return impl_->dataFlow; }

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
  DataFlow dataFlow{1};
  std::optional<StepAnchors> anchors;
};

InferenceSession::InferenceSession(Graph graph, DataFlow dataFlow, SessionOptions options,
                                   std::unique_ptr<Device> device)
    : InferenceSession(std::move(graph), (validate(dataFlow), anchorNames(dataFlow, nullptr)), std::move(options),
                       std::move(device)) {
  impl_->dataFlow = std::move(dataFlow);
  std::vector<AnchorReturnType> types;
  for (const std::string& name : impl_->outputNames) types.push_back(anchorType(impl_->dataFlow, name));
  impl_->anchors.emplace(impl_->dataFlow.batchesPerStep, std::move(types),
                         std::vector<bool>(impl_->outputNames.size(), false));
}

InferenceSession::InferenceSession(Graph graph, std::vector<std::string> outputs, SessionOptions options,
                                   std::unique_ptr<Device> device)
    : impl_(std::make_unique<Impl>()) {
  if (!device) throw DeviceError(ErrorCode::InvalidProgram, "device", "no device given");
  const ReplicaTopology topology = checkOptions(graph, options, *device);
  if (options.enableGradientAccumulation) {
    throw ConfigError(
        ErrorCode::UnsupportedCombination, "/sessionOptions/enableGradientAccumulation",
        "gradient accumulation only exists for training; set it to false for an inference session");
  }
  impl_->outputNames = std::move(outputs);
  runInferencePipeline(graph, options, topology);
  const std::vector<TensorId> ids = findOutputs(graph, impl_->outputNames);
  impl_->runtime = std::make_unique<detail::SessionRuntime>(std::move(graph), options, topology,
                                                            std::move(device), 1, ids);
}

InferenceSession::~InferenceSession() = default;
InferenceSession::InferenceSession(InferenceSession&&) noexcept = default;
InferenceSession& InferenceSession::operator=(InferenceSession&&) noexcept = default;

Shape InferenceSession::inputHostShape(std::string_view name) const {
  return withBatches(impl_->runtime->inputHostShape(name), impl_->dataFlow.batchesPerStep);
}

void InferenceSession::run(std::span<const StepInput> inputs) {
  Impl& impl = *impl_;
  const int64_t batches = impl.dataFlow.batchesPerStep;
  if (batches == 1 && (!impl.anchors || impl.anchors->direct())) {
    impl.runtime->run(inputs);
    return;
  }
  const BatchInputs cut(inputs, batches,
                        [&impl](std::string_view name) { return impl.runtime->inputHostShape(name); });
  for (int64_t b = 0; b < batches; ++b) {
    const std::vector<StepInput> batch = cut.batch(b);
    impl.runtime->run(batch);
    for (size_t i = 0; i < impl.outputNames.size(); ++i) impl.anchors->add(b, i, impl.runtime->output(i));
  }
}

const HostTensor& InferenceSession::output(std::string_view name) const {
  const size_t index = outputIndex(impl_->outputNames, name);
  if (impl_->anchors && !impl_->anchors->direct()) return impl_->anchors->value(index);
  return impl_->runtime->output(index);
}
const DataFlow& InferenceSession::dataFlow() const { return impl_->dataFlow; }

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
