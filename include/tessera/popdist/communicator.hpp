// Communicator: how the instances of a multi-instance run exchange values.
//
// Each instance of a run (a process started by `tessera launch` / mpirun, see
// dist.hpp) simulates its own replicas. Collectives whose replica groups span
// instances, host reads of tensors whose shards live elsewhere and the
// start-up consistency check go through a Communicator, the same way on
// every instance and in the same order.
//
// Like the Device, the transport sits behind an interface:
// instanceCommunicator() (dist.hpp) returns the MPI one; the in-process one
// below connects threads of one process, so that multi-instance behaviour can
// be tested and debugged without MPI.
//
// Every operation is collective: all instances call it, in the same order,
// with the same sizes. An instance that does not take part within the
// communicator's timeout makes the others throw DistError(InstanceLost)
// naming it, never hang; after that every operation throws at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class Communicator {
 public:
  virtual ~Communicator() = default;

  // The number of instances, and this instance's index among them (its
  // rank), 0 .. size() - 1.
  virtual int64_t size() const noexcept = 0;
  virtual int64_t rank() const noexcept = 0;

  // Every instance passes `local` of the same length; `all` (size() times
  // that length) receives every instance's block in rank order. `local` may
  // be this instance's own block of `all`.
  virtual void allGather(std::span<const float> local, std::span<float> all) = 0;

  // Byte strings of any length, one per instance, in rank order.
  virtual std::vector<std::string> allGatherBytes(std::string_view local) = 0;

  // Replaces `values` by their sum over the instances, added in rank order,
  // so that every instance gets the same bits.
  virtual void allReduceSum(std::span<float> values) = 0;

  // Replaces every instance's `values` by those of instance `root`.
  virtual void broadcast(std::span<float> values, int64_t root) = 0;

  // Returns when every instance has called it.
  virtual void barrier() = 0;
};

// `instances` communicators of size `instances` that connect threads of this
// process: communicator i must be used by one thread only, acting as
// instance i. An operation that some instance does not join within
// `timeout` throws DistError(InstanceLost) naming the absent instances.
// ConfigError(OutOfRange) for fewer than one instance.
std::vector<std::shared_ptr<Communicator>> makeInProcessCommunicators(
    int64_t instances, std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace tessera
