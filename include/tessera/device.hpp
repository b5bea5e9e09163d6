// The device a session runs on. Like an Env in leveldb, the hardware sits
// behind an interface; makeSimDevice() returns the simulated multi-replica
// device, which computes the real numbers of every replica and accounts the
// memory that real processors would hold.
//
// The device never reads SessionOptions: sessions/ lowers options and graph
// into a Program (a fully transformed per-replica graph plus the replica
// topology of this instance) and hands it over.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/device_spec.hpp"
#include "tessera/enum_names.hpp"
#include "tessera/graph.hpp"
#include "tessera/replica_grouping.hpp"

namespace tessera {

enum class ExecutionMode {
  // Every buffer stores one value per group of its replica layout and every
  // op runs once over the stacked groups: the cost of simulating R replicas
  // is close to the cost of the arithmetic alone.
  Vectorized,
  // Every replica is computed separately (every layout is per replica). For
  // tests: both modes must give the same numbers.
  PerReplicaReference,
};

template <>
struct EnumNames<ExecutionMode> {
  static constexpr std::string_view kTypeName = "ExecutionMode";
  static constexpr std::array kNames = {
      std::pair{ExecutionMode::Vectorized, std::string_view{"Vectorized"}},
      std::pair{ExecutionMode::PerReplicaReference, std::string_view{"PerReplicaReference"}}};
};

struct Program {
  Graph graph;                 // per replica; no autodiff or transform left to run
  int64_t localReplicas = 1;   // replicas this device simulates
  int64_t globalReplicas = 1;  // replicas of the whole run (>= localReplicas)
  int64_t replicaOffset = 0;   // global index of local replica 0
  int64_t numIOTiles = 0;      // tiles per processor set aside for IO
};

// Bytes one replica holds, as the hardware would.
struct ReplicaMemory {
  int64_t replica = 0;  // global replica index
  int64_t variableBytes = 0;       // variables and shards resident on chip
  int64_t peakActivationBytes = 0;  // largest set of live non-variable tensors
  int64_t remoteBufferBytes = 0;   // streaming memory
  int64_t computeTilesBytes = 0;   // on chip, compute tiles
  int64_t ioTilesBytes = 0;        // on chip, IO tiles
  int64_t streamingBytes = 0;      // off chip
};

struct MemoryReport {
  std::vector<ReplicaMemory> perReplica;
  int64_t computeTilesCapacity = 0;  // bytes per replica
  int64_t ioTilesCapacity = 0;
  int64_t streamingCapacity = 0;
};

// A Program loaded on a device, ready to run steps.
class Executable {
 public:
  virtual ~Executable() = default;

  // The replica layout of a tensor's buffer: replicas of one group hold one
  // value. Host reads and writes address the groups of this layout.
  virtual ReplicaGrouping layout(TensorId tensor) const = 0;

  // Values of every group of layout(tensor), group after group
  // (numGroups * elements). Int32 tensors travel as exact floats.
  // DeviceError(InvalidProgram) on a wrong size or an unknown tensor.
  virtual void write(TensorId tensor, std::span<const float> groups) = 0;
  virtual void read(TensorId tensor, std::span<float> groups) const = 0;

  // Per-replica contents of a remote buffer entry ([localReplicas, ...]).
  virtual void writeRemote(int64_t buffer, int64_t entry, std::span<const float> replicas) = 0;
  virtual void readRemote(int64_t buffer, int64_t entry, std::span<float> replicas) const = 0;

  // Runs the program once. `inputs` pairs each Input tensor with its host
  // data, [localReplicas, ...shape] replica after replica.
  struct Feed {
    TensorId tensor;
    std::span<const float> data;
  };
  virtual void run(std::span<const Feed> inputs) = 0;

  virtual const MemoryReport& memory() const = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceSpec& spec() const = 0;
  virtual ExecutionMode mode() const = 0;
  // Plans buffers and layouts once; running steps allocates nothing per op.
  // Throws DeviceError(InvalidProgram) for a program it cannot run.
  virtual std::unique_ptr<Executable> load(Program program) = 0;
};

std::unique_ptr<Device> makeSimDevice(DeviceSpec spec = {}, ExecutionMode mode = ExecutionMode::Vectorized);

}  // namespace tessera
