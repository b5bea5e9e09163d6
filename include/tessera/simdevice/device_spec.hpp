// DeviceSpec: the simulated hardware. ipusPerReplica IPU-like processors per
// replica (1 by default); defaults describe a Mk2-class IPU. Rates feed the
// time model, capacities the memory planner. All values are per processor.
#pragma once

#include <cstdint>

#include <nlohmann/json_fwd.hpp>

namespace tessera {

// The most host threads a device runs on.
inline constexpr int kMaxDeviceThreads = 1024;
// The most IPUs one replica spans.
inline constexpr int kMaxIpusPerReplica = 64;

struct SessionOptions;

struct DeviceSpec {
  // Tiles per processor, IO tiles included (SessionOptions::numIOTiles are
  // taken out of these). Must be >= 1.
  int64_t tilesPerIpu = 1472;

  // SRAM per tile in bytes. Must be >= 1.
  int64_t bytesPerTile = 624 * 1024;

  // Streaming (off-chip) memory available to each replica, in bytes.
  int64_t streamingMemoryBytes = int64_t{32} << 30;

  // Bandwidth of the links between replicas of one instance, in bytes per
  // second per direction; collectives are modelled as ring transfers on it.
  double linkBandwidthBytesPerSecond = 64e9;

  // Bandwidth between instances (slower gateway links), bytes per second.
  double interInstanceBandwidthBytesPerSecond = 12.5e9;

  // Bandwidth between a processor and its streaming memory, bytes/s.
  double streamingBandwidthBytesPerSecond = 20e9;

  // Sustained float32 arithmetic rate of one processor, in FLOP per second.
  double computeFlopsPerSecond = 62.5e12;

  // Fixed cost of starting one collective or one streaming transfer.
  double transferLatencySeconds = 2e-6;
  // IPUs per replica (PopRun's --ipus-per-replica): a replica's ops are
  // placed on them by SessionOptions::virtualGraphMode, each IPU has the
  // tiles, SRAM and rates above and its own memory plan, so a run takes
  // replicas x ipusPerReplica IPUs. More than 1 needs a virtual graph mode.
  // In [1, 64].
  int64_t ipusPerReplica = 1;
  // Bandwidth of the IPU-Links between the IPUs of one replica, in bytes
  // per second per direction: an IpuCopy moves its tensor at this rate.
  double interIpuBandwidthBytesPerSecond = 64e9;
  // Fixed cost of starting one copy between IPUs, in seconds.
  double interIpuLatencySeconds = 1e-6;

  // The host link of one processor, which carries every host stream (inputs
  // and anchors), in bytes per second: an IPU-M2000's 2 x 100 Gb/s gateway
  // links shared by its 4 processors, 6.25 GB/s each. > 0.
  double hostBandwidthBytesPerSecond = 6.25e9;

  // Fixed cost of one host transfer (one stream, one iteration). >= 0.
  double hostLatencySeconds = 5e-6;

  // Host threads that run the simulation (not a property of the simulated
  // hardware): products, elementwise chains and the other large steps are
  // split over them, and every result is the same bits at any count. 0 (the
  // default) takes TESSERA_NUM_THREADS when it is set, else every CPU of the
  // process's affinity mask; `tessera launch` sets TESSERA_NUM_THREADS so
  // that the instances on one host share its CPUs. In [0, 1024].
  int64_t numThreads = 0;

  bool operator==(const DeviceSpec&) const = default;
};

// JSON by the conventions of tessera/lib/json.hpp: every field, keys sorted on
// writing; strict reading with the ranges above.
void to_json(nlohmann::json& j, const DeviceSpec& value);
void from_json(const nlohmann::json& j, DeviceSpec& value);

// validate(options) (tessera/lib/session_options.hpp), with the tile counts
// checked against `device` too.
void validate(const SessionOptions& options, const DeviceSpec& device);

}  // namespace tessera
