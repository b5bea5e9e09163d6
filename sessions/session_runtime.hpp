// What training and inference sessions share once their graph is final:
// the loaded executable, the host shapes of streams and variables, and the
// mapping between host tensors and the device's per-group buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/simdevice/device.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/sessions/session.hpp"
#include "tessera/lib/session_options.hpp"

namespace tessera::detail {

// How the host streams of a program go to and from the host: the batches of
// a step and each output's return type (tile set and exchange strategy
// included, All when missing) and whether its first dimension is the
// micro-batch index.
struct HostIo {
  int64_t batchesPerStep = 1;
  std::vector<AnchorReturnType> outputTypes{};
  std::vector<bool> microBatchLeading{};
};

// The host streams of a final per-replica graph (Program::hostStreams):
// every Input with its InputSettings, every output with its return type's,
// and what one replica moves per step.
std::vector<HostStream> hostStreamsOf(const Graph& graph, int64_t accumulationFactor,
                                      const std::vector<TensorId>& outputs, const HostIo& io);

class SessionRuntime {
 public:
  // `graph` is final (every transform applied). `accumulationFactor` > 1
  // means inputs have a leading micro-batch dimension on the device.
  // `outputs` are read back after every run; `io` says how the streams move.
  // `topology` (the session's, checked against the graph) becomes the
  // program's replicas.
  SessionRuntime(Graph graph, const SessionOptions& options, const ReplicaTopology& topology,
                 std::unique_ptr<Device> device, int64_t accumulationFactor,
                 const std::vector<TensorId>& outputs, const HostIo& io = {});

  const Graph& graph() const noexcept { return program().graph; }
  int64_t localReplicas() const noexcept { return program().replicas.localReplicas; }
  int64_t accumulationFactor() const noexcept { return accumulationFactor_; }

  Shape inputHostShape(std::string_view name) const;
  // Feeds the inputs (host shape [af, localReplicas, ...] with size-1
  // dimensions omitted) and runs the program once.
  void run(std::span<const StepInput> inputs);
  void setIdleWork(std::function<bool()> work) { executable_->setIdleWork(std::move(work)); }

  // Output i of the constructor's list, in host shape: the leading
  // dimensions [af, localReplicas] (size 1 omitted) for a tensor whose first
  // dimension is the micro-batch index (`microBatchLeading`), else
  // [localReplicas] (size 1 omitted), followed by the rest of its shape.
  const HostTensor& output(size_t index) const { return outputs_[index].host; }
  void setOutputMicroBatchLeading(size_t index, bool leading);

  TensorId variable(std::string_view name) const;
  HostTensor readVariable(std::string_view name, std::optional<RetrievalMode> mode) const;
  void writeVariable(std::string_view name, std::span<const float> hostData, const Shape& hostShape);
  // Writes one value into a scalar variable on every replica.
  void writeScalar(TensorId variable, double value);
  std::vector<std::pair<std::string, HostTensor>> readVariables(TensorCategory category) const;

  const MemoryReport& memory() const { return executable_->memory(); }
  const TimeReport& modelledTime() const { return executable_->modelledTime(); }

 private:
  struct Stream {
    TensorId tensor = kNoTensor;
    DType dtype = DType::Float32;
    Shape hostShape;
    std::string derivation;     // how hostShape follows from the options
    std::vector<float> device;  // [localReplicas, ...device shape]
    bool fed = false;
  };
  struct Output {
    TensorId tensor = kNoTensor;
    bool microBatchLeading = false;
    std::vector<float> groups;
    HostTensor host;
  };

  // A run of several instances: checks that the device can reach them and
  // that they all run the same options, graph and tessera version.
  void checkInstances(const Program& program, const SessionOptions& options) const;
  // The program as the device loaded it (the session keeps no copy).
  const Program& program() const noexcept { return executable_->program(); }
  Shape variableHostShape(const TensorNode& node, RetrievalMode mode) const;
  // The value variable `node` holds on local replica r, given host data in
  // one-per-group host shape.
  void replicaValue(const TensorNode& node, std::span<const float> host, int64_t localReplica,
                    std::span<float> out) const;
  void readOutputs();
  Stream& stream(std::string_view name);
  const Stream& stream(std::string_view name) const;

  std::unique_ptr<Device> device_;
  std::unique_ptr<Executable> executable_;
  int64_t accumulationFactor_ = 1;
  std::vector<Stream> streams_;
  std::vector<Output> outputs_;
};

// "[2, 4, 784]" style host shapes leave out leading dimensions of size 1.
Shape hostLeadingShape(int64_t accumulationFactor, int64_t localReplicas, const Shape& rest);

}  // namespace tessera::detail
