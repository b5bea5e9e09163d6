// Variables with replica groupings (PopXL guide, replication chapter, listing
// 13.1): eight replicas; variables shared by all, one per replica, one per
// pair of consecutive replicas, one per orthogonal pair, and one read back
// from every replica. Checks its own results and exits non-zero on a
// mismatch.
#include <cstdio>
#include <numeric>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/sessions/session.hpp"

using namespace tessera;

namespace {

std::vector<float> iota(int64_t n, float start) {
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

int failures = 0;

void expect(bool ok, const std::string& what) {
  fmt::print("{} {}\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}

}  // namespace

int main() {
  try {
    constexpr int64_t replicationFactor = 8;
    const Shape baseShape{3, 3};
    Graph g(replicationFactor);

    // The same value on every replica.
    ops::variable(g, "tensor_1", iota(9, 0), baseShape);
    // One value per replica: host data [8, 3, 3].
    ops::variable(g, "tensor_2", iota(replicationFactor * 9, 0), baseShape, ReplicaGrouping(replicationFactor, 1, 1));
    // Consecutive pairs share a value: [4, 3, 3].
    ops::variable(g, "tensor_3", iota(4 * 9, 100), baseShape, ReplicaGrouping(replicationFactor, 1, 2));
    // Orthogonal groups of stride 4 (replicas 0 and 4, 1 and 5, ...): [4, 3, 3].
    ops::variable(g, "tensor_3b", iota(4 * 9, 200), baseShape, ReplicaGrouping(replicationFactor, 4, 2));
    // Consecutive pairs, read back from every replica: upload [4, 3, 3],
    // download [8, 3, 3].
    ops::variable(g, "tensor_4", iota(4 * 9, 300), baseShape, ReplicaGrouping(replicationFactor, 1, 2),
                  RetrievalMode::AllReplicas);

    SessionOptions options;
    options.enableReplicatedGraphs = true;
    options.replicatedGraphCount = replicationFactor;
    InferenceSession session(std::move(g), {}, options, makeSimDevice());

    const auto shapeOf = [&](const char* name) { return session.readVariable(name).shape; };
    expect(shapeOf("tensor_1") == Shape{3, 3}, "tensor_1 reads back as [3, 3]");
    expect(shapeOf("tensor_2") == Shape{8, 3, 3}, "tensor_2 reads back as [8, 3, 3]");
    expect(shapeOf("tensor_3") == Shape{4, 3, 3}, "tensor_3 reads back as [4, 3, 3]");
    expect(shapeOf("tensor_3b") == Shape{4, 3, 3}, "tensor_3b reads back as [4, 3, 3]");
    expect(shapeOf("tensor_4") == Shape{8, 3, 3}, "tensor_4 (all_replicas) reads back as [8, 3, 3]");

    // tensor_4: replicas 2k and 2k+1 both hold group k's value.
    const HostTensor all = session.readVariable("tensor_4");
    bool pairs = true;
    for (int64_t r = 0; r < replicationFactor; ++r) {
      for (int64_t i = 0; i < 9; ++i) {
        pairs &= all.data[static_cast<size_t>(r * 9 + i)] == static_cast<float>(300 + (r / 2) * 9 + i);
      }
    }
    expect(pairs, "tensor_4: each replica holds its pair's value");
    // tensor_3b, read per replica: replica r holds group (r mod 4).
    const HostTensor ortho = session.readVariable("tensor_3b", RetrievalMode::AllReplicas);
    bool orthogonal = ortho.shape == Shape{8, 3, 3};
    for (int64_t r = 0; orthogonal && r < replicationFactor; ++r) {
      orthogonal &= ortho.data[static_cast<size_t>(r * 9)] == static_cast<float>(200 + (r % 4) * 9);
    }
    expect(orthogonal, "tensor_3b: replica r holds the value of group r mod 4");
  } catch (const tessera::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  fmt::print("{}\n", failures == 0 ? "all checks passed" : "some checks failed");
  return failures == 0 ? 0 : 1;
}
