// Memory per replica, as the hardware would hold it.
//
// The numbers are modelled from the program, not measured on the host: a
// shared buffer costs its bytes on every replica, a shard its ceil(n/k)
// elements, and fusions done by the host executor change nothing here.
//  - variables: every Variable that is not kept in a remote buffer;
//  - activations: every other tensor that owns storage (inputs, constants,
//    op outputs; in-place outputs share their input's bytes), live from its
//    producer to its last reader in schedule order; the peak is the largest
//    sum of live bytes at any op;
//  - streaming memory: every remote buffer, entries x shape;
//  - everything on chip is counted on the compute tiles for now.
#pragma once

#include <cstdint>
#include <span>

#include "tessera/device.hpp"
#include "tessera/device_spec.hpp"
#include "tessera/graph.hpp"

namespace tessera::sim {

// Bytes of one element of a tensor: float32 and int32 are both 4 bytes.
inline constexpr int64_t kBytesPerElement = 4;

MemoryReport accountMemory(const Program& program, std::span<const OpId> schedule, const DeviceSpec& spec);

}  // namespace tessera::sim
