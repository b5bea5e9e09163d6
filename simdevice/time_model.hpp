// The time model (the rules are in tessera/simdevice/time_model.hpp).
#pragma once

#include <span>

#include "layouts.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/simdevice/time_model.hpp"

namespace tessera::sim {

// `schedule` is graph.schedule(); `topology` says which replicas form an
// instance (localReplicas consecutive ones); it must be consistent()
// (asserted).
TimeReport modelTime(const Graph& graph, const ReplicaTopology& topology, std::span<const OpId> schedule,
                     const DeviceSpec& spec);

// The strategy a host stream is modelled with: an overlap on the compute
// tiles overlaps nothing (JustInTime), and OverlapLoops without an outer
// loop (batchesPerStep 1) is OverlapInnerLoop.
ExchangeStrategy appliedStrategy(const HostStream& stream, int64_t batchesPerStep);
// The buffers a stream on the IO tiles holds at once: 1 for JustInTime, 2
// (double buffering) for OverlapInnerLoop, 3 for OverlapLoops (one more
// across the outer loop's boundary).
int64_t inFlightBuffers(ExchangeStrategy applied);
// DeviceError(InvalidHostStream) for a stream the device cannot model.
void checkHostStreams(const Program& program, const DeviceSpec& spec);

// Adds the host streams of `program` to a report of its graph (the Host
// streams section of tessera/simdevice/time_model.hpp): the step time with the host
// transfers, the streams, and their HostIO ops. Throws
// DeviceError(InvalidHostStream) for a stream it cannot model.
void addHostStreams(TimeReport& report, const Program& program, const DeviceSpec& spec);

}  // namespace tessera::sim
