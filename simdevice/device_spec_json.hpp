// The DeviceSpec field table (device_spec.cc; see lib/json_reader.hpp for
// the mechanism) and the tile memory a spec gives.
#pragma once

#include <cstdint>

#include "tessera/simdevice/device_spec.hpp"

namespace tessera {

template <class V>
void visitFields(V& v, DeviceSpec& value);

// SRAM of one processor split between its compute tiles and its IO tiles.
struct TileMemory {
  int64_t computeTileBytes = 0;
  int64_t ioTileBytes = 0;
};

// The split when numIOTiles of the tilesPerIpu tiles are IO tiles. Throws
// ConfigError(IOTilesExceedTiles) unless 0 <= numIOTiles < tilesPerIpu, and
// ConfigError(InvalidDeviceSpec) when the total does not fit in 64 bits.
TileMemory tileMemory(const DeviceSpec& device, int64_t numIOTiles);

}  // namespace tessera
