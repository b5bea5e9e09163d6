// The DeviceSpec field table with its ranges, its JSON, and the session
// options checked against a device.
#include "device_spec_json.hpp"

#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "json_reader.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/session_options.hpp"
#include "validate_options.hpp"

namespace tessera {
namespace {

bool productFits(int64_t a, int64_t b) noexcept {
  int64_t product = 0;
  return !__builtin_mul_overflow(a, b, &product);
}

}  // namespace

template <class V>
void visitFields(V& v, DeviceSpec& value) {
  v.field(
      "tilesPerIpu", value.tilesPerIpu,
      {.min = 1,
       .doc = "Tiles per processor, IO tiles included (SessionOptions numIOTiles are taken out of these). "
              "Must be >= 1."});
  v.field("bytesPerTile", value.bytesPerTile, {.min = 1, .doc = "SRAM per tile in bytes. Must be >= 1."});
  v.field(
      "streamingMemoryBytes", value.streamingMemoryBytes,
      {.min = 0, .doc = "Streaming (off-chip) memory available to each replica, in bytes. Must be >= 0."});
  v.field(
      "linkBandwidthBytesPerSecond", value.linkBandwidthBytesPerSecond,
      {.exclusiveMin = 0,
       .doc = "Bandwidth of the links between replicas of one instance, in bytes per second per direction; "
              "collectives are modelled as ring transfers on it. Must be > 0."});
  v.field("interInstanceBandwidthBytesPerSecond", value.interInstanceBandwidthBytesPerSecond,
          {.exclusiveMin = 0,
           .doc = "Bandwidth between instances (slower gateway links), bytes per second. Must be > 0."});
  v.field("streamingBandwidthBytesPerSecond", value.streamingBandwidthBytesPerSecond,
          {.exclusiveMin = 0,
           .doc = "Bandwidth between a processor and its streaming memory, bytes per second. Must be > 0."});
  v.field("computeFlopsPerSecond", value.computeFlopsPerSecond,
          {.exclusiveMin = 0,
           .doc = "Sustained float32 arithmetic rate of one processor, in FLOP per second. Must be > 0."});
  v.field(
      "transferLatencySeconds", value.transferLatencySeconds,
      {.min = 0,
       .doc = "Fixed cost of starting one collective or one streaming transfer, in seconds. Must be >= 0."});
  v.field("ipusPerReplica", value.ipusPerReplica,
          {.min = 1,
           .max = kMaxIpusPerReplica,
           .doc = "IPUs per replica (PopRun's --ipus-per-replica); a run takes replicas x ipusPerReplica IPUs, "
                  "each with its own memory plan. More than 1 needs /sessionOptions/virtualGraphMode Manual or "
                  "Auto. In [1, 64]."});
  v.field("interIpuBandwidthBytesPerSecond", value.interIpuBandwidthBytesPerSecond,
          {.exclusiveMin = 0,
           .doc = "Bandwidth of the IPU-Links between the IPUs of one replica, bytes per second per direction; "
                  "each IpuCopy moves its tensor at this rate. Must be > 0."});
  v.field("interIpuLatencySeconds", value.interIpuLatencySeconds,
          {.min = 0, .doc = "Fixed cost of starting one copy between IPUs, in seconds. Must be >= 0."});
  v.field("hostBandwidthBytesPerSecond", value.hostBandwidthBytesPerSecond,
          {.exclusiveMin = 0,
           .doc = "The host link of one processor, which carries every host stream (inputs and anchors), in "
                  "bytes per second; the default is an IPU-M2000's 2 x 100 Gb/s gateway links shared by its "
                  "4 processors. Must be > 0."});
  v.field("hostLatencySeconds", value.hostLatencySeconds,
          {.min = 0, .doc = "Fixed cost of one host transfer (one stream, one iteration), in seconds. Must be >= 0."});
  v.field(
      "numThreads", value.numThreads,
      {.min = 0,
       .max = kMaxDeviceThreads,
       .doc = "Host threads that run the simulation (not a property of the simulated hardware); every result "
              "is the same bits at any count. 0: TESSERA_NUM_THREADS when set, else every CPU of the "
              "process's affinity mask (tessera launch divides them among the instances of a host). In "
              "[0, 1024]."});
  v.rule([&value](const jsonio::RuleSite& site) {
    if (productFits(value.tilesPerIpu, value.bytesPerTile)) return;
    const std::string path = site.path("bytesPerTile");
    throw ConfigError(ErrorCode::InvalidDeviceSpec, path,
                      fmt::format("{} tiles of {} bytes do not fit in a 64-bit byte count; use realistic "
                                  "capacities (the defaults describe a Mk2-class IPU){}",
                                  value.tilesPerIpu, value.bytesPerTile, site.origin(path)));
  });
}

TESSERA_INSTANTIATE_VISIT_FIELDS(DeviceSpec);

TileMemory tileMemory(const DeviceSpec& device, int64_t numIOTiles) {
  if (numIOTiles < 0 || numIOTiles >= device.tilesPerIpu) {
    throw ConfigError(ErrorCode::IOTilesExceedTiles, fmt::format("{}/numIOTiles", kSessionOptionsPath),
                      fmt::format("numIOTiles is {}; a device with tilesPerIpu {} needs it in [0, {})",
                                  numIOTiles, device.tilesPerIpu, device.tilesPerIpu));
  }
  if (!productFits(device.tilesPerIpu, device.bytesPerTile)) {
    throw ConfigError(ErrorCode::InvalidDeviceSpec, "/device/bytesPerTile",
                      fmt::format("{} tiles of {} bytes do not fit in a 64-bit byte count",
                                  device.tilesPerIpu, device.bytesPerTile));
  }
  return {(device.tilesPerIpu - numIOTiles) * device.bytesPerTile, numIOTiles * device.bytesPerTile};
}

void validate(const SessionOptions& options, const DeviceSpec& device) {
  detail::validateOptions(options, device.tilesPerIpu);
  // PopART places a replica's ops on several IPUs only through virtual
  // graphs; with them Off, tessera refuses the IPUs it would leave idle.
  if (device.ipusPerReplica > 1 && options.virtualGraphMode == VirtualGraphMode::Off) {
    throw ConfigError(ErrorCode::IpusPerReplicaWithoutVirtualGraphs, "/device/ipusPerReplica",
                      fmt::format("ipusPerReplica is {} but {}/virtualGraphMode is Off, so every op would run on "
                                  "IPU 0; set virtualGraphMode to Manual (ops name their IPU) or Auto, or "
                                  "ipusPerReplica to 1",
                                  device.ipusPerReplica, kSessionOptionsPath));
  }
}

void to_json(nlohmann::json& j, const DeviceSpec& value) { j = jsonio::writeValue(value); }
void from_json(const nlohmann::json& j, DeviceSpec& value) {
  value = jsonio::readValue<DeviceSpec>(j, {}, jsonio::SourceMap{});
}

}  // namespace tessera
