// The loaded program of the simulated device.
//
// Loading plans everything once: the schedule, a replica layout per tensor
// (layouts.hpp), one arena holding every buffer (numGroups x elements floats
// per storage; in-place outputs alias their input), the remote buffers, and
// one precompiled Step per op (kernels.hpp). Two rewrites make the
// vectorized plan cheap:
//  - a rank-2 Transpose read only by MatMuls is not materialised: the GEMMs
//    read its input transposed;
//  - MatMul(Transpose(x), dy) whose only reader is an AllReduce (Sum or
//    Mean) over groups of consecutive replicas, with x and dy per replica,
//    becomes one GEMM per group over the concatenated batch
//    (sum_r x_r^T dy_r = X^T DY) that writes the reduced value directly;
//    likewise a ReduceScatter (the gradient of a replica-sharded weight):
//    without padding the group's shards, one after the other, are the
//    reduced value; with padding each shard takes its part of the group's
//    product. No per-replica product is stored or computed, so the host
//    cost of the gradient is that of one replica's whatever the replica
//    count.
// Consecutive elementwise steps over the same flat range of elements are then
// fused into one chain that runs slice by slice (kernels.hpp), so a chain
// such as an optimizer update streams each buffer once instead of once per
// op. run() executes the steps and allocates nothing.
//
// A program of one instance of several (replicas.distributed())
// needs the device's communicator for collectives whose groups span
// instances: their inputs are exchanged first (collectives.hpp), and the
// exchanges of collectives that do not depend on each other are sent as one
// message. The fused GEMM then runs over the whole group's exchanged x and
// dy, as one instance would run it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include "collectives.hpp"
#include "kernels.hpp"
#include "layouts.hpp"
#include "tessera/simdevice/device.hpp"

namespace tessera::sim {

// An allocator of cache-line (64-byte) aligned memory.
template <class T>
struct CacheAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  CacheAligned() = default;
  template <class U>
  explicit CacheAligned(const CacheAligned<U>& /*other*/) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, std::size_t /*n*/) noexcept { ::operator delete(p, kAlignment); }
  friend bool operator==(const CacheAligned& /*a*/, const CacheAligned& /*b*/) { return true; }
};
using CacheAlignedFloats = std::vector<float, CacheAligned<float>>;

// What the planner did; for tests and profiles.
struct PlanStats {
  int64_t steps = 0;
  int64_t kernelRuns = 0;           // kernel calls per run() over all steps (runs of groups)
  int64_t foldedTransposes = 0;     // Transposes read in place by GEMMs
  int64_t fusedGemmAllReduces = 0;  // gradient GEMMs fused with their all-reduce or reduce-scatter
  int64_t arenaFloats = 0;          // host floats of every planned buffer
  int64_t fusedChains = 0;          // chains of elementwise steps run as one pass
  int64_t chainedSteps = 0;         // steps inside those chains
  int64_t scratchValues = 0;        // chain intermediates kept in scratch, never stored
  int64_t elidedCopies = 0;         // chain copies whose source was written in their place
  int64_t exchanges = 0;            // messages to the other instances per run() (several collectives each)
  int64_t remoteAliases = 0;        // loaded values kept in their remote entry (no copy)
  int64_t castAliases = 0;          // float32 casts that share their input's memory (no copy)
  int64_t gatherAliases = 0;        // all-gathers that are their shards' memory (no copy)
  int64_t reshapeAliases = 0;       // reshapes that share their input's memory (no copy)
  int64_t sunkSteps = 0;            // elementwise steps moved down next to the chain that reads them
  int64_t besideGroups = 0;         // groups of independent steps run side by side, one per thread
  int64_t besideSteps = 0;          // steps in those groups
};

class SimExecutable final : public Executable {
 public:
  // Throws DeviceError(InvalidProgram) for a program this device cannot run.
  // A program of several instances needs their `communicator`.
  SimExecutable(Program program, const DeviceSpec& spec, ExecutionMode mode,
                std::shared_ptr<Communicator> communicator = nullptr);

  ReplicaGrouping layout(TensorId tensor) const override;
  void write(TensorId tensor, std::span<const float> groups) override;
  void read(TensorId tensor, std::span<float> groups) const override;
  void writeRemote(int64_t buffer, int64_t entry, std::span<const float> replicas) override;
  void readRemote(int64_t buffer, int64_t entry, std::span<float> replicas) const override;
  void run(std::span<const Feed> inputs) override;
  void setIdleWork(std::function<bool()> work) override { pool_->setIdleWork(std::move(work)); }
  const Program& program() const override { return program_; }
  const MemoryReport& memory() const override { return memory_; }
  const TimeReport& modelledTime() const override { return time_; }

  const PlanStats& stats() const noexcept { return stats_; }
  const Graph& graph() const noexcept { return program_.graph; }
  // Host threads the steps run on (DeviceSpec::numThreads).
  int threads() const noexcept { return pool_->threads(); }

 private:
  friend class StepPlanner;

  void checkProgram() const;
  void planFusions();
  // True when a reduce-scatter over `grouping` into the layout `scattered`
  // can be written by one GEMM per group: groups of consecutive replicas on
  // this instance and one value per replica in replica order. Without
  // padding the group's shards in order are the whole reduced value; with
  // padding each shard takes its part of the group's product.
  bool scatteredByGroup(const ReplicaGrouping& grouping, const ReplicaGrouping& scattered) const;
  // A RemoteLoad whose value is laid out like its entry (one value per
  // replica, in order) can live in the entry itself: when the value is only
  // read while the entry is not stored to, or when it is updated in place
  // and then stored back as the entry's next transfer. The load (and the
  // store) then move nothing.
  void planRemoteAliases();
  // Outputs that are their operand's memory as it is, so the op moves
  // nothing: a cast to float32 of a value held in float slots (float16,
  // int32, bool, float32), laid out alike; a reshape, laid out alike; an
  // all-gather over groups of consecutive replicas on one instance whose
  // shards (no padding) are stored in replica order.
  // Only when the host reads are known and the host does not read the
  // output, the output is never written in place, and nothing writes the
  // operand's memory from the op until the output's last reader.
  void planSharedOutputs();
  // Per tensor: is it the storage of a tensor in Program::hostReads (which
  // must be set)?
  std::vector<char> hostReadStorages() const;
  // Where a reader of a value reads it: its own position, or that of the
  // step that computes it (fused products, folded transposes).
  int64_t readPosition(OpId reader) const;
  void planBuffers();
  void initialiseValues();
  void planSteps();
  void planStep(OpId id);
  // Moves each flat elementwise step down to just before the first later
  // step (at most 32 on) that reads its output, when that step is flat over
  // as many elements, a step that ends chains lies between them and nothing
  // between them touches the step's operands or output: the two then run in
  // one chain. Reordering changes no value.
  void sinkIntoChains();
  // Runs adjacent steps that share no written memory and would each run on
  // one thread side by side, up to one per thread, as one job of the pool
  // (Step::beside). Each computes exactly what it computes alone.
  void planSideBySide();
  void fuseChains();
  // Per tensor: may its value live in a chain's scratch (see
  // Program::hostReads)? Empty when nothing may.
  std::vector<char> scratchableValues() const;
  // Moves the values of a fused chain that only its later steps read into
  // scratch slots; returns the slots the chain needs.
  int32_t planChainScratch(Step& fusedStep, const std::vector<char>& scratchable);
  // Adds the step that gathers every replica's value of `tensor` from all
  // instances before `op`; returns where the values will be.
  const float* exchanged(TensorId tensor, const OpNode& op);
  // Moves each cross-instance collective down to the first step that needs
  // its result or changes its input, and merges the exchanges that meet
  // there into one message: a step then waits for the other instances once
  // or twice instead of once per collective. The arithmetic is unchanged.
  void batchExchanges();
  // The storage whose memory holds t: its storage, or the one whose memory
  // that storage is (planSharedOutputs).
  TensorId memoryOf(TensorId t) const;
  // The storages the steps of op `id` read and write.
  void accesses(OpId id, std::vector<TensorId>& reads, std::vector<TensorId>& writes) const;
  // Host-visible storage of a tensor, or a DeviceError naming it.
  std::span<float> hostBuffer(TensorId tensor, std::string_view who) const;
  float* remoteEntry(int64_t buffer, int64_t entry, std::string_view who) const;

  Program program_;
  ExecutionMode mode_;
  std::shared_ptr<Communicator> communicator_;
  std::vector<OpId> schedule_;
  std::vector<int64_t> position_;             // of each op in the schedule
  std::vector<ReplicaGrouping> layouts_;      // per tensor
  std::vector<ReplicaGrouping> bufferLayouts_;  // per remote buffer: replicas whose entries are equal
  std::vector<int64_t> offset_;               // per storage tensor; -1 when not materialised
  std::vector<char> foldedTranspose_;         // per op
  std::vector<OpId> fusedInto_;               // per MatMul op: the AllReduce computing it, else kNoOp
  std::vector<std::pair<int64_t, int64_t>> aliasOf_;  // per storage: the remote (buffer, entry) it lives in
  std::vector<char> elided_;  // per op: a transfer, cast or gather the aliases make unnecessary
  std::vector<TensorId> sharedWith_;          // per tensor: whose memory it is (planSharedOutputs), or -1
  std::vector<std::vector<int64_t>> writes_;  // per storage: schedule positions of in-place writes
  // Every buffer starts on a cache line (planned offsets are multiples of 16
  // floats), so that vector loads and stores never straddle two lines.
  CacheAlignedFloats arena_;
  std::vector<int64_t> remoteBase_;  // per remote buffer
  CacheAlignedFloats gemmScratch_;
  std::vector<double> sumScratch_;  // GemmScratch::sums
  CacheAlignedFloats chainScratch_;  // slots of chain intermediates (kChainSlice floats each)
  GemmScratch scratch_;
  // The host threads of run(); steps point to it.
  std::unique_ptr<WorkerPool> pool_;
  std::vector<Step> steps_;
  std::vector<std::unique_ptr<Exchange>> exchanges_;  // of cross-instance collectives
  std::vector<int32_t> inputSlot_;  // per tensor: index into feeds_, -1 for non-inputs
  std::vector<std::span<const float>> feeds_;
  std::vector<char> fed_;
  MemoryReport memory_;
  TimeReport time_;
  PlanStats stats_;
};

}  // namespace tessera::sim
