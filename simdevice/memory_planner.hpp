// The memory planner: bytes per replica, per tile set and in streaming
// memory, from the schedule and liveness (the rules are those of
// planMemory() in tessera/device.hpp).
//
// The numbers are modelled from the program, not measured on the host:
// fusions and layouts chosen by the host executor change nothing here.
#pragma once

#include <cstdint>
#include <span>

#include "tessera/device.hpp"
#include "tessera/device_spec.hpp"
#include "tessera/graph.hpp"

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

}  // namespace tessera::sim
