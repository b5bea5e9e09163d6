#include <doctest/doctest.h>

#include "tessera/device.hpp"
#include "tessera/ops.hpp"

using namespace tessera;

namespace {

// x [4, 8] -> matmul w [8, 16] -> + b [16] -> relu -> reduceSum, plus a
// sharded variable of 30 elements over 2 replicas and a remote variable in a
// buffer of 3 entries of [10].
struct Small {
  Graph graph{2};
  Program program() const {
    Program p{graph};
    p.localReplicas = 2;
    p.globalReplicas = 2;
    p.numIOTiles = 10;
    return p;
  }
};

Small makeSmall() {
  Small s;
  Graph& g = s.graph;
  const Tensor x = ops::input(g, "x", {4, 8});
  const Tensor w = ops::variable(g, "w", std::vector<float>(8 * 16, 0.5f), {8, 16});
  const Tensor b = ops::variable(g, "b", std::vector<float>(16, 0.25f), {16});
  ops::replicaShardedVariable(g, "sharded", std::vector<float>(30, 1.0f), {30});
  const RemoteBuffer buffer = ops::remoteBuffer(g, {10}, DType::Float32, 3);
  ops::remoteVariable(g, "remote", std::vector<float>(10, 2.0f), buffer, 1);
  ops::reduceSum(ops::relu(ops::add(ops::matmul(x, w), b)));
  return s;
}

}  // namespace

TEST_CASE("memory per replica of a small program, computed by hand") {
  DeviceSpec spec;
  spec.tilesPerIpu = 100;
  spec.bytesPerTile = 1000;
  spec.streamingMemoryBytes = int64_t{1} << 20;
  const Small small = makeSmall();
  for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
    const auto executable = makeSimDevice(spec, mode)->load(small.program());
    const MemoryReport& report = executable->memory();
    CHECK(report.computeTilesCapacity == 90 * 1000);
    CHECK(report.ioTilesCapacity == 10 * 1000);
    CHECK(report.streamingCapacity == int64_t{1} << 20);
    REQUIRE(report.perReplica.size() == 2);
    for (int64_t r = 0; r < 2; ++r) {
      const ReplicaMemory& m = report.perReplica[static_cast<std::size_t>(r)];
      CHECK(m.replica == r);
      // w 8*16*4 = 512, b 16*4 = 64 (shared, still on every replica), the
      // shard ceil(30/2) * 4 = 60; the remote variable lives off chip.
      CHECK(m.variableBytes == 512 + 64 + 60);
      // Peak at the add (or the relu): two [4, 16] activations.
      CHECK(m.peakActivationBytes == 2 * 4 * 16 * 4);
      CHECK(m.remoteBufferBytes == 3 * 10 * 4);
      CHECK(m.computeTilesBytes == 636 + 512);
      CHECK(m.ioTilesBytes == 0);
      CHECK(m.streamingBytes == 120);
    }
  }
}

TEST_CASE("in-place outputs share their input's bytes; the replica index counts from the offset") {
  Graph g(4);
  const Tensor x = ops::input(g, "x", {100});
  const Tensor y = ops::mul(x, x);  // 400 bytes
  ops::scaledAddInplace(y, x);      // no new bytes
  ops::reduceSum(y);                // 4 bytes
  Program program{g};
  program.localReplicas = 2;
  program.globalReplicas = 4;
  program.replicaOffset = 2;
  const auto executable = makeSimDevice()->load(program);
  const MemoryReport& report = executable->memory();
  REQUIRE(report.perReplica.size() == 2);
  CHECK(report.perReplica[0].replica == 2);
  CHECK(report.perReplica[1].replica == 3);
  // x lives until the in-place add reads it, y (with its in-place output)
  // until the reduction: the peak is x and y together, not y and the sum.
  CHECK(report.perReplica[0].peakActivationBytes == 400 + 400);
  CHECK(report.perReplica[0].variableBytes == 0);
  const DeviceSpec defaults;
  CHECK(report.computeTilesCapacity == defaults.tilesPerIpu * defaults.bytesPerTile);
}
