// The device a session runs on. Like an Env in leveldb, the hardware sits
// behind an interface; makeSimDevice() returns the simulated multi-replica
// device, which computes the real numbers of every replica and models the
// memory that real processors would hold and the time they would take.
//
// The device never reads SessionOptions: sessions/ lowers options and graph
// into a Program (a fully transformed per-replica graph plus the replica
// topology of this instance) and hands it over.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/enum_names.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/lib/input_settings.hpp"
#include "tessera/lib/replica_grouping.hpp"
#include "tessera/lib/replica_topology.hpp"
#include "tessera/lib/tensor_location.hpp"
#include "tessera/simdevice/time_model.hpp"

namespace tessera {

class Communicator;

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

// A host stream of a program: an input the host feeds or an output the host
// gets back, with what one replica moves over the host link in a step of
// Program::batchesPerStep batches.
struct HostStream {
  std::string name;
  bool input = true;  // host to device; false: device to host
  TileSet tileSet = TileSet::Compute;
  ExchangeStrategy exchangeStrategy = ExchangeStrategy::JustInTime;
  int64_t bytesPerStep = 0;      // >= 0
  int64_t transfersPerStep = 0;  // >= 0; each pays DeviceSpec::hostLatencySeconds
  // The bytes of one transfer: what a buffer on the IO tiles holds.
  int64_t bytesPerTransfer = 0;
  // The IPU of the replica whose host link carries it and whose IO tiles hold
  // its buffers (DeviceSpec::ipusPerReplica): an input's is the IPU of the op
  // that consumes it, an output's the IPU of the op that produces it.
  int64_t ipu = 0;
  bool operator==(const HostStream&) const = default;
};

struct Program {
  Graph graph;                 // per replica; no autodiff or transform left to run
  // The run's replicas: globalReplicas (the graph's replication factor),
  // the localReplicas this device simulates from replicaOffset on. Sessions
  // derive it once (ReplicaTopology::fromOptions); the device asserts its
  // invariants (ReplicaTopology::consistent(), globalReplicas equal to the
  // graph's replication factor) and plans IPUs from its DeviceSpec.
  ReplicaTopology replicas{};
  int64_t numIOTiles = 0;      // tiles per processor set aside for IO
  // The tensors the host reads after a run besides variables, when the
  // caller knows them (sessions do). The device may then keep an
  // intermediate value that only the steps fused with its producer read in
  // scratch and never store it, or keep a float32 cast or an all-gather in
  // its operand's memory; reading such a tensor is a DeviceError. Without
  // the list every tensor stays readable.
  std::optional<std::vector<TensorId>> hostReads = std::nullopt;
  // The host streams and the loops around the graph (PopART's outer loop of
  // batchesPerStep batches, inner loop of accumulationFactor micro-batches):
  // the time model charges the streams' host transfers by their exchange
  // strategies, the memory plan their buffers on the IO tiles. The graph
  // itself is one batch, every micro-batch unrolled. No streams: no host
  // transfer is modelled.
  std::vector<HostStream> hostStreams{};
  int64_t batchesPerStep = 1;      // >= 1
  int64_t accumulationFactor = 1;  // >= 1
};

// Where bytes live on one replica.
enum class MemorySpace {
  ComputeTiles,  // on chip, the tiles that run the program
  IOTiles,       // on chip, the tiles set aside for IO (Program::numIOTiles)
  Streaming,     // off chip, streaming memory (remote buffers)
};

template <>
struct EnumNames<MemorySpace> {
  static constexpr std::string_view kTypeName = "MemorySpace";
  static constexpr std::array kNames = {
      std::pair{MemorySpace::ComputeTiles, std::string_view{"ComputeTiles"}},
      std::pair{MemorySpace::IOTiles, std::string_view{"IOTiles"}},
      std::pair{MemorySpace::Streaming, std::string_view{"Streaming"}}};
};

// The space as messages and reports name it: "compute tiles", "IO tiles",
// "streaming memory".
std::string_view spaceLabel(MemorySpace space);

// The bytes of one tensor that owns storage (in-place outputs share their
// input's), or of one remote buffer. The same on every replica: shapes are
// per replica, and a shared value still costs its bytes on each.
struct TensorMemory {
  std::string name;  // remote buffers: "remote buffer #i (what it holds)"
  TensorCategory category = TensorCategory::Activation;
  MemorySpace space = MemorySpace::ComputeTiles;
  int64_t bytes = 0;         // per replica; a shard counts its ceil(n/k) slots, a buffer all entries
  bool resident = false;     // held all step: on-chip variables and remote buffers
  bool sharded = false;      // a replica shard (the tensor has a metaShape)
  int64_t shards = 1;        // k, the number of shards of one full copy
  int64_t paddingBytes = 0;  // padding of one full copy: (k ceil(n/k) - n) elements (x entries)
  int64_t firstUse = 0;      // live over schedule positions [firstUse, lastUse]
  int64_t lastUse = 0;
  int64_t remoteBuffer = -1;  // the buffer's id when space is Streaming
  int64_t ipu = 0;            // the IPU of the replica that holds it (DeviceSpec::ipusPerReplica)
};

// The most bytes one memory space of one replica holds at any time.
struct MemoryPeak {
  int64_t bytes = 0;
  // The op during which the peak is first reached; empty when the peak is
  // the resident bytes alone (always so for streaming memory).
  std::string op;
  // The ten largest tensors live at the peak, largest first.
  std::vector<TensorMemory> largest;
};

// Bytes of one category at each space's peak.
struct CategoryMemory {
  TensorCategory category = TensorCategory::Activation;
  int64_t computeTilesBytes = 0;
  int64_t ioTilesBytes = 0;
  int64_t streamingBytes = 0;

  int64_t bytesIn(MemorySpace space) const;
};

// Bytes one IPU of one replica holds, as the hardware would. With one IPU
// per replica (DeviceSpec::ipusPerReplica 1) that is the replica's memory.
struct ReplicaMemory {
  int64_t replica = 0;              // global replica index
  int64_t ipu = 0;                  // the IPU of the replica, from 0
  int64_t variableBytes = 0;        // variables and shards resident on chip (both tile sets)
  int64_t peakActivationBytes = 0;  // largest set of live non-variable tensors on chip
  int64_t remoteBufferBytes = 0;    // streaming memory (= streamingBytes)
  int64_t computeTilesBytes = 0;    // peak on chip, compute tiles
  int64_t ioTilesBytes = 0;         // peak on chip, IO tiles
  int64_t streamingBytes = 0;       // off chip
  // Padding slots of the shards this replica holds, on chip and off chip
  // (shards of a balanced layout differ: n=30, k=4 pads shards 0 and 2).
  int64_t paddingBytes = 0;
  // Pipelining: the stashes of the activations this IPU keeps for the
  // backward pass of the micro-batches in flight (an activation made in
  // stage s and read in stage s' > s of its IPU: s' - s + 1 entries, PopART's
  // stash size). Included in computeTilesBytes and its peak, on top of the
  // live activations of one micro-batch.
  int64_t stashBytes = 0;
  MemoryPeak computeTilesPeak;
  MemoryPeak ioTilesPeak;
  MemoryPeak streamingPeak;
  std::vector<CategoryMemory> byCategory;  // every category, in enum order
  // The bytes of each category held all step (on-chip variables and remote
  // buffers), by space, in enum order: the model state of the ZeRO paper's
  // accounting (Weight, Accumulator and OptimizerState, master weights being
  // optimizer state) plus activations kept in streaming memory. A shard
  // counts its ceil(n/k) slots, padding included; a transient copy (a
  // gathered or loaded weight) is not held all step and is not counted here.
  std::vector<CategoryMemory> resident;

  const MemoryPeak& peak(MemorySpace space) const;
};

struct MemoryReport {
  // Local replicas in order, each replica's IPUs in order: one entry per
  // IPU, ipusPerReplica entries per replica.
  std::vector<ReplicaMemory> perReplica;
  int64_t ipusPerReplica = 1;
  int64_t computeTilesCapacity = 0;  // bytes per IPU
  int64_t ioTilesCapacity = 0;
  int64_t streamingCapacity = 0;
  // Every tensor that owns storage and every remote buffer, on-chip tensors
  // in schedule order first.
  std::vector<TensorMemory> tensors;
  int64_t paddingBytes = 0;  // padding held over every local replica
};

// Memory per IPU of each replica of `program` on the hardware `spec`
// describes, planned from its schedule and liveness without loading it
// (each IPU of a replica holds the tensors its ops produce, a remote buffer
// is the IPU's that loads or stores it, a variable its own op's):
//  - on-chip variables are resident all step, on their tensor's tile set;
//  - every other tensor that owns storage (inputs, constants, op outputs;
//    in-place outputs share their input's bytes) is live from its producer
//    to its last reader in schedule order;
//  - every remote buffer costs entries x its shape in streaming memory;
//  - a peak is the most bytes live at any op. float32 and int32 elements
//    are 4 bytes, float16 elements 2 (dtypeBytes).
// Throws GraphError(InvalidProgramOrder) for a cyclic graph and
// DeviceError(InvalidProgram) for a numIOTiles outside [0, tilesPerIpu) or
// an op naming an IPU at or above spec.ipusPerReplica. program.replicas
// must be consistent() (asserted).
MemoryReport planMemory(const Program& program, const DeviceSpec& spec);

// The first replica and IPU and space (compute tiles, then IO tiles, then
// streaming memory) whose peak exceeds its capacity; nullopt when the
// program fits (every IPU of every replica fits).
struct MemoryShortfall {
  int64_t replica = 0;  // global index
  int64_t ipu = 0;
  MemorySpace space = MemorySpace::ComputeTiles;
  int64_t neededBytes = 0;
  int64_t availableBytes = 0;
};
std::optional<MemoryShortfall> findShortfall(const MemoryReport& report);

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
  // A buffer that holds a variable is loaded, stored and read once for the
  // replicas that share the variable's value, which must then be given
  // equal values: readRemote returns, for each replica, the value of the
  // first replica it shares it with.
  virtual void writeRemote(int64_t buffer, int64_t entry, std::span<const float> replicas) = 0;
  virtual void readRemote(int64_t buffer, int64_t entry, std::span<float> replicas) const = 0;

  // Runs the program once. `inputs` pairs each Input tensor with its host
  // data, [localReplicas, ...shape] replica after replica.
  struct Feed {
    TensorId tensor;
    std::span<const float> data;
  };
  virtual void run(std::span<const Feed> inputs) = 0;

  // Host work for the device's own host threads to do while they wait
  // between the parallel parts of its runs, such as gathering the next
  // step's batch (TrainingSession::setIdleWork). `work` is called in short
  // pieces, each returning whether it did anything, from those threads only;
  // an empty function removes it, and the call returns once no piece of the
  // old one is running. It must not throw. A device without spare threads
  // never calls it.
  virtual void setIdleWork(std::function<bool()> work) { (void)work; }

  // The program as loaded.
  virtual const Program& program() const = 0;
  virtual const MemoryReport& memory() const = 0;
  // The modelled time of one run (see time_model.hpp).
  virtual const TimeReport& modelledTime() const = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceSpec& spec() const = 0;
  virtual ExecutionMode mode() const = 0;
  // Plans buffers and layouts once; running steps allocates nothing per op.
  // Throws DeviceError(InvalidProgram) for a program it cannot run (its
  // replica topology is not among them: a program's replicas are derived
  // and checked where it is made, and the device only asserts that they
  // are consistent() and match the graph's replication factor) and
  // DeviceError(OutOfMemory) for one that does not fit (planMemory() and
  // findShortfall() give the numbers behind the message).
  virtual std::unique_ptr<Executable> load(Program program) = 0;
  // The communicator of a multi-instance run (communicator.hpp), or null
  // when this device runs every replica of its programs itself.
  virtual Communicator* communicator() const { return nullptr; }
  // The host threads its programs run on (DeviceSpec::numThreads as
  // resolved): a host that feeds it can tell whether a thread of its own
  // would take a core from the device.
  virtual int hostThreads() const { return 1; }
};

std::unique_ptr<Device> makeSimDevice(DeviceSpec spec = {}, ExecutionMode mode = ExecutionMode::Vectorized);
// The device of one instance of a multi-instance run: it simulates the
// program's local replicas, and collectives whose replica groups span
// instances exchange the other instances' values through `communicator`
// (one instance per rank, instance i running global replicas from
// i x localReplicas), reducing every group in replica order, so that the
// results have the bits of one instance running all replicas. Loading a
// program whose replicas do not match the communicator is
// DeviceError(InvalidProgram).
std::unique_ptr<Device> makeSimDevice(DeviceSpec spec, ExecutionMode mode,
                                      std::shared_ptr<Communicator> communicator);

}  // namespace tessera
