#include "tessera/app/trainer.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "memory_planner.hpp"
#include "run_model.hpp"
#include "tessera/app/checkpoint.hpp"
#include "tessera/popdist/communicator.hpp"
#include "tessera/sessions/data_flow.hpp"
#include "tessera/app/dataset.hpp"
#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/app/output_check.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/app/profile.hpp"
#include "tessera/app/run_plan.hpp"
#include "tessera/sessions/session.hpp"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

void checkInputWidth(const ModelConfig& model, const DatasetSplit& split) {
  if (model.layers.front() != split.sampleElements()) {
    throw ConfigError(
        ErrorCode::InvalidModel, "/model/layers/0",
        fmt::format("the model takes {} inputs but the dataset's samples have {} ({} x {}); set "
                    "/model/layers/0 to {}",
                    model.layers.front(), split.sampleElements(), split.rows, split.cols,
                    split.sampleElements()));
  }
}

// The onnx model's images input must hold one image per sample.
void checkImageInput(const ModelConfig& config, const RunModel& model, const DatasetSplit& split) {
  const Shape& shape = model.graph.tensor(model.graph.find(model.images)).shape;
  int64_t elements = 1;
  for (std::size_t axis = 1; axis < shape.size(); ++axis) elements *= shape[axis];
  if (shape.size() >= 2 && elements == split.sampleElements()) return;
  throw ConfigError(
      ErrorCode::InvalidModel, "/model/images",
      fmt::format(
          "input \"{}\" of {} is [{}]: {} elements per sample, but the dataset's images have {} ({} x {}); "
          "the images input must take rows x cols pixels per sample, e.g. [batch, 1, {}, {}]",
          model.images, config.path, fmt::join(shape, ", "), shape.size() >= 2 ? elements : 0,
          split.sampleElements(), split.rows, split.cols, split.rows, split.cols));
}

// An IDX split as the tensors of the model's images input ([N, pixels] for
// the MLP, [N, ...the input's sample shape] for onnx) and labels input [N];
// the vectors are moved, not copied.
TensorSplit asTensors(DatasetSplit&& split, const RunModel& model, std::string source) {
  TensorSplit tensors;
  tensors.source = std::move(source);
  tensors.count = split.count;
  DataTensor images;
  images.name = model.images;
  const TensorNode& node = model.graph.tensor(model.graph.find(model.images));
  const Shape& input = node.shape;
  // Float32 or float16: the pixels / 255 are fed as floats either way.
  images.dtype = node.dtype;
  images.shape = {split.count};
  images.shape.insert(images.shape.end(), input.begin() + 1, input.end());
  images.floats = std::move(split.images);
  DataTensor labels;
  labels.name = model.labels;
  labels.dtype = DType::Int32;
  labels.shape = {split.count};
  labels.ints = std::move(split.labels);
  tensors.tensors.push_back(std::move(images));
  tensors.tensors.push_back(std::move(labels));
  return tensors;
}

// The data of the run as tensors named after the model's inputs: a tensors
// dataset checked against them, or an IDX dataset (or its synthetic
// stand-in) for the MLP.
TensorDataset loadRunData(const RunConfig& config, const RunModel& model, std::string& notice) {
  if (config.data.dataset == DatasetKind::Tensors) {
    return loadTensorDataset(config.data, graphDataInputs(model.graph, model.inputs));
  }
  if (config.model.type != kMlpModel && config.model.type != kOnnxModel) {
    throw ConfigError(
        ErrorCode::InvalidData, "/data/dataset",
        fmt::format("the {} dataset feeds the images and labels of an Mlp or Onnx model; a {} model is fed "
                    "by the Tensors dataset (a .safetensors file with a tensor per graph input)",
                    toString(config.data.dataset), config.model.type));
  }
  Dataset data = loadDataset(config.data);
  if (config.model.type == kMlpModel) {
    checkInputWidth(config.model, data.train);
  } else {
    checkImageInput(config.model, model, data.train);
  }
  TensorDataset tensors;
  tensors.source = data.source;
  notice = data.notice;
  tensors.train = asTensors(std::move(data.train), model, data.source);
  tensors.test = asTensors(std::move(data.test), model, data.source);
  return tensors;
}

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30)); }

int64_t saturatedSum(std::initializer_list<int64_t> terms) {
  int64_t sum = 0;
  for (const int64_t term : terms)
    if (__builtin_add_overflow(sum, term, &sum)) return std::numeric_limits<int64_t>::max();
  return sum;
}

// The bytes the run's dataset takes on the host once read, from the config
// alone: images and labels as 4-byte values (28 x 28 pixels and a label per
// sample of the IDX sets), or about the file's size for a tensors dataset.
int64_t datasetHostBytes(const DataConfig& data) {
  if (data.dataset == DatasetKind::Tensors) {
    std::error_code error;
    const uintmax_t size = std::filesystem::file_size(data.path, error);
    return error ? 0 : static_cast<int64_t>(std::min<uintmax_t>(size, std::numeric_limits<int64_t>::max()));
  }
  const auto count = [](int64_t limit, int64_t full) { return limit > 0 ? std::min(limit, full) : full; };
  const int64_t samples = count(data.limitTrainSamples, kSyntheticTrainSamples) +
                          count(data.limitTestSamples, kSyntheticTestSamples);
  constexpr int64_t kSampleBytes = (28 * 28 + 1) * 4;
  return samples * kSampleBytes;
}

// The whole run's host memory, estimated from the plan before the data is
// read or any buffer is made: the simulator's buffers of the program
// (sim::estimateHostMemory: weights once per group, activations per local
// replica, remote buffers), one host copy of the variables (checkpoints, the
// weights read back) and the dataset. Refused over /limits/maxHostBytes,
// whatever the simulated device's memory (tilesPerIpu x bytesPerTile).
void requireHostMemory(const RunConfig& config, const RunPlan& plan, std::string_view command) {
  const sim::HostMemoryEstimate program = sim::estimateHostMemory(plan.program);
  const auto category = [&program](TensorCategory c) {
    return program.byCategory[static_cast<std::size_t>(c)];
  };
  const int64_t variables =
      saturatedSum({category(TensorCategory::Weight), category(TensorCategory::OptimizerState),
                    category(TensorCategory::Accumulator)});
  const int64_t dataset = datasetHostBytes(config.data);
  const int64_t total = saturatedSum({program.bytes, variables, dataset});
  const int64_t limit = config.limits.maxHostBytes;
  if (total <= limit) return;
  std::vector<std::string> largest;
  for (const sim::HostBuffer& buffer : program.largest) {
    if (largest.size() == 3) break;
    largest.push_back(fmt::format("{} ({}) {}", buffer.name, buffer.category, gib(buffer.bytes)));
  }
  const int64_t capacity = plan.memory.computeTilesCapacity;
  // A limit that would take the run: the estimate rounded up to whole GiB.
  const int64_t enough =
      total >= (std::numeric_limits<int64_t>::max() >> 1) ? total : ((total >> 30) + 1) << 30;
  throw DeviceError(
      ErrorCode::HostMemoryLimit, "/limits/maxHostBytes",
      fmt::format(
          "{} would allocate about {} ({} bytes) of host memory, more than /limits/maxHostBytes "
          "({}, {} bytes): the program's buffers {} (activations {} over {} local replica(s), weights {}, "
          "optimizer state {}, accumulators {}), a host copy of the variables {}, the dataset {}; largest: "
          "{}. Lower the widths, the batch size or the local replicas, or raise /limits/maxHostBytes (e.g. "
          "--set /limits/maxHostBytes={}) if the host has the memory{}",
          command, gib(total), total, gib(limit), limit, gib(program.bytes),
          gib(category(TensorCategory::Activation)), plan.program.replicas.localReplicas,
          gib(category(TensorCategory::Weight)), gib(category(TensorCategory::OptimizerState)),
          gib(category(TensorCategory::Accumulator)), gib(variables), gib(dataset), fmt::join(largest, ", "),
          enough,
          capacity > limit
              ? fmt::format("; the simulated device's {} of tile memory (/device/tilesPerIpu {} x "
                            "bytesPerTile) is simulated in host memory too, so it does not raise this",
                            gib(capacity), config.device.tilesPerIpu)
              : std::string()));
}

// Host buffers for `samples` samples of each model input, and the step
// inputs that point at them.
class StepBuffers {
 public:
  StepBuffers(const std::vector<std::string>& inputs, const TensorSplit& split, int64_t samples)
      : samples_(samples) {
    floats_.resize(inputs.size());
    ints_.resize(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const DataTensor* tensor = split.find(inputs[i]);
      if (tensor == nullptr) {
        throw InternalError(ErrorCode::Internal, inputs[i], "the dataset has no tensor for this model input");
      }
      tensors_.push_back(tensor);
      const auto size = static_cast<std::size_t>(samples * tensor->sampleElements());
      if (isFloating(tensor->dtype)) {
        floats_[i].resize(size);
        steps_.emplace_back(inputs[i], std::span<const float>(floats_[i]));
      } else {
        ints_[i].resize(size);
        steps_.emplace_back(inputs[i], std::span<const int32_t>(ints_[i]));
      }
    }
  }

  // Copies the samples at positions first .. of `order` into the buffers.
  void fill(std::span<const int64_t> order, int64_t first) { fill(order, first, 0, samples_); }

  // Copies samples [begin, end) of the buffers only: those at positions
  // first + begin .. first + end of `order`.
  void fill(std::span<const int64_t> order, int64_t first, int64_t begin, int64_t end) {
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const auto from = static_cast<std::size_t>(begin * tensors_[i]->sampleElements());
      const auto count = static_cast<std::size_t>((end - begin) * tensors_[i]->sampleElements());
      if (isFloating(tensors_[i]->dtype)) {
        fillTensorBatch(*tensors_[i], order, first + begin, std::span(floats_[i]).subspan(from, count));
      } else {
        fillTensorBatch(*tensors_[i], order, first + begin, std::span(ints_[i]).subspan(from, count));
      }
    }
  }

  int64_t samples() const noexcept { return samples_; }
  // The bytes of one sample of every input.
  int64_t sampleBytes() const noexcept {
    int64_t bytes = 0;
    for (const DataTensor* tensor : tensors_) bytes += tensor->sampleElements() * 4;
    return bytes;
  }

  std::span<const StepInput> inputs() const noexcept { return steps_; }
  const std::vector<int32_t>& ints(std::size_t input) const noexcept { return ints_[input]; }

 private:
  int64_t samples_;
  std::vector<const DataTensor*> tensors_;
  std::vector<std::vector<float>> floats_;
  std::vector<std::vector<int32_t>> ints_;
  std::vector<StepInput> steps_;
};

// The training steps' inputs, gathered one step ahead, as PopART
// prefetches its data streams: while the device runs step k, its own host
// threads copy step k + 1's samples from the dataset into a second set of
// buffers in the gaps between their parallel parts
// (TrainingSession::setIdleWork). The gather reads samples scattered over
// the whole dataset (a cache miss per line), about a tenth of an MLP step
// when it is done in line. It goes in chunks of about 8 KB that take()
// claims too: a step that begins before its batch is complete copies the
// chunks left itself and waits only for those under way. No thread of the
// feed's own takes a core from the device (one at normal priority slowed
// the Adam config by 6 %; one at nice 19 gained little once the device's
// collectives kept both cores busy: bench/RESULTS.md), and the values are
// those of the gather in line. On one device thread, take() gathers
// everything itself.
class BatchFeed {
 public:
  BatchFeed(const std::vector<std::string>& inputs, const TensorSplit& split, int64_t samples,
            TrainingSession& session)
      : buffers_{StepBuffers(inputs, split, samples), StepBuffers(inputs, split, samples)},
        chunkSamples_(std::clamp<int64_t>(kChunkBytes / std::max<int64_t>(buffers_[0].sampleBytes(), 1), 1,
                                          std::max<int64_t>(samples, 1))),
        chunks_((samples + chunkSamples_ - 1) / chunkSamples_), session_(session) {
    session_.setIdleWork([this] { return gatherChunk(); });
  }
  BatchFeed(const BatchFeed&) = delete;
  BatchFeed& operator=(const BatchFeed&) = delete;
  ~BatchFeed() { session_.setIdleWork({}); }

  // The step inputs of the samples at positions first .. of `order`: the
  // ones prefetch() asked for when it asked for these, else gathered now.
  std::span<const StepInput> take(std::span<const int64_t> order, int64_t first) {
    const bool asked =
        asked_ && order.data() == order_.data() && order.size() == order_.size() && first == first_;
    finish();
    if (!asked) {
      failure_ = nullptr;  // of a gather nobody took
      buffers_[current_].fill(order, first);
      return buffers_[current_].inputs();
    }
    current_ = 1 - current_;
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
    return buffers_[current_].inputs();
  }

  // Starts gathering the samples at positions first .. of `order` for the
  // next take(), into the buffers the current step does not read. `order`
  // must stay as it is until then.
  void prefetch(std::span<const int64_t> order, int64_t first) {
    finish();
    // No chunk is under way: the request is the caller's to change.
    order_ = order;
    first_ = first;
    target_ = 1 - current_;
    {
      std::lock_guard lock(mutex_);
      done_ = 0;
    }
    asked_ = true;
    ++generation_;
    claims_.store(generation_ << kChunkBits, std::memory_order_release);
  }

 private:
  static constexpr int64_t kChunkBytes = 8192;
  static constexpr int kChunkBits = 32;

  // Claims a chunk of the current request and gathers it: false when none
  // is left to claim. The request's fields are read only once a chunk is
  // claimed: the caller changes them only when every chunk is done.
  bool gatherChunk() {
    uint64_t claims = claims_.load(std::memory_order_acquire);
    int64_t chunk = 0;
    do {
      chunk = static_cast<int64_t>(claims & ((uint64_t{1} << kChunkBits) - 1));
      if ((claims >> kChunkBits) == 0 || chunk >= chunks_) return false;
    } while (!claims_.compare_exchange_weak(claims, claims + 1, std::memory_order_acq_rel));
    StepBuffers& next = buffers_[static_cast<std::size_t>(target_)];
    std::exception_ptr failure;
    try {
      next.fill(order_, first_, chunk * chunkSamples_, std::min((chunk + 1) * chunkSamples_, next.samples()));
    } catch (...) {
      failure = std::current_exception();
    }
    std::lock_guard lock(mutex_);
    if (failure && !failure_) failure_ = failure;
    if (++done_ == chunks_) changed_.notify_all();
    return true;
  }

  // Completes the current request, if any: the caller gathers the chunks
  // left and waits for those under way.
  void finish() {
    if (!asked_) return;
    while (gatherChunk()) {
    }
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return done_ == chunks_; });
    asked_ = false;
  }

  std::array<StepBuffers, 2> buffers_;
  const int64_t chunkSamples_;
  const int64_t chunks_;  // of chunkSamples_ samples, the last one shorter
  TrainingSession& session_;
  int current_ = 0;  // the buffers take() returned last
  // The request, the caller's to change while no chunk of it is claimed.
  std::span<const int64_t> order_;
  int64_t first_ = 0;
  int target_ = 0;      // the buffers it fills
  bool asked_ = false;  // a request is open (take() not yet called)
  uint64_t generation_ = 0;
  std::atomic<uint64_t> claims_{0};  // generation << kChunkBits | chunks claimed; generation 0: none
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t done_ = 0;            // chunks of the request gathered (mutex_)
  std::exception_ptr failure_;  // the first failure of a chunk (mutex_)
};

// Why `control` asks to stop now: 0 when it does not, else its stopReason
// (at least 1).
int stopReasonOf(const TrainControl& control) {
  if (!control.stopRequested || !control.stopRequested()) return 0;
  const int reason = control.stopReason ? control.stopReason() : 0;
  return reason > 0 ? reason : 1;
}

// Writes the checkpoint to `path`; when that fails (a full disk, a folder
// removed during the run), once more under the same name in the working
// directory, so that the run's result is not lost. Either way a failure is
// an IoError naming where the checkpoint went, or that it went nowhere.
void writeCheckpointKeeping(const Checkpoint& checkpoint, const std::string& path) {
  try {
    writeCheckpoint(checkpoint, path);
    return;
  } catch (const IoError& failed) {
    std::error_code error;
    const std::filesystem::path here = std::filesystem::current_path(error);
    const std::filesystem::path target(path);
    const std::filesystem::path folder = target.parent_path().empty() ? "." : target.parent_path();
    if (error || std::filesystem::equivalent(folder, here, error)) {
      throw IoError(ErrorCode::FileUnwritable, path,
                    fmt::format("{}; the checkpoint of step {} was not written anywhere (the working "
                                "directory is the same folder)",
                                failed.detail(), checkpoint.step));
    }
    const std::string fallback = (here / target.filename()).string();
    try {
      writeCheckpoint(checkpoint, fallback);
    } catch (const IoError& again) {
      throw IoError(ErrorCode::FileUnwritable, path,
                    fmt::format("{}; the checkpoint of step {} was not written anywhere: the retry in the "
                                "working directory failed too ({}: {})",
                                failed.detail(), checkpoint.step, fallback, again.detail()));
    }
    throw IoError(
        ErrorCode::FileUnwritable, path,
        fmt::format("{}; the checkpoint of step {} was written to {} instead (continue with --resume "
                    "{})",
                    failed.detail(), checkpoint.step, fallback, fallback));
  }
}

// This process's part of a run: one instance of dist::numInstances(), or
// the whole run.
class Instances {
 public:
  // Reads the launcher's environment, fills the distributed fields of
  // `options` from it (saying so in `notes` when that changes the config's
  // replication) and connects to the other instances.
  Instances(const RunConfig& config, SessionOptions& options, std::vector<std::string>& notes)
      : env_(dist::readDistEnv()) {
    if (!env_.set && env_.numInstances > 1) {
      throw DistError(ErrorCode::InconsistentDistEnv, std::string(dist::kMpiWorldSizeVar),
                      fmt::format("this is one of {} processes started by mpirun, but without the POPDIST_* "
                                  "variables that split the replicas between them; start them with `tessera "
                                  "launch --num-replicas R --num-instances {} -- ...`",
                                  env_.numInstances, env_.numInstances));
    }
    if (!env_.set && options.getGlobalReplicationFactor() != options.getLocalReplicationFactor()) {
      const int64_t global = options.getGlobalReplicationFactor();
      const int64_t local = options.getLocalReplicationFactor();
      throw ConfigError(
          ErrorCode::UnsupportedCombination, "/sessionOptions/enableDistributedReplicatedGraphs",
          fmt::format("the config spreads {} replicas over instances of {}, but this process was "
                      "not started as one of them; run `tessera launch --num-replicas {} "
                      "--num-instances {} -- tessera train ...`",
                      global, local, global, global / local));
    }
    // The launcher's replica count replaces the config's, so it meets the
    // config's limit before anything is planned or allocated for it.
    if (env_.set && env_.numTotalReplicas > config.limits.maxReplicas) {
      throw ConfigError(
          ErrorCode::ShapeTooLarge, std::string(dist::kNumTotalReplicasVar),
          fmt::format("the launcher asks for {} replicas in total (tessera launch --num-replicas), more than "
                      "/limits/maxReplicas ({}); lower --num-replicas, or raise /limits/maxReplicas if the host "
                      "has the memory and time to plan them",
                      env_.numTotalReplicas, config.limits.maxReplicas));
    }
    dist::configureSessionOptions(options, env_);
    const int64_t asked = config.sessionOptions.getGlobalReplicationFactor();
    if (env_.set && options.getGlobalReplicationFactor() != asked) {
      notes.push_back(
          fmt::format("the launcher sets the replication: {} replica(s) in total, {} per "
                      "instance on {} instance(s) (the config asks for {})",
                      env_.numTotalReplicas, env_.numLocalReplicas, env_.numInstances, asked));
    }
    // PopRun's --ipus-per-replica: the launcher's IPUs per replica make the
    // device's, unless the config asks for other ones.
    spec_ = config.device;
    if (env_.set && env_.numIpusPerReplica != spec_.ipusPerReplica) {
      if (spec_.ipusPerReplica != 1 || env_.numIpusPerReplica > kMaxIpusPerReplica) {
        throw DistError(
            ErrorCode::InconsistentIpusPerReplica, std::string(dist::kNumIpusPerReplicaVar),
            fmt::format("the launcher asks for {} IPUs per replica (tessera launch --ipus-per-replica), but {}; "
                        "launch with --ipus-per-replica {} or leave /device/ipusPerReplica at 1",
                        env_.numIpusPerReplica,
                        spec_.ipusPerReplica != 1
                            ? fmt::format("/device/ipusPerReplica is {}", spec_.ipusPerReplica)
                            : fmt::format("a replica spans at most {}", kMaxIpusPerReplica),
                        spec_.ipusPerReplica != 1 ? spec_.ipusPerReplica : 1));
      }
      spec_.ipusPerReplica = env_.numIpusPerReplica;
      notes.push_back(fmt::format("the launcher sets {} IPUs per replica, {} IPUs in all", spec_.ipusPerReplica,
                                  spec_.ipusPerReplica * env_.numTotalReplicas));
    }
    if (env_.numInstances > 1) communicator_ = dist::instanceCommunicator();
  }

  // The device of the run: the config's, with the launcher's IPUs per replica.
  const DeviceSpec& spec() const noexcept { return spec_; }

  int64_t count() const noexcept { return env_.numInstances; }
  int64_t index() const noexcept { return env_.instanceIndex; }
  // Files are written by instance 0 only; every instance computes them.
  bool writesOutput() const noexcept { return env_.instanceIndex == 0; }

  std::unique_ptr<Device> device() const {
    if (!communicator_) return makeSimDevice(spec_);
    return makeSimDevice(spec_, ExecutionMode::Vectorized, communicator_);
  }

  // Fails on every instance when they were started with different configs
  // or loaded different datasets.
  void checkAgree(const RunConfig& config, const TensorDataset& data) const {
    if (!communicator_) return;
    const nlohmann::json settings{
        {"runConfig", nlohmann::json(config)},
        {"dataset", {{"trainSamples", data.train.count}, {"testSamples", data.test.count}}}};
    dist::checkInstancesAgree(*communicator_, settings, "run configs and datasets");
  }

  // The mean loss of the step over the global batch, added up in the order
  // one instance with every replica would use (micro-batch, then global
  // replica), so that the number does not depend on the split. The same
  // message carries each instance's stopReasonOf(control) for the next
  // anyStop().
  double meanLoss(const TrainingSession& session, const TrainControl& control) {
    if (!communicator_) return session.meanLoss();
    const int stop = stopReasonOf(control);
    const std::vector<float>& local = session.loss().data;
    const size_t block = local.size() + 1;
    mine_.assign(local.begin(), local.end());
    mine_.push_back(static_cast<float>(stop));
    gathered_.resize(block * static_cast<size_t>(count()));
    communicator_->allGather(mine_, gathered_);
    const int64_t perInstance = session.options().getLocalReplicationFactor();
    const int64_t microBatches = static_cast<int64_t>(local.size()) / perInstance;
    double sum = 0.0;
    for (int64_t a = 0; a < microBatches; ++a) {
      for (int64_t i = 0; i < count(); ++i) {
        for (int64_t r = 0; r < perInstance; ++r) {
          sum += gathered_[static_cast<size_t>(i) * block + static_cast<size_t>(a * perInstance + r)];
        }
      }
    }
    stopGathered_ = 0;
    for (int64_t i = 0; i < count(); ++i) {
      stopGathered_ =
          std::max(stopGathered_, static_cast<int>(gathered_[(static_cast<size_t>(i) + 1) * block - 1]));
    }
    gatheredStop_ = true;
    return sum / static_cast<double>(local.size() * static_cast<size_t>(count()));
  }

  // The largest stopReasonOf(control) of the instances, the same on every
  // instance, so that all stop at the same step and report the same reason:
  // from the answers sent with the last step's losses, or, before the first
  // step, by an exchange of its own.
  int anyStop(const TrainControl& control) {
    if (!communicator_) return stopReasonOf(control);
    if (gatheredStop_) return stopGathered_;
    const float mine = static_cast<float>(stopReasonOf(control));
    std::vector<float> all(static_cast<size_t>(count()));
    communicator_->allGather(std::span<const float>(&mine, 1), all);
    return static_cast<int>(*std::max_element(all.begin(), all.end()));
  }

  // The sum of `value` over the instances (as float).
  double sum(double value) {
    if (!communicator_) return value;
    float total = static_cast<float>(value);
    communicator_->allReduceSum(std::span<float>(&total, 1));
    return total;
  }

  // The sum of `value` over the instances.
  int64_t sum(int64_t value) {
    if (!communicator_) return value;
    // Exact: counts stay far below 2^24.
    float total = static_cast<float>(value);
    communicator_->allReduceSum(std::span<float>(&total, 1));
    return static_cast<int64_t>(total);
  }

 private:
  dist::DistEnv env_;
  DeviceSpec spec_;
  std::shared_ptr<Communicator> communicator_;
  std::vector<float> mine_;      // this instance's losses of a step and its stop flag
  std::vector<float> gathered_;  // every instance's
  bool gatheredStop_ = false;    // stopGathered_ holds the flags of the last step
  int stopGathered_ = 0;
};

struct TestResult {
  double accuracy = 0.0;
  double loss = 0.0;
  int64_t globalBatch = 0;  // samples per test step over every replica
  bool hasAccuracy = false;  // the model has predictions
  bool hasLoss = false;      // the loss is reported
};

// The test set with the weights of `session`. A model with predictions (the
// MLP) gives its accuracy, batch after batch; the last batch is padded with
// sample 0 and its padding ignored. Its per-replica batch is at most the
// replica's share of the test set: more would only be padding, which at
// 1,024 replicas x testBatchSize 100 would make a step of 102,400 samples
// for a test set of 10,000 (each sample's prediction does not depend on the
// others in its batch, so the accuracy is the same). Another model gives the
// mean of its loss over the whole global batches of the test set. With
// several instances, each evaluates its part of every global test batch.
TestResult evaluate(const RunConfig& config, const SessionOptions& trainingOptions, Instances& instances,
                    const TrainingSession& training, const TensorSplit& test) {
  TestResult result;
  if (test.count == 0) return result;
  SessionOptions options = trainingOptions;
  options.enableGradientAccumulation = false;
  options.accumulationFactor = 1;
  const int64_t replicas = options.getLocalReplicationFactor();
  const int64_t globalReplicas = options.getGlobalReplicationFactor();
  int64_t batch = config.data.testBatchSize;
  if (config.model.type == kMlpModel)
    batch = std::min(batch, (test.count + globalReplicas - 1) / globalReplicas);
  RunModel model = buildRunModel(config, batch, globalReplicas);
  const bool accuracy = !model.predictions.empty();
  // An onnx model reports its test loss, and its accuracy when it has predictions.
  const bool withLoss = !accuracy || config.model.type == kOnnxModel;
  result.hasAccuracy = accuracy;
  result.hasLoss = withLoss;
  const std::string lossName = model.graph.tensor(model.loss).name;
  std::vector<std::string> outputs;
  if (accuracy) outputs.push_back(model.predictions);
  if (withLoss) outputs.push_back(lossName);
  const std::vector<std::string> inputs = model.inputs;
  const std::string labelInput = model.labels;
  InferenceSession inference(std::move(model.graph), outputs, options, instances.device());
  inference.writeWeights(training.readWeights());

  const int64_t perStep = batch * replicas;
  const int64_t globalPerStep = perStep * instances.count();
  result.globalBatch = globalPerStep;
  // The loss counts only whole batches: a padded batch's mean loss would include the padding.
  const int64_t wholeEnd = test.count / globalPerStep * globalPerStep;
  const int64_t end = accuracy ? test.count : wholeEnd;
  if (end == 0) return result;
  StepBuffers buffers(inputs, test, perStep);
  const auto labels = std::find(inputs.begin(), inputs.end(), labelInput) - inputs.begin();
  std::vector<int64_t> order(static_cast<size_t>(perStep));
  int64_t correct = 0;
  double lossSum = 0.0;
  for (int64_t globalFirst = 0; globalFirst < end; globalFirst += globalPerStep) {
    const int64_t first = globalFirst + instances.index() * perStep;
    const int64_t real = std::clamp<int64_t>(test.count - first, 0, perStep);
    for (int64_t i = 0; i < perStep; ++i) order[static_cast<size_t>(i)] = i < real ? first + i : 0;
    buffers.fill(order, 0);
    inference.run(buffers.inputs());
    if (withLoss && globalFirst < wholeEnd) {
      for (const float loss : inference.output(lossName).data) lossSum += loss;
    }
    if (!accuracy) continue;
    const HostTensor& out = inference.output(model.predictions);
    const std::vector<int32_t>& labelData = buffers.ints(static_cast<std::size_t>(labels));
    for (int64_t i = 0; i < real; ++i) {
      if (static_cast<int32_t>(out.data[static_cast<size_t>(i)]) == labelData[static_cast<size_t>(i)])
        ++correct;
    }
  }
  if (accuracy)
    result.accuracy = static_cast<double>(instances.sum(correct)) / static_cast<double>(test.count);
  // Every replica's loss is the mean over an equal micro-batch.
  if (withLoss && wholeEnd > 0) result.loss = instances.sum(lossSum) / static_cast<double>(wholeEnd / batch);
  return result;
}

// Extra checkpoint metadata the trainer writes and compares when resuming.
constexpr std::string_view kRunConfigKey = "runConfig";
constexpr std::string_view kGlobalBatchKey = "globalBatch";
// Data settings that may change between a run and its resumption: they do not
// change the order or content of the training batches (batchSize does only
// through the global batch, which is compared on its own).
constexpr std::array<std::string_view, 4> kResumableDataKeys = {"epochs", "batchSize", "testBatchSize",
                                                                "limitTestSamples"};

std::string dumped(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::map<std::string, std::string> runMetadata(const RunConfig& config, int64_t globalBatch) {
  return {{std::string(kRunConfigKey), dumped(nlohmann::json(config))},
          {std::string(kGlobalBatchKey), std::to_string(globalBatch)}};
}

// A value of a checkpoint written before enum values were PascalCase
// (docs/run-configs.md): "mlp" for "Mlp", "fashion-mnist" for "FashionMnist".
bool isOldSpelling(std::string_view key, const nlohmann::json& old, const nlohmann::json& value) {
  if (key != "type" && key != "activation" && key != "dataset") return false;
  return old.is_string() && value.is_string() &&
         sameFoldedName(old.get<std::string>(), value.get<std::string>());
}

// Warns when the checkpoint's run trained another model function or on other
// batches than this run would: resuming then does not continue that run
// exactly.
void warnAboutRunDifferences(const RunConfig& config, int64_t globalBatch, const Checkpoint& checkpoint,
                             const std::function<void(const std::string&)>& warn) {
  const auto batchEntry = checkpoint.extraMetadata.find(std::string(kGlobalBatchKey));
  if (batchEntry != checkpoint.extraMetadata.end() && batchEntry->second != std::to_string(globalBatch)) {
    warn(fmt::format(
        "the checkpoint's run had a global batch of {} samples and this run has {}; the remaining "
        "steps see other batches than the checkpoint's run would have",
        batchEntry->second, globalBatch));
  }
  const auto runEntry = checkpoint.extraMetadata.find(std::string(kRunConfigKey));
  if (runEntry == checkpoint.extraMetadata.end()) return;
  nlohmann::json before;
  try {
    before = parseJsonDocument(runEntry->second, kRunConfigKey);
  } catch (const ConfigError&) {
    warn(
        "the checkpoint's runConfig metadata is not valid JSON; the model and data settings are not "
        "compared");
    return;
  }
  const nlohmann::json after = nlohmann::json(config);
  std::vector<std::string> changed;
  for (const char* section : {"model", "data"}) {
    if (!before.contains(section) || !before[section].is_object()) continue;
    for (const auto& [key, value] : after[section].items()) {
      if (std::string_view(section) == "data" &&
          std::find(kResumableDataKeys.begin(), kResumableDataKeys.end(), key) != kResumableDataKeys.end()) {
        continue;
      }
      const auto old = before[section].find(key);
      const std::string oldText = old == before[section].end() ? "-" : dumped(*old);
      if (oldText != dumped(value) && !(old != before[section].end() && isOldSpelling(key, *old, value)))
        changed.push_back(fmt::format("/{}/{} {} -> {}", section, key, oldText, dumped(value)));
    }
  }
  if (!changed.empty()) {
    warn(
        fmt::format("the checkpoint's run had other model or data settings ({}); training goes on with this "
                    "run's",
                    fmt::join(changed, ", ")));
  }
}

// /output/onnx: the imported model with the trained values in its
// initializers. A float16 weight's float32 master ("<name>.master") is
// written where the run keeps one. Every instance takes part in reading the
// variables; the one that writes outputs writes the file.
void writeTrainedOnnx(const RunConfig& config, const std::vector<std::string>& initializers,
                      const TrainingSession& session, bool writes) {
  std::vector<OnnxTensorValues> values;
  values.reserve(initializers.size());
  for (const std::string& name : initializers) {
    const std::string master = name + ".master";
    HostTensor value =
        session.readVariable(session.graph().tryFind(master) ? master : name, RetrievalMode::OnePerGroup);
    values.push_back({name, std::move(value.shape), std::move(value.data)});
  }
  if (writes) writeOnnx(config.model.path, values, config.output.onnx);
}

}  // namespace

TrainSummary train(const RunConfig& config, const std::function<void(const TrainProgress&)>& onStep,
                   const TrainControl& control) {
  const auto called = Clock::now();
  validate(config);
  SessionOptions options = config.sessionOptions;
  std::vector<std::string> notes;
  Instances instances(config, options, notes);
  // Before anything long runs: a path that cannot be written would otherwise
  // fail only after training, losing its result.
  if (instances.writesOutput()) checkOutputs(config.output);
  const int64_t batch = config.data.batchSize;
  RunModel model = buildRunModel(config, batch, options.getGlobalReplicationFactor());
  // Planning makes no values: a model too large for the device is refused
  // here, at once, before the dataset is read or any weight is made.
  const RunPlan plan = planTraining(model.graph, model.loss, *makeOptimizer(config.optimizer), options,
                                    instances.spec());
  requireRunFits(config, plan);
  requireHostMemory(config, plan, "train");
  std::string dataNotice;
  const TensorDataset data = loadRunData(config, model, dataNotice);
  instances.checkAgree(config, data);

  const int64_t replicas = options.getLocalReplicationFactor();
  const int64_t af = options.getAccumulationFactor();
  const int64_t globalBatch = batch * options.getGlobalReplicationFactor() * af;
  const int64_t stepsPerEpoch = data.train.count / globalBatch;
  if (stepsPerEpoch == 0) {
    throw ConfigError(
        ErrorCode::InvalidData, "/data/batchSize",
        fmt::format("a global batch of batchSize {} x replicas {} x accumulationFactor {} = {} samples "
                    "is larger than the {} training samples",
                    batch, options.getGlobalReplicationFactor(), af, globalBatch, data.train.count));
  }

  // A run of the session takes batchesPerStep whole batches of the epoch.
  const int64_t batchesPerStep = config.data.batchesPerStep;
  if (stepsPerEpoch % batchesPerStep != 0) {
    throw ConfigError(
        ErrorCode::InvalidBatchesPerStep, "/data/batchesPerStep",
        fmt::format("batchesPerStep is {} but an epoch has {} batches ({} training samples / global batch {}); "
                    "it must divide them, so that every run takes whole batches of one epoch",
                    batchesPerStep, stepsPerEpoch, data.train.count, globalBatch));
  }
  if (batchesPerStep > 1 && instances.count() > 1) {
    throw ConfigError(ErrorCode::InvalidBatchesPerStep, "/data/batchesPerStep",
                      fmt::format("batchesPerStep is {} with {} instances; tessera train runs several batches "
                                  "per step on one instance only: set it to 1",
                                  batchesPerStep, instances.count()));
  }

  const std::vector<std::string> inputs = model.inputs;
  const std::vector<std::string> onnxInitializers = std::move(model.onnxInitializers);
  // The loss comes back for every batch ("All"), which the summary reports
  // batch by batch, with its /io settings.
  DataFlow dataFlow = runDataFlow(config, model);
  TrainingSession session(std::move(model.graph), model.loss, makeOptimizer(config.optimizer), options,
                          instances.device(), std::move(dataFlow));
  int64_t totalSteps = 0;
  if (__builtin_mul_overflow(stepsPerEpoch, config.data.epochs, &totalSteps)) {
    throw ConfigError(ErrorCode::ShapeTooLarge, "/data/epochs",
                      fmt::format("epochs {} x {} steps per epoch do not fit in a 64-bit step count; lower "
                                  "/data/epochs",
                                  config.data.epochs, stepsPerEpoch));
  }
  int64_t firstStep = 0;
  if (!control.resumeFrom.empty()) {
    const auto warn = [&control](const std::string& warning) {
      if (control.onWarning) control.onWarning(warning);
    };
    const Checkpoint checkpoint = readCheckpoint(control.resumeFrom, session);
    for (const CheckpointWarning& warning :
         restoreCheckpoint(session, checkpoint, control.resumeFrom, control.allowNonFinite).warnings) {
      warn(warning.text);
    }
    warnAboutRunDifferences(config, globalBatch, checkpoint, warn);
    firstStep = checkpoint.step;
    if (firstStep % batchesPerStep != 0) {
      throw ConfigError(ErrorCode::InvalidBatchesPerStep, "/data/batchesPerStep",
                        fmt::format("the checkpoint {} is at batch {}, which is not a multiple of batchesPerStep "
                                    "{}; resume with a batchesPerStep that divides it",
                                    control.resumeFrom, firstStep, batchesPerStep));
    }
    if (firstStep >= totalSteps) {
      warn(fmt::format(
          "the checkpoint is at step {}, the end of this run's {} epoch(s) x {} steps is {}; there is "
          "nothing left to train (raise /data/epochs to train on)",
          firstStep, config.data.epochs, stepsPerEpoch, totalSteps));
    }
  }

  TrainSummary summary;
  summary.firstStep = firstStep;
  summary.globalBatch = globalBatch;
  summary.trainSamples = data.train.count;
  summary.testSamples = data.test.count;
  summary.dataset = data.source;
  summary.notice = dataNotice;
  // epochs is user input: reserve for a run of sensible length only; the losses grow past it anyway.
  summary.losses.reserve(
      static_cast<size_t>(std::clamp<int64_t>(totalSteps - firstStep, 0, int64_t{1} << 20)));
  const auto checkpointNow = [&] {
    // Every instance takes part in reading the variables.
    const Checkpoint checkpoint = makeCheckpoint(session, runMetadata(config, globalBatch));
    if (instances.writesOutput()) writeCheckpointKeeping(checkpoint, config.output.checkpoint);
    summary.checkpoint = config.output.checkpoint;
    summary.checkpointStep = session.step();
  };

  // Host order [micro-batch, replica, sample]: consecutive samples of the
  // global batch fill replica 0's micro-batch first, so the global batch is
  // the same whatever the replica count. Step k's global batch is the run of
  // positions from k x globalBatch in the epoch order, which is the same on
  // every instance; instance i reads its contiguous part of it, from
  // i x stepSamples (see dataset.hpp).
  const int64_t stepSamples = batch * replicas * af;
  if (instances.count() > 1) {
    notes.push_back(fmt::format(
        "global batch {} = batchSize {} x {} replicas x accumulationFactor {}, of which each of the {} "
        "instances reads {}; {} training samples make {} steps per epoch{}",
        globalBatch, batch, options.getGlobalReplicationFactor(), af, instances.count(), stepSamples,
        data.train.count, stepsPerEpoch,
        data.train.count % globalBatch == 0
            ? std::string()
            : fmt::format(" ({} x {} = {}; the other {} samples are left out of each epoch)", stepsPerEpoch,
                          globalBatch, stepsPerEpoch * globalBatch, data.train.count % globalBatch)));
  }
  std::vector<int64_t> order(static_cast<size_t>(data.train.count));
  BatchFeed feed(inputs, data.train, stepSamples * batchesPerStep, session);
  double trainSeconds = 0.0;
  // The schedule scales the config's rate (not the session's, which a
  // checkpoint may have left scaled), from the absolute step, so a resumed
  // run continues the schedule.
  const double baseLearningRate = config.optimizer.learningRate();
  // A resumed run starts inside the epoch of its first step.
  const int64_t firstEpoch = firstStep / stepsPerEpoch;
  for (int64_t epoch = firstEpoch; epoch < config.data.epochs && !summary.interrupted && !summary.diverged;
       ++epoch) {
    fillEpochOrder(order, config.data.seed, epoch, config.data.shuffle);
    // `step` counts batches; a run takes batchesPerStep of them.
    for (int64_t step = epoch == firstEpoch ? firstStep % stepsPerEpoch : 0; step < stepsPerEpoch;
         step += batchesPerStep) {
      if (control.stopRequested) {
        summary.stopReason = instances.anyStop(control);
        if (summary.stopReason > 0) {
          summary.interrupted = true;
          break;
        }
      }
      // The optimizer changes between runs only: a run's batches share the
      // rate of its first.
      if (config.schedule.type != ScheduleType::Constant) {
        session.setLearningRate(baseLearningRate * learningRateFactor(config.schedule,
                                                                      epoch * stepsPerEpoch + step,
                                                                      stepsPerEpoch, config.data.epochs));
      }
      const auto start = Clock::now();
      if (summary.steps == 0) summary.setupSeconds = std::chrono::duration<double>(start - called).count();
      const int64_t first = instanceStepOffset(step, stepSamples, instances.count(), instances.index());
      const std::span<const StepInput> stepInputs = feed.take(order, first);
      if (step + batchesPerStep < stepsPerEpoch) {
        feed.prefetch(order, instanceStepOffset(step + batchesPerStep, stepSamples, instances.count(),
                                                instances.index()));
      }
      session.run(stepInputs);
      // One instance when batchesPerStep > 1: each batch's own mean.
      const std::vector<double> losses =
          batchesPerStep == 1 ? std::vector<double>{instances.meanLoss(session, control)}
                              : session.batchMeanLosses();
      trainSeconds += std::chrono::duration<double>(Clock::now() - start).count();
      const int64_t firstBatch = session.step() - batchesPerStep;
      for (int64_t b = 0; b < batchesPerStep; ++b) {
        const double loss = losses[static_cast<size_t>(b)];
        summary.losses.push_back(loss);
        ++summary.steps;
        if (session.batchesSkipped()[static_cast<size_t>(b)]) summary.skippedStepIndices.push_back(firstBatch + b);
        // A non-finite loss is never loss scaling's doing (the loss is not
        // scaled): the weights that produced it are lost, so stop here rather
        // than train on (and checkpoint) NaNs. The rest of its run has run,
        // but is not reported.
        if (!std::isfinite(loss)) {
          summary.diverged = true;
          summary.divergedStep = firstBatch + b;
        }
        if (onStep) {
          TrainProgress progress;
          progress.epoch = epoch;
          progress.epochs = config.data.epochs;
          progress.stepInEpoch = step + b + 1;
          progress.stepsPerEpoch = stepsPerEpoch;
          progress.loss = loss;
          progress.samplesPerSecond =
              trainSeconds > 0 ? static_cast<double>(summary.steps * globalBatch) / trainSeconds : 0.0;
          progress.automaticLossScaling = options.automaticLossScalingSettings.enabled;
          progress.lossScale = session.lossScale();
          progress.skippedSteps = static_cast<int64_t>(summary.skippedStepIndices.size());
          onStep(progress);
        }
        if (summary.diverged) break;
      }
      if (summary.diverged) break;
      const int64_t every = config.output.checkpointEvery;
      if (every > 0 && session.step() % every == 0) checkpointNow();
    }
    if (!summary.interrupted && !summary.diverged) {
      const TestResult test = evaluate(config, options, instances, session, data.test);
      summary.epochTestAccuracies.push_back(test.accuracy);
      summary.epochTestLosses.push_back(test.loss);
      summary.testGlobalBatch = test.globalBatch;
    }
  }
  // A diverged run keeps its last finite checkpoint.
  if (!config.output.checkpoint.empty() && !summary.diverged &&
      (summary.checkpoint.empty() || summary.checkpointStep != session.step())) {
    checkpointNow();
  }
  if (!config.output.onnx.empty() && !summary.interrupted)
    writeTrainedOnnx(config, onnxInitializers, session, instances.writesOutput());
  summary.finalLoss = summary.losses.empty() ? 0.0 : summary.losses.back();
  summary.samplesPerSecond =
      trainSeconds > 0 ? static_cast<double>(summary.steps * globalBatch) / trainSeconds : 0.0;
  // The last epoch's evaluation is of the final weights (a run resumed after
  // its last step runs no epoch and is evaluated here).
  if (!summary.interrupted && !summary.diverged) {
    const TestResult test = summary.epochTestAccuracies.empty()
                                ? evaluate(config, options, instances, session, data.test)
                                : TestResult{summary.epochTestAccuracies.back(),
                                             summary.epochTestLosses.back(), summary.testGlobalBatch};
    summary.testAccuracy = test.accuracy;
    summary.testLoss = test.loss;
    summary.testGlobalBatch = test.globalBatch;
  }
  summary.memory = session.memory();
  summary.lossScale = session.lossScale();
  if (instances.writesOutput()) writeTrainingProfiles(config.output, session, summary.steps);
  for (auto& [name, value] : session.readWeights()) summary.weights.emplace_back(name, std::move(value.data));
  for (const std::string& note : notes) summary.notice += (summary.notice.empty() ? "" : "; ") + note;
  return summary;
}

EvaluateSummary evaluate(const RunConfig& config, const EvaluateControl& control) {
  validate(config);
  SessionOptions options = config.sessionOptions;
  std::vector<std::string> notes;
  Instances instances(config, options, notes);
  RunModel model = buildRunModel(config, config.data.batchSize, options.getGlobalReplicationFactor());
  // The session that holds the weights is a training session, so that a
  // checkpoint restores into it exactly as when resuming; it must fit as
  // training does, and is checked before the data is read.
  const RunPlan plan = planTraining(model.graph, model.loss, *makeOptimizer(config.optimizer), options,
                                    instances.spec());
  requireRunFits(config, plan);
  requireHostMemory(config, plan, "evaluate");
  std::string dataNotice;
  const TensorDataset data = loadRunData(config, model, dataNotice);
  instances.checkAgree(config, data);
  if (data.test.count == 0) {
    throw ConfigError(ErrorCode::InvalidData, "/data/limitTestSamples",
                      fmt::format("the run has no test set to evaluate ({}); give the dataset a test split",
                                  data.source));
  }

  EvaluateSummary summary;
  summary.dataset = data.source;
  summary.testSamples = data.test.count;
  TrainingSession session(std::move(model.graph), model.loss, makeOptimizer(config.optimizer), options,
                          instances.device());
  if (!control.checkpoint.empty()) {
    const auto warn = [&control](const std::string& warning) {
      if (control.onWarning) control.onWarning(warning);
    };
    const Checkpoint checkpoint = readCheckpoint(control.checkpoint, session);
    // What differs in the optimizer (its learning rate, hyper-parameters) or
    // in where tensors live does not change what is evaluated; a value the
    // checkpoint holds in another precision does.
    for (const CheckpointWarning& warning :
         restoreCheckpoint(session, checkpoint, control.checkpoint, control.allowNonFinite).warnings) {
      if (!concernsTrainingOnly(warning.kind)) warn(warning.text);
    }
    summary.checkpoint = control.checkpoint;
    summary.checkpointStep = checkpoint.step;
  }
  const TestResult test = evaluate(config, options, instances, session, data.test);
  summary.hasAccuracy = test.hasAccuracy;
  summary.testAccuracy = test.accuracy;
  summary.hasLoss = test.hasLoss;
  summary.testLoss = test.loss;
  summary.testGlobalBatch = test.globalBatch;
  if (test.hasLoss && !test.hasAccuracy && test.globalBatch > data.test.count) {
    throw ConfigError(ErrorCode::InvalidData, "/data/testBatchSize",
                      fmt::format("a global test batch of {} samples is larger than the {} test samples, so no "
                                  "whole batch gives a test loss; lower /data/testBatchSize",
                                  test.globalBatch, data.test.count));
  }
  summary.notice = dataNotice;
  for (const std::string& note : notes) summary.notice += (summary.notice.empty() ? "" : "; ") + note;
  return summary;
}

nlohmann::json summaryJson(const EvaluateSummary& summary) {
  return nlohmann::json{
      {"testAccuracy", summary.hasAccuracy ? nlohmann::json(summary.testAccuracy) : nlohmann::json(nullptr)},
      {"testLoss", summary.hasLoss ? nlohmann::json(summary.testLoss) : nlohmann::json(nullptr)},
      {"testSamples", summary.testSamples},
      {"testGlobalBatch", summary.testGlobalBatch},
      {"dataset", summary.dataset},
      {"checkpoint", summary.checkpoint.empty() ? nlohmann::json(nullptr) : nlohmann::json(summary.checkpoint)},
      {"checkpointStep", summary.checkpointStep}};
}

nlohmann::json summaryJson(const TrainSummary& summary) {
  return nlohmann::json{{"steps", summary.steps},
                        {"losses", summary.losses},
                        // null when no step ran (a run resumed at its last step): there is no loss to report.
                        {"finalLoss", summary.steps > 0 ? nlohmann::json(summary.finalLoss) : nlohmann::json()},
                        {"testAccuracy", summary.testAccuracy},
                        {"epochTestAccuracies", summary.epochTestAccuracies},
                        {"testLoss", summary.testLoss},
                        {"epochTestLosses", summary.epochTestLosses},
                        {"samplesPerSecond", summary.samplesPerSecond},
                        {"setupSeconds", summary.setupSeconds},
                        {"globalBatch", summary.globalBatch},
                        {"testGlobalBatch", summary.testGlobalBatch},
                        {"trainSamples", summary.trainSamples},
                        {"testSamples", summary.testSamples},
                        {"dataset", summary.dataset},
                        {"firstStep", summary.firstStep},
                        {"interrupted", summary.interrupted},
                        {"diverged", summary.diverged},
                        {"divergedStep", summary.divergedStep},
                        {"stopReason", summary.stopReason},
                        {"checkpoint", summary.checkpoint},
                        {"checkpointStep", summary.checkpointStep},
                        {"lossScale", summary.lossScale},
                        {"skippedSteps", summary.skippedStepIndices.size()},
                        {"skippedStepIndices", summary.skippedStepIndices}};
}

}  // namespace tessera
