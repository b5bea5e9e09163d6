// Which resolved tensor locations a session can honour today, checked before
// compiling so that no setting is silently ignored.
//
// Supported: on-chip tensors on compute tiles; replicated tensor sharding of
// weights built as replica-sharded variables (e.g. by buildMlp with options),
// whose optimizer state and gradient accumulators are then sharded alike.
// Everything else that a setting requests — streaming memory, IO tiles, RTS
// of a weight built as a plain variable, optimizer state or accumulators
// sharded differently from their weight — is ConfigError
// (UnsupportedCombination) naming the deciding setting.
#pragma once

#include "tessera/graph.hpp"
#include "tessera/session_options.hpp"

namespace tessera::detail {

void checkLocationsSupported(const Graph& graph, const SessionOptions& options, bool training);

}  // namespace tessera::detail
