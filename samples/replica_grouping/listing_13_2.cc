// A remote variable with a replica grouping (PopXL guide, replication
// chapter, listing 13.2): two replicas, each its own group, each with a
// 32-element int32 variable in streaming memory; the program loads it, adds
// one and stores it back, in sequence since no data flows from the add to the
// store. Checks its own results and exits non-zero on a mismatch.
#include <numeric>
#include <vector>

#include <fmt/core.h>

#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/sessions/session.hpp"

using namespace tessera;

int main() {
  try {
    constexpr int64_t replicationFactor = 2;
    constexpr int64_t numGroups = 2;
    Graph g(replicationFactor);
    std::vector<float> hostData(numGroups * 32);
    std::iota(hostData.begin(), hostData.end(), 0.0f);  // v_h = arange(0, 64).reshape(2, 32)
    const ReplicaGrouping grouping(replicationFactor, 1, replicationFactor / numGroups);
    {
      InSequence sequence(g);
      // The buffer has the per-replica shape, without the group dimension.
      const RemoteBuffer buffer = ops::remoteBuffer(g, {32}, DType::Int32);
      ops::remoteVariable(g, "remote_v", hostData, buffer, 0, grouping);
      Tensor v = ops::remoteLoad(g, buffer, 0);
      v = ops::scaledAddInplace(v, ops::constant(g, "one", {1.0f}, {}, DType::Int32), 1.0, 1.0);
      ops::remoteStore(g, buffer, 0, v);
    }
    SessionOptions options;
    options.enableReplicatedGraphs = true;
    options.replicatedGraphCount = replicationFactor;
    InferenceSession session(std::move(g), {}, options, makeSimDevice());

    int failures = 0;
    for (int run = 1; run <= 2; ++run) {
      session.run(std::span<const StepInput>{});
      const HostTensor v = session.readVariable("remote_v");
      bool ok = v.shape == Shape{2, 32};
      for (size_t i = 0; ok && i < v.data.size(); ++i) ok = v.data[i] == static_cast<float>(i) + run;
      fmt::print("{} after run {}: remote_v == arange(64).reshape(2, 32) + {}\n", ok ? "ok  " : "FAIL", run, run);
      failures += ok ? 0 : 1;
    }
    fmt::print("{}\n", failures == 0 ? "all checks passed" : "some checks failed");
    return failures == 0 ? 0 : 1;
  } catch (const tessera::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
