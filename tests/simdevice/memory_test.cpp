#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

// A program of all the graph's replicas on one device.
Program wholeProgram(const Graph& graph, int64_t numIOTiles) {
  Program p{graph};
  p.replicas.localReplicas = graph.replicationFactor();
  p.replicas.globalReplicas = graph.replicationFactor();
  p.numIOTiles = numIOTiles;
  return p;
}

// x [4, 8] -> matmul w [8, 16] -> + b [16] -> relu -> reduceSum, plus a
// sharded variable of 30 elements over 2 replicas and a remote variable in a
// buffer of 3 entries of [10].
struct Small {
  Graph graph{2};
  Program program() const { return wholeProgram(graph, 10); }
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
  program.replicas.localReplicas = 2;
  program.replicas.globalReplicas = 4;
  program.replicas.replicaOffset = 2;
  // Replicas 2 and 3 of 4 are one instance of two: planned without loading.
  const MemoryReport report = planMemory(program, DeviceSpec{});
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

namespace {

// Everything on one tile set of one replica, by name.
std::vector<std::string> names(const std::vector<TensorMemory>& tensors) {
  std::vector<std::string> out;
  for (const TensorMemory& t : tensors) out.push_back(t.name);
  return out;
}

const TensorMemory& tensorNamed(const MemoryReport& report, const std::string& name) {
  for (const TensorMemory& t : report.tensors)
    if (t.name == name) return t;
  FAIL("no tensor named " << name);
  throw std::logic_error("unreachable");
}

const CategoryMemory& category(const ReplicaMemory& m, TensorCategory c) {
  return m.byCategory.at(static_cast<std::size_t>(c));
}

// Over 4 replicas: an input x [10], a weight W of 30 elements sharded over
// the 4 replicas (shard [8]: 7, 8, 7, 8 real elements), optimizer state m
// [100] kept on the IO tiles, and an activation stashed in a remote buffer of
// 2 entries [10], loaded back through the IO tiles and copied to compute.
//   positions: 0 x, 1 W, 2 m, 3 Relu, 4 RemoteStore, 5 RemoteLoad, 6 Copy, 7 Add
struct TileSets {
  Graph graph{4};
  Program program() const { return wholeProgram(graph, 2); }
};

TileSets makeTileSets() {
  TileSets s;
  Graph& g = s.graph;
  const Tensor x = ops::input(g, "x", {10});
  ops::replicaShardedVariable(g, "W", std::vector<float>(30, 1.0f), {30});
  const Tensor m = ops::variable(g, "m", std::vector<float>(100, 0.0f), {100}, std::nullopt,
                                 RetrievalMode::OnePerGroup, TensorCategory::OptimizerState);
  g.tensor(m.id()).tileSet = TileSet::IO;
  const RemoteBuffer stash = ops::remoteBuffer(g, {10}, DType::Float32, 2);
  ops::remoteStore(g, stash, 0, ops::relu(x));
  const Tensor loaded = ops::remoteLoad(g, stash, 0);
  g.tensor(loaded.id()).tileSet = TileSet::IO;
  ops::add(ops::copy(loaded), x);
  return s;
}

DeviceSpec smallSpec() {
  DeviceSpec spec;
  spec.tilesPerIpu = 10;
  spec.bytesPerTile = 1000;
  spec.streamingMemoryBytes = 1000;
  return spec;
}

}  // namespace

TEST_CASE("bytes by tile set, category and tensor; shards pad differently on each replica") {
  const TileSets s = makeTileSets();
  const MemoryReport report = planMemory(s.program(), smallSpec());
  CHECK(report.computeTilesCapacity == 8 * 1000);
  CHECK(report.ioTilesCapacity == 2 * 1000);
  REQUIRE(report.perReplica.size() == 4);
  const std::vector<int64_t> padding = {4, 0, 4, 0};  // shards 0 and 2 hold 7 of their 8 slots
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("replica " << r);
    const ReplicaMemory& m = report.perReplica[r];
    CHECK(m.replica == static_cast<int64_t>(r));
    // Compute tiles: W's shard (32) all step; x (40) from its input to the
    // Add; Relu (40) to its store; Copy (40) and Add (40) at the end.
    CHECK(m.computeTilesBytes == 32 + 40 + 40 + 40);
    CHECK(m.computeTilesPeak.op == "Add");
    CHECK(names(m.computeTilesPeak.largest) == std::vector<std::string>{"Add", "Copy", "x", "W"});
    // IO tiles: m (400) all step, the loaded stash (40) from the load to the copy.
    CHECK(m.ioTilesBytes == 400 + 40);
    CHECK(m.ioTilesPeak.op == "RemoteLoad");
    CHECK(names(m.ioTilesPeak.largest) == std::vector<std::string>{"m", "RemoteLoad"});
    CHECK(m.streamingBytes == 2 * 10 * 4);
    CHECK(m.remoteBufferBytes == 80);
    CHECK(m.streamingPeak.op.empty());
    CHECK(names(m.streamingPeak.largest) == std::vector<std::string>{"remote buffer #0 (Relu)"});
    CHECK(m.variableBytes == 32 + 400);
    // On chip, not resident: at most x, the loaded value and its copy.
    CHECK(m.peakActivationBytes == 120);
    CHECK(m.paddingBytes == padding[r]);
    REQUIRE(m.byCategory.size() == 4);
    CHECK(category(m, TensorCategory::Weight).computeTilesBytes == 32);
    CHECK(category(m, TensorCategory::Activation).computeTilesBytes == 120);
    CHECK(category(m, TensorCategory::OptimizerState).ioTilesBytes == 400);
    CHECK(category(m, TensorCategory::Activation).ioTilesBytes == 40);
    CHECK(category(m, TensorCategory::Activation).streamingBytes == 80);
    CHECK(category(m, TensorCategory::Accumulator).computeTilesBytes == 0);
  }
  CHECK(report.paddingBytes == 8);

  const TensorMemory& w = tensorNamed(report, "W");
  CHECK(w.space == MemorySpace::ComputeTiles);
  CHECK(w.category == TensorCategory::Weight);
  CHECK(w.bytes == 32);
  CHECK(w.resident);
  CHECK(w.sharded);
  CHECK(w.shards == 4);
  CHECK(w.paddingBytes == 2 * 4);  // 4 x 8 slots for 30 elements
  const TensorMemory& x = tensorNamed(report, "x");
  CHECK_FALSE(x.resident);
  CHECK_FALSE(x.sharded);
  CHECK(x.firstUse == 0);
  CHECK(x.lastUse == 7);
  const TensorMemory& loaded = tensorNamed(report, "RemoteLoad");
  CHECK(loaded.space == MemorySpace::IOTiles);
  CHECK(loaded.firstUse == 5);
  CHECK(loaded.lastUse == 6);
  const TensorMemory& stash = tensorNamed(report, "remote buffer #0 (Relu)");
  CHECK(stash.space == MemorySpace::Streaming);
  CHECK(stash.remoteBuffer == 0);
  CHECK(stash.bytes == 80);

  // Loading plans the same numbers.
  const auto executable = makeSimDevice(smallSpec())->load(s.program());
  CHECK(executable->memory().perReplica[2].computeTilesBytes == report.perReplica[2].computeTilesBytes);
  CHECK(executable->memory().perReplica[2].paddingBytes == 4);
  CHECK(executable->memory().tensors.size() == report.tensors.size());
}

TEST_CASE("resident bytes: what each category holds all step, by space; transient values are not counted") {
  const TileSets s = makeTileSets();
  const MemoryReport report = planMemory(s.program(), smallSpec());
  for (const ReplicaMemory& m : report.perReplica) {
    INFO("replica " << m.replica);
    REQUIRE(m.resident.size() == 4);
    const auto resident = [&m](TensorCategory c) { return m.resident.at(static_cast<std::size_t>(c)); };
    CHECK(resident(TensorCategory::Weight).computeTilesBytes == 32);  // W's shard, padding slot included
    CHECK(resident(TensorCategory::Weight).ioTilesBytes == 0);
    CHECK(resident(TensorCategory::OptimizerState).ioTilesBytes == 400);
    CHECK(resident(TensorCategory::OptimizerState).computeTilesBytes == 0);
    // The stash is held all step in streaming memory; x, Relu, the loaded value and its copy are not.
    CHECK(resident(TensorCategory::Activation).streamingBytes == 80);
    CHECK(resident(TensorCategory::Activation).computeTilesBytes == 0);
    CHECK(resident(TensorCategory::Activation).ioTilesBytes == 0);
    const CategoryMemory& accumulators = resident(TensorCategory::Accumulator);
    CHECK(accumulators.computeTilesBytes + accumulators.ioTilesBytes + accumulators.streamingBytes == 0);
  }
}

TEST_CASE("a weight kept in streaming memory is resident there, and its loaded copy is not") {
  Graph g(1);
  const RemoteBuffer buffer = ops::remoteBuffer(g, {25});
  const Tensor w = ops::remoteVariable(g, "w", std::vector<float>(25, 1.0F), buffer);
  const Tensor x = ops::input(g, "x", {25});
  ops::mul(ops::remoteLoad(g, buffer, 0), x);
  const MemoryReport report = planMemory(wholeProgram(g, 2), smallSpec());
  REQUIRE(report.perReplica.size() == 1);
  const CategoryMemory& weight =
      report.perReplica[0].resident.at(static_cast<std::size_t>(TensorCategory::Weight));
  CHECK(g.tensor(w.id()).category == TensorCategory::Weight);
  CHECK(weight.streamingBytes == 100);
  CHECK(weight.computeTilesBytes == 0);
  CHECK(weight.ioTilesBytes == 0);
  // The loaded value is live on the compute tiles at the peak, not held all step.
  CHECK(report.perReplica[0].computeTilesBytes >= 100);
}

TEST_CASE("shards made by a collective pad by the replica's index in its group") {
  // Groups {0, 2} and {1, 3}: replicas 0 and 1 keep shard 0 (2 real
  // elements of 5, one slot of padding), replicas 2 and 3 shard 1 (3 real).
  Graph g(4);
  const Tensor grad = ops::input(g, "grad", {5});
  const Tensor shard = ops::replicatedReduceScatter(grad, ReductionType::Sum, ReplicaGrouping(4, 2, 2));
  ops::scaledAddInplace(shard, shard);
  Program program{g};
  program.replicas.localReplicas = 2;
  program.replicas.globalReplicas = 4;
  program.replicas.replicaOffset = 2;
  const MemoryReport report = planMemory(program, DeviceSpec{});
  REQUIRE(report.perReplica.size() == 2);
  CHECK(report.perReplica[0].replica == 2);
  CHECK(report.perReplica[0].paddingBytes == 0);
  CHECK(report.perReplica[1].paddingBytes == 0);
  CHECK(report.paddingBytes == 0);
  const TensorMemory& t = tensorNamed(report, "ReplicatedReduceScatter");
  CHECK(t.sharded);
  CHECK(t.shards == 2);
  CHECK(t.bytes == 3 * 4);
  CHECK(t.paddingBytes == 4);

  program.replicas.replicaOffset = 0;
  const MemoryReport first = planMemory(program, DeviceSpec{});
  CHECK(first.perReplica[0].paddingBytes == 4);
  CHECK(first.perReplica[1].paddingBytes == 4);
  CHECK(first.paddingBytes == 8);
}

namespace {

// x [64] * w [64], then a sum, on 2 replicas: the compute tiles peak at the
// Mul with w, x and the product, 3 x 256 bytes.
struct Oom {
  Graph graph{2};
  int64_t numIOTiles = 0;
  Program program() const {
    Program p{graph};
    p.replicas.localReplicas = 2;
    p.replicas.globalReplicas = 2;
    p.numIOTiles = numIOTiles;
    return p;
  }
};

Oom makeOom(bool weightOnIOTiles, bool remote) {
  Oom s;
  Graph& g = s.graph;
  const Tensor x = ops::input(g, "x", {64});
  const Tensor w = ops::variable(g, "w", std::vector<float>(64, 1.0f), {64});
  if (weightOnIOTiles) {
    g.tensor(w.id()).tileSet = TileSet::IO;
    s.numIOTiles = 2;
  }
  if (remote) ops::remoteBuffer(g, {64}, DType::Float32, 2);
  ops::reduceSum(ops::mul(x, w));
  return s;
}

}  // namespace

TEST_CASE("a program that does not fit is rejected at load; one that just fits loads") {
  struct Case {
    const char* name;
    bool weightOnIOTiles;
    bool remote;
    DeviceSpec fits;  // exactly the bytes needed
    DeviceSpec tooSmall;
    std::string subject;
    std::string message;
  };
  auto spec = [](int64_t tiles, int64_t bytesPerTile, int64_t streaming) {
    DeviceSpec d;
    d.tilesPerIpu = tiles;
    d.bytesPerTile = bytesPerTile;
    d.streamingMemoryBytes = streaming;
    return d;
  };
  const std::vector<Case> cases = {
      {"compute tiles", false, false, spec(8, 96, 0), spec(8, 95, 0), "replica 0, compute tiles",
       "needs 768 bytes (768 B) while op \"Mul\" runs but has 760 bytes (760 B); largest tensors at the "
       "peak: Mul (Activation, 256 bytes), w (Weight, 256 bytes), x (Activation, 256 bytes)"},
      {"IO tiles", true, false, spec(8, 128, 0), spec(8, 127, 0), "replica 0, IO tiles",
       "needs 256 bytes (256 B) but has 254 bytes (254 B); largest tensors at the peak: w (Weight, 256 "
       "bytes)"},
      {"streaming memory", false, true, spec(8, 1024, 512), spec(8, 1024, 511), "replica 0, streaming memory",
       "needs 512 bytes (512 B) but has 511 bytes (511 B); largest tensors at the peak: remote buffer #0 "
       "(Activation, 512 bytes)"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const Oom oom = makeOom(c.weightOnIOTiles, c.remote);
    CHECK_NOTHROW(makeSimDevice(c.fits)->load(oom.program()));
    CHECK_FALSE(findShortfall(planMemory(oom.program(), c.fits)));

    const auto error = test::catchError<DeviceError>([&] { makeSimDevice(c.tooSmall)->load(oom.program()); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::OutOfMemory);
    CHECK(error->subject() == c.subject);
    CHECK(error->detail() == c.message);
    const auto shortfall = findShortfall(planMemory(oom.program(), c.tooSmall));
    REQUIRE(shortfall);
    CHECK(shortfall->replica == 0);
  }
}

TEST_CASE("the shortfall names the space, the need and the capacity; at most ten tensors are listed") {
  Graph g(1);
  Tensor sum = ops::scalar(g, 0.0);
  for (int i = 0; i < 12; ++i) {
    const int64_t n = 10 * (i + 1);
    const Tensor v =
        ops::variable(g, fmt::format("v{:02}", i), std::vector<float>(static_cast<std::size_t>(n), 1.0f), {n},
                      std::nullopt, RetrievalMode::OnePerGroup, TensorCategory::Accumulator);
    sum = ops::add(sum, ops::reduceSum(v));
  }
  DeviceSpec spec;
  spec.tilesPerIpu = 4;
  spec.bytesPerTile = 256;
  const MemoryReport report = planMemory(Program{g}, spec);
  const auto shortfall = findShortfall(report);
  REQUIRE(shortfall);
  CHECK(shortfall->replica == 0);
  CHECK(shortfall->space == MemorySpace::ComputeTiles);
  CHECK(shortfall->availableBytes == 1024);
  // 10 + 20 + ... + 120 elements of variables, plus the live sums.
  CHECK(shortfall->neededBytes == report.perReplica[0].computeTilesBytes);
  CHECK(report.perReplica[0].variableBytes == 780 * 4);
  const std::vector<TensorMemory>& largest = report.perReplica[0].computeTilesPeak.largest;
  REQUIRE(largest.size() == 10);
  CHECK(largest.front().name == "v11");
  CHECK(largest.front().bytes == 480);
  CHECK(largest.back().name == "v02");
  CHECK(category(report.perReplica[0], TensorCategory::Accumulator).computeTilesBytes == 780 * 4);

  const auto error = test::catchError<DeviceError>([&] { makeSimDevice(spec)->load(Program{g}); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::OutOfMemory);
  CHECK(error->subject() == "replica 0, compute tiles");
  CHECK(error->detail().find("largest tensors at the peak: v11 (Accumulator, 480 bytes), v10 (Accumulator, "
                             "440 bytes)") != std::string::npos);
  CHECK(error->detail().find("v01") == std::string::npos);
}

TEST_CASE("planning rejects IO tiles that leave no compute tiles") {
  Graph g(1);
  ops::input(g, "x", {4});
  Program program{g};
  DeviceSpec spec;
  spec.tilesPerIpu = 8;
  for (int64_t io : {int64_t{-1}, int64_t{8}, int64_t{9}}) {
    program.numIOTiles = io;
    const auto error = test::catchError<DeviceError>([&] { planMemory(program, spec); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::InvalidProgram);
    CHECK(error->subject() == "Program.numIOTiles");
  }
}
