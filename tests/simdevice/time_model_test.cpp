#include <doctest/doctest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/simdevice/time_model.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

// Round rates so that every expected time below is easy to check by hand.
DeviceSpec roundSpec() {
  DeviceSpec spec;
  spec.computeFlopsPerSecond = 1e9;
  spec.linkBandwidthBytesPerSecond = 1e9;
  spec.interInstanceBandwidthBytesPerSecond = 1e8;
  spec.streamingBandwidthBytesPerSecond = 1e8;
  spec.transferLatencySeconds = 1e-6;
  return spec;
}

Program programOf(const Graph& graph, int64_t localReplicas) {
  Program p{graph};
  p.replicas.localReplicas = localReplicas;
  p.replicas.globalReplicas = graph.replicationFactor();
  return p;
}

// The one op of `report` with this name.
const OpTime& opNamed(const TimeReport& report, const std::string& name) {
  for (const OpTime& op : report.ops)
    if (op.name == name) return op;
  FAIL("no op named " << name);
  return report.ops.front();
}

}  // namespace

TEST_CASE("compute ops cost their FLOPs at the compute rate") {
  struct Case {
    const char* name;
    std::function<void(Graph&)> build;  // the last op built is measured
    double flops;
  };
  const std::vector<Case> cases = {
      {"matmul 2 M N K",
       [](Graph& g) {
         ops::matmul(ops::input(g, "a", {4, 8}), ops::input(g, "b", {8, 16}));
       },
       2.0 * 4 * 16 * 8},
      {"batched matmul",
       [](Graph& g) {
         ops::matmul(ops::input(g, "a", {2, 4, 8}), ops::input(g, "b", {8, 16}));
       },
       2.0 * 2 * 4 * 16 * 8},
      {"add with broadcast: one per output element",
       [](Graph& g) {
         ops::add(ops::input(g, "a", {4, 16}), ops::input(g, "b", {16}));
       },
       64},
      {"scaled add: three per element",
       [](Graph& g) { ops::scaledAddInplace(ops::input(g, "a", {10}), ops::input(g, "b", {10}), 0.5, 2.0); },
       30},
      {"exp: four per element", [](Graph& g) { ops::exp(ops::input(g, "a", {10})); }, 40},
      {"softmax: five per element",
       [](Graph& g) {
         ops::softmax(ops::input(g, "a", {4, 10}));
       },
       200},
      {"cross entropy: five per logit",
       [](Graph& g) {
         ops::softmaxCrossEntropy(ops::input(g, "logits", {4, 10}),
                                  ops::input(g, "labels", {4}, DType::Int32));
       },
       200},
      {"gelu: eight per element", [](Graph& g) { ops::gelu(ops::input(g, "a", {10})); }, 80},
      {"reduction: one per input element",
       [](Graph& g) {
         ops::reduceSum(ops::input(g, "a", {4, 16}));
       },
       64},
      {"reshape is a view",
       [](Graph& g) {
         ops::reshape(ops::input(g, "a", {4, 16}), {64});
       },
       0},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    Graph g(1);
    c.build(g);
    const TimeReport report = modelTime(programOf(g, 1), roundSpec());
    REQUIRE(report.ops.size() == 1);  // sources are not listed
    const OpTime& op = report.ops.front();
    CHECK(op.lane == TimeLane::ComputeTiles);
    CHECK(op.flops == doctest::Approx(c.flops));
    CHECK(op.duration == doctest::Approx(c.flops / 1e9));
    CHECK(op.bytes == 0);
    CHECK(report.stepSeconds == doctest::Approx(c.flops / 1e9));
    CHECK(report.computeSeconds == doctest::Approx(c.flops / 1e9));
  }
}

TEST_CASE("collectives are ring transfers over their group, slower across instances") {
  struct Case {
    const char* name;
    int64_t localReplicas;  // an instance holds this many consecutive replicas
    std::function<void(Graph&)> build;
    std::string group;
    bool interInstance;
    double bytes;
    double seconds;
  };
  const std::string all = ReplicaGrouping(4).str();
  const std::string pairs = ReplicaGrouping(4, 1, 2).str();
  const std::string orthogonal = ReplicaGrouping(4, 2, 2).str();
  const std::vector<Case> cases = {
      // 400 bytes over 4 replicas: 2 x 3/4 x 400.
      {"all-reduce over all", 4, [](Graph& g) { ops::replicatedAllReduce(ops::input(g, "t", {100})); }, all,
       false, 600, 1e-6 + 600 / 1e9},
      {"all-reduce over pairs", 4,
       [](Graph& g) {
         ops::replicatedAllReduce(ops::input(g, "t", {100}), ReductionType::Sum, ReplicaGrouping(4, 1, 2));
       },
       pairs, false, 400, 1e-6 + 400 / 1e9},
      // 30 elements in shards of 8: 3 shards of 32 bytes go out.
      {"reduce-scatter pads to 4 shards of 8", 4,
       [](Graph& g) { ops::replicatedReduceScatter(ops::input(g, "t", {30})); }, all, false, 96,
       1e-6 + 96 / 1e9},
      {"all-gather of a shard of 8", 4,
       [](Graph& g) {
         ops::replicatedAllGather(ops::replicaShardedVariable(g, "w", std::vector<float>(30), {30}).shard);
       },
       all, false, 96, 1e-6 + 96 / 1e9},
      {"a group of one moves nothing", 4,
       [](Graph& g) {
         ops::replicatedAllReduce(ops::input(g, "t", {100}), ReductionType::Sum, ReplicaGrouping(4, 1, 1));
       },
       ReplicaGrouping(4, 1, 1).str(), false, 0, 0},
      {"all replicas span two instances", 2,
       [](Graph& g) { ops::replicatedAllReduce(ops::input(g, "t", {100})); }, all, true, 600,
       1e-6 + 600 / 1e8},
      {"pairs inside each instance", 2,
       [](Graph& g) {
         ops::replicatedAllReduce(ops::input(g, "t", {100}), ReductionType::Sum, ReplicaGrouping(4, 1, 2));
       },
       pairs, false, 400, 1e-6 + 400 / 1e9},
      {"orthogonal pairs cross instances", 2,
       [](Graph& g) {
         ops::replicatedAllReduce(ops::input(g, "t", {100}), ReductionType::Sum, ReplicaGrouping(4, 2, 2));
       },
       orthogonal, true, 400, 1e-6 + 400 / 1e8},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    Graph g(4);
    c.build(g);
    const TimeReport report = modelTime(programOf(g, c.localReplicas), roundSpec());
    REQUIRE(report.ops.size() == 1);
    const OpTime& op = report.ops.front();
    CHECK(op.lane == TimeLane::Link);
    CHECK(op.group == c.group);
    CHECK(op.interInstance == c.interInstance);
    CHECK(op.bytes == doctest::Approx(c.bytes));
    CHECK(op.duration == doctest::Approx(c.seconds));
    CHECK(report.collectiveSeconds == doctest::Approx(c.seconds));
    CHECK(report.linkBytes == doctest::Approx(c.bytes));
  }
}

TEST_CASE("loads through the IO tiles overlap compute; through the compute tiles they block it") {
  // A load of 4000 bytes (1e-6 + 4e-5 s), an unrelated matmul of 1e5 FLOPs
  // (1e-4 s) scheduled after it, and a copy of the loaded value (1000 FLOPs).
  auto build = [](Graph& g, bool throughIOTiles) {
    const RemoteBuffer buffer = ops::remoteBuffer(g, {1000});
    const Tensor a = ops::input(g, "a", {50, 100});
    const Tensor b = ops::input(g, "b", {100, 10});
    const Tensor loaded = ops::remoteLoad(g, buffer);
    if (throughIOTiles) g.tensor(loaded.id()).tileSet = TileSet::IO;
    ops::matmul(a, b);
    ops::copy(loaded);
  };
  const double load = 1e-6 + 4000 / 1e8;
  const double matmul = 1e5 / 1e9;
  const double copy = 1000 / 1e9;

  SUBCASE("through the compute tiles") {
    Graph g(1);
    build(g, false);
    const TimeReport report = modelTime(programOf(g, 1), roundSpec());
    const OpTime& loadOp = opNamed(report, "RemoteLoad");
    CHECK(loadOp.lane == TimeLane::Streaming);
    CHECK(loadOp.bytes == 4000);
    CHECK(loadOp.start == 0);
    CHECK(loadOp.duration == doctest::Approx(load));
    CHECK(opNamed(report, "MatMul").start == doctest::Approx(load));
    CHECK(report.stepSeconds == doctest::Approx(load + matmul + copy));
    CHECK(report.streamingSeconds == doctest::Approx(load));
    CHECK(report.overlappedStreamingSeconds == 0);
  }
  SUBCASE("through the IO tiles") {
    Graph g(1);
    build(g, true);
    const TimeReport report = modelTime(programOf(g, 1), roundSpec());
    CHECK(opNamed(report, "RemoteLoad").lane == TimeLane::IOTiles);
    CHECK(opNamed(report, "MatMul").start == 0);
    // The copy waits for the load and for the compute tiles.
    CHECK(opNamed(report, "Copy").start == doctest::Approx(matmul));
    CHECK(report.stepSeconds == doctest::Approx(matmul + copy));
    CHECK(report.streamingSeconds == 0);
    CHECK(report.overlappedStreamingSeconds == doctest::Approx(load));
    CHECK(report.streamingBytes == 4000);
  }
  SUBCASE("the consumer of a slow load waits for it") {
    Graph g(1);
    build(g, true);
    DeviceSpec slow = roundSpec();
    slow.streamingBandwidthBytesPerSecond = 1e7;  // the load takes 1e-6 + 4e-4 s
    const TimeReport report = modelTime(programOf(g, 1), slow);
    CHECK(opNamed(report, "Copy").start == doctest::Approx(1e-6 + 4e-4));
    CHECK(report.stepSeconds == doctest::Approx(1e-6 + 4e-4 + copy));
  }
}

TEST_CASE("a store through the IO tiles runs on the IO lane; transfers share the streaming link") {
  Graph g(1);
  const RemoteBuffer first = ops::remoteBuffer(g, {250});
  const RemoteBuffer second = ops::remoteBuffer(g, {250});
  const Tensor x = ops::input(g, "x", {250});
  g.tensor(x.id()).tileSet = TileSet::IO;
  ops::remoteStore(g, first, 0, x);
  ops::remoteStore(g, second, 0, x);
  const TimeReport report = modelTime(programOf(g, 1), roundSpec());
  REQUIRE(report.ops.size() == 2);
  const double store = 1e-6 + 1000 / 1e8;
  for (const OpTime& op : report.ops) {
    CHECK(op.kind == OpKind::RemoteStore);
    CHECK(op.lane == TimeLane::IOTiles);
    CHECK(op.bytes == 1000);
    CHECK(op.duration == doctest::Approx(store));
  }
  CHECK(report.ops[1].start == doctest::Approx(store));
  CHECK(report.stepSeconds == doctest::Approx(2 * store));
}

TEST_CASE("a loaded program exposes the time of its program") {
  Graph g(2);
  const Tensor x = ops::input(g, "x", {4, 8});
  const Tensor w = ops::variable(g, "w", std::vector<float>(8 * 16, 0.5f), {8, 16});
  ops::replicatedAllReduce(ops::reduceSum(ops::relu(ops::matmul(x, w))));
  const Program program = programOf(g, 2);
  const TimeReport expected = modelTime(program, roundSpec());
  const auto executable = makeSimDevice(roundSpec())->load(program);
  const TimeReport& time = executable->modelledTime();
  REQUIRE(time.ops.size() == 4);
  CHECK(time.stepSeconds == doctest::Approx(expected.stepSeconds));
  // MatMul 1024 + Relu 64 + ReduceSum 64 FLOPs, then the all-reduce of one
  // float over 2 replicas (2 x 1/2 x 4 bytes), one after the other.
  CHECK(time.flops == doctest::Approx(1024 + 64 + 64));
  CHECK(time.stepSeconds == doctest::Approx(1152 / 1e9 + 1e-6 + 4 / 1e9));
  CHECK(time.ops[3].start == doctest::Approx(1152 / 1e9));
  CHECK(time.ops[3].kind == OpKind::ReplicatedAllReduce);
}

// Two IPUs per replica: a matmul on each, the product of IPU 0 copied to
// IPU 1. Each IPU has its own tiles and memory plan; the copy costs the
// IPU-Link latency plus its bytes at the link bandwidth.
TEST_CASE("several IPUs per replica: per-IPU tiles and memory, copies on the IPU links") {
  DeviceSpec spec = roundSpec();
  spec.ipusPerReplica = 2;
  spec.interIpuBandwidthBytesPerSecond = 1e9;
  spec.interIpuLatencySeconds = 1e-6;
  Graph g;
  const Tensor a = ops::input(g, "a", {4, 8});
  const Tensor w0 = ops::variable(g, "w0", std::vector<float>(8 * 16, 0.5f), {8, 16});
  const Tensor w1 = ops::variable(g, "w1", std::vector<float>(16 * 2, 0.5f), {16, 2});
  const Tensor h = ops::matmul(a, w0);
  const OpId copy = g.addOp(OpKind::IpuCopy, {h.id()}, {}, "copy");
  const Tensor moved{&g, g.op(copy).outputs[0]};
  const Tensor y = ops::matmul(moved, w1);
  for (const Tensor& t : {a, w0, h}) g.setVirtualGraph(t.node().producer, 0);
  for (const Tensor& t : {w1, y}) g.setVirtualGraph(t.node().producer, 1);
  g.setVirtualGraph(copy, 1);

  const TimeReport time = modelTime(programOf(g, 1), spec);
  const OpTime& moving = opNamed(time, "copy");
  CHECK(moving.lane == TimeLane::IpuLink);
  CHECK(moving.ipu == 1);
  CHECK(moving.bytes == 4 * 16 * 4.0);
  CHECK(moving.duration == doctest::Approx(1e-6 + 4 * 16 * 4 / 1e9));
  CHECK(time.ipuCopies == 1);
  CHECK(time.ipuCopyBytes == 4 * 16 * 4.0);
  CHECK(opNamed(time, "MatMul").ipu == 0);
  CHECK(opNamed(time, "MatMul.1").ipu == 1);
  // The second product waits for the copy, which waits for the first.
  CHECK(opNamed(time, "MatMul.1").start == doctest::Approx(moving.start + moving.duration));

  const MemoryReport memory = planMemory(programOf(g, 1), spec);
  REQUIRE(memory.perReplica.size() == 2);
  CHECK(memory.ipusPerReplica == 2);
  CHECK(memory.perReplica[0].ipu == 0);
  CHECK(memory.perReplica[1].ipu == 1);
  CHECK(memory.perReplica[0].variableBytes == 8 * 16 * 4);
  CHECK(memory.perReplica[1].variableBytes == 16 * 2 * 4);
  // IPU 1 holds the copy and the product, never the input.
  CHECK(memory.perReplica[1].computeTilesBytes == 16 * 2 * 4 + 4 * 16 * 4 + 4 * 2 * 4);

  // A program naming an IPU the device does not have is refused.
  g.setVirtualGraph(copy, 2);
  const auto error = test::catchError<DeviceError>([&] { (void)planMemory(programOf(g, 1), spec); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::InvalidProgram);
  CHECK(std::string(error->what()).find("runs on IPU 2, but a replica of this device has 2 IPUs") !=
        std::string::npos);
}
