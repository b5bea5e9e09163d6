// The time model (the rules are in tessera/time_model.hpp).
#pragma once

#include <span>

#include "layouts.hpp"
#include "tessera/device_spec.hpp"
#include "tessera/graph.hpp"
#include "tessera/time_model.hpp"

namespace tessera::sim {

// `schedule` is graph.schedule(); `topology` says which replicas form an
// instance (localReplicas consecutive ones). Throws
// DeviceError(InvalidProgram) when topology.localReplicas is below 1.
TimeReport modelTime(const Graph& graph, const LocalTopology& topology, std::span<const OpId> schedule,
                     const DeviceSpec& spec);

}  // namespace tessera::sim
