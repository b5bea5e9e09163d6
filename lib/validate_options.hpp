// The rules of validate(SessionOptions) with an optional device, for the
// folder that owns the device spec: validate(options, device) lives beside
// DeviceSpec (simdevice/device_spec.cc) and passes on the one number of the
// device the rules need, so that the core never includes the device spec.
#pragma once

#include <cstdint>
#include <optional>

#include "tessera/lib/session_options.hpp"

namespace tessera::detail {

// Every rule in order, the first violation thrown; with `tilesPerIpu`,
// numIOTiles is also checked against the device's tile count.
void validateOptions(const SessionOptions& options, std::optional<int64_t> tilesPerIpu);

}  // namespace tessera::detail
