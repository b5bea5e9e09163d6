// Uses tessera as a library: describes replication and replicated tensor
// sharding in code, the way PopART option code does, has tessera check the
// options, and asks where a weight of 30 elements ([5, 2, 3]) lives and how it
// is split over the replicas.
#include <cstdint>
#include <iostream>

#include <tessera/lib/error.hpp>
#include <tessera/lib/location_resolver.hpp>
#include <tessera/lib/session_options.hpp>
#include <tessera/lib/shard_layout.hpp>
#include <tessera/lib/tensor_location.hpp>

int main() {
  tessera::SessionOptions opts;
  opts.enableReplicatedGraphs = true;
  opts.replicatedGraphCount = 4;
  // Shard weights and their optimizer state over the replicas; the default
  // threshold (8192 elements) would keep a small weight whole.
  opts.weightTensorLocationSettings.location.replicatedTensorSharding = tessera::ReplicatedTensorSharding::On;
  opts.weightTensorLocationSettings.minElementsForReplicatedTensorSharding = 4;
  opts.optimizerStateTensorLocationSettings.location.replicatedTensorSharding =
      tessera::ReplicatedTensorSharding::On;
  opts.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = 4;

  try {
    tessera::validate(opts);

    const tessera::TensorInfo weight{"W0", tessera::TensorCategory::Weight, 30};
    const tessera::ResolvedLocation resolved = tessera::resolveTensorLocation(opts, weight);
    std::cout << weight.name << ": " << resolved.location.str() << "\n"
              << "  because " << resolved.reason() << "\n";

    if (resolved.location.replicatedTensorSharding == tessera::ReplicatedTensorSharding::On) {
      const int64_t shards = resolved.location.shardingDomain.groupSize(opts.getGlobalReplicationFactor());
      const tessera::ShardLayout layout(weight.elements, shards);
      std::cout << "  " << layout.str() << "\n  real elements per shard:";
      for (const int64_t n : layout.realElementsPerShard()) std::cout << ' ' << n;
      std::cout << '\n';
    }
  } catch (const tessera::Error& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
