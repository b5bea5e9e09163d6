#include "location_support.hpp"

#include <string>

#include <fmt/format.h>

#include "tessera/error.hpp"
#include "tessera/location_resolver.hpp"

namespace tessera::detail {
namespace {

[[noreturn]] void unsupported(const ResolvedLocation& resolved, std::string_view field, std::string_view tensor,
                              std::string_view what, std::string_view fix) {
  throw ConfigError(ErrorCode::UnsupportedCombination, fmt::format("{}/{}", resolved.decidedBy, field),
                    fmt::format("{}: {} is not supported by sessions yet; {}", tensor, what, fix));
}

void checkPlacement(const ResolvedLocation& resolved, std::string_view tensor) {
  const TensorLocation& location = resolved.location;
  if (location.storage == TensorStorage::OffChip) {
    unsupported(resolved, "storage", tensor, "storage OffChip (streaming memory)", "set storage to OnChip");
  }
  if (location.loadTileSet == TileSet::IO) {
    unsupported(resolved, "loadTileSet", tensor, "loadTileSet IO", "set loadTileSet to Compute");
  }
  if (location.storageTileSet == TileSet::IO) {
    unsupported(resolved, "storageTileSet", tensor, "storageTileSet IO", "set storageTileSet to Compute");
  }
}

bool sharded(const TensorLocation& location) {
  return location.replicatedTensorSharding == ReplicatedTensorSharding::On;
}

}  // namespace

void checkLocationsSupported(const Graph& graph, const SessionOptions& options, bool training) {
  const int64_t replicas = graph.replicationFactor();
  for (const TensorNode& node : graph.tensors()) {
    if (node.producer == kNoOp || graph.op(node.producer).kind != OpKind::Variable) continue;
    if (node.category != TensorCategory::Weight || node.dtype != DType::Float32) continue;
    const int64_t elements = numElements(node.metaShape.empty() ? node.shape : node.metaShape);
    const ResolvedLocation weight = resolveTensorLocation(options, {node.name, TensorCategory::Weight, elements});
    // A variable sharded or kept in a remote buffer by hand (PopXL style)
    // says where it lives itself, as a location attribute on its op would;
    // the options' category settings then do not decide its placement.
    const bool weightSharded = !node.metaShape.empty();
    if (node.remoteBuffer >= 0) continue;
    if (!weightSharded) {
      checkPlacement(weight, node.name);
      if (sharded(weight.location)) {
        unsupported(weight, "replicatedTensorSharding", node.name,
                    fmt::format("RTS On for a variable built unsharded ({} elements)", elements),
                    "build it with ops::replicaShardedVariable (buildMlp does so when given the options) or set "
                    "replicatedTensorSharding Off");
      }
    }
    if (!training) continue;
    // Optimizer state and accumulators are created like their weight (as it
    // is built); their own settings must agree. Their names are not known
    // yet, so overrides by name do not apply to them here (the empty name
    // matches none).
    const auto linked = [&](TensorCategory category, std::string_view what) {
      const ResolvedLocation state = resolveTensorLocation(options, {std::string{}, category, elements});
      checkPlacement(state, fmt::format("{} of {}", what, node.name));
      if (sharded(state.location) != weightSharded ||
          (weightSharded && state.location.shardingDomain.groupSize(replicas) != node.shardCount)) {
        unsupported(state, "replicatedTensorSharding", fmt::format("{} of {}", what, node.name),
                    fmt::format("sharding it {} while its weight is {}", sharded(state.location) ? "On" : "Off",
                                weightSharded ? fmt::format("sharded over {} replicas", node.shardCount)
                                              : std::string("not sharded")),
                    "give the weight, optimizer state and accumulator settings the same replicatedTensorSharding "
                    "and shardingDomain");
      }
    };
    linked(TensorCategory::OptimizerState, "the optimizer state");
    if (options.enableGradientAccumulation && options.accumulationFactor > 1) {
      linked(TensorCategory::Accumulator, "the gradient accumulator");
    }
  }
  // Activations have no names before compiling: their category setting
  // decides for all of them.
  const ResolvedLocation activations =
      resolveTensorLocation(options, {std::string{}, TensorCategory::Activation, int64_t{1} << 40});
  checkPlacement(activations, "activations");
}

}  // namespace tessera::detail
