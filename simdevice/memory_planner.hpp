// The memory planner: bytes per replica, per tile set and in streaming
// memory, from the schedule and liveness (the rules are those of
// planMemory() in tessera/simdevice/device.hpp).
//
// The numbers are modelled from the program, not measured on the host:
// fusions and layouts chosen by the host executor change nothing here.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tessera/simdevice/device.hpp"
#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/graph.hpp"

namespace tessera::sim {

// Every tensor and remote buffer takes dtypeBytes(dtype) bytes an element
// (float16 2, float32 and int32 4), as the hardware holds it, whatever the
// host arena keeps (float slots for every dtype).

// How many tensors a peak lists (and an out-of-memory error names).
inline constexpr std::size_t kLargestAtPeak = 10;

// `schedule` is program.graph.schedule().
MemoryReport planMemory(const Program& program, std::span<const OpId> schedule, const DeviceSpec& spec);

// Throws DeviceError(OutOfMemory) naming the replica, the space, the bytes
// needed and available, and the largest tensors live at the peak, when
// findShortfall(report) finds one.
void requireFits(const MemoryReport& report);

// The host memory a SimExecutable of `program` allocates for its buffers, in
// bytes, computed from the plan without allocating: every tensor that owns
// storage once per group of its replica layout (layouts.hpp: a weight all
// replicas hold alike once, an activation once per local replica), 4 bytes
// an element whatever its dtype (the arena keeps float slots), then every
// remote buffer (entries x local replicas). An upper bound: the transposes
// the GEMMs read in place, the products fused with their all-reduce and the
// aliases the executor plans take nothing.
struct HostBuffer {
  std::string name;
  TensorCategory category = TensorCategory::Activation;
  int64_t bytes = 0;
};
struct HostMemoryEstimate {
  int64_t bytes = 0;                    // saturates at INT64_MAX
  std::array<int64_t, 4> byCategory{};  // indexed by TensorCategory (a remote buffer as a variable it holds)
  int64_t remoteBytes = 0;              // remote buffers (OffChip variables), part of byCategory
  std::vector<HostBuffer> largest;      // at most kLargestAtPeak, largest first
};
HostMemoryEstimate estimateHostMemory(const Program& program);

}  // namespace tessera::sim
