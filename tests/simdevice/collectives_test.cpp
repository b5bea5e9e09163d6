#include <doctest/doctest.h>

#include <numeric>
#include <string>

#include "device_checks.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/lib/shard_layout.hpp"
#include "test_support.hpp"

using namespace tessera;
using test::ReferenceEvaluator;

namespace {

std::vector<float> iota(std::size_t n, float first = 0.0f) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

void checkBothModes(const Graph& graph, int runs = 1) {
  const auto feeds = test::makeFeeds(graph, 3, 17);
  ReferenceEvaluator oracle(graph);
  test::feedOracle(oracle, graph, feeds);
  for (int i = 0; i < runs; ++i) oracle.run();
  for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
    INFO(toString(mode));
    test::DeviceRun device = test::loadOnDevice(graph, mode);
    for (int i = 0; i < runs; ++i) test::runDevice(*device.executable, feeds);
    CHECK(test::compareAll(*device.executable, graph, oracle) > 0);
  }
}

}  // namespace

TEST_CASE("collectives over every grouping and reduction agree with the reference") {
  const std::vector<ReplicaGrouping> groupings = {ReplicaGrouping(4, 1, 4), ReplicaGrouping(4, 1, 2),
                                                  ReplicaGrouping(4, 2, 2), ReplicaGrouping(8, 4, 2),
                                                  ReplicaGrouping(8, 1, 4)};
  for (const ReplicaGrouping& grouping : groupings) {
    for (ReductionType reduction : {ReductionType::Sum, ReductionType::Mean}) {
      for (int64_t n : {int64_t{30}, int64_t{3}}) {
        INFO(grouping.str() << ", " << toString(reduction) << ", n = " << n);
        const int64_t replicas = grouping.numReplicas();
        Graph g(replicas);
        const Tensor x = ops::input(g, "x", {n});
        const Tensor shared =
            ops::variable(g, "shared", test::pseudoRandom(static_cast<std::size_t>(n), 1), {n});
        const Tensor grouped =
            ops::variable(g, "grouped", test::pseudoRandom(static_cast<std::size_t>(n * replicas / 2), 2),
                          {n}, ReplicaGrouping(replicas, 1, 2));
        const Tensor reduced = ops::replicatedAllReduce(x, reduction, grouping);
        ops::replicatedAllReduce(shared, reduction, grouping);
        ops::replicatedAllReduce(grouped, reduction, grouping);
        const Tensor shard = ops::replicatedReduceScatter(x, reduction, grouping);
        const Tensor full = ops::replicatedAllGather(shard, grouping);
        ops::replicatedReduceScatter(grouped, reduction, grouping);
        const Tensor own = ops::replicaShardedSlice(x, grouping);
        OpAttributes pad;
        pad.grouping = grouping;
        g.addOp(OpKind::ReplicaShardedPad, {own.id()}, pad);
        checkBothModes(g);

        test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized);
        CHECK(device.executable->layout(reduced.id()) == grouping);
        CHECK(device.executable->layout(full.id()) == grouping);
        CHECK(device.executable->layout(shard.id()) == ReplicaGrouping(replicas, 1, 1));
      }
    }
  }
}

TEST_CASE("reduce-scatter of 30 elements over 4 replicas uses the balanced 7, 8, 7, 8 layout") {
  Graph g(4);
  const Tensor x = ops::input(g, "x", {30});
  const Tensor shard = ops::replicatedReduceScatter(x, ReductionType::Sum);
  const Tensor full = ops::replicatedAllGather(shard);
  std::vector<float> feed;
  for (int r = 0; r < 4; ++r) {
    const std::vector<float> values = iota(30);
    feed.insert(feed.end(), values.begin(), values.end());
  }
  for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
    test::DeviceRun device = test::loadOnDevice(g, mode);
    test::runDevice(*device.executable, {{x.id(), feed}});
    const std::vector<std::vector<float>> expected = {{0, 4, 8, 12, 16, 20, 24, 0},
                                                      {28, 32, 36, 40, 44, 48, 52, 56},
                                                      {60, 64, 68, 72, 76, 80, 84, 0},
                                                      {88, 92, 96, 100, 104, 108, 112, 116}};
    std::vector<float> gathered(30);
    for (std::size_t i = 0; i < gathered.size(); ++i) gathered[i] = 4.0f * static_cast<float>(i);
    for (int64_t r = 0; r < 4; ++r) {
      CHECK(test::deviceValue(*device.executable, g, shard.id(), r) == expected[static_cast<std::size_t>(r)]);
      CHECK(test::deviceValue(*device.executable, g, full.id(), r) == gathered);
    }
  }
}

TEST_CASE("reduce-scatter of fewer elements than replicas leaves empty shards zero") {
  Graph g(4);
  const Tensor x = ops::input(g, "x", {3});
  const Tensor shard = ops::replicatedReduceScatter(x, ReductionType::Mean);
  const Tensor full = ops::replicatedAllGather(shard, std::nullopt, {3});
  const std::vector<float> feed = {1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3};
  test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized);
  test::runDevice(*device.executable, {{x.id(), feed}});
  const ShardLayout layout(3, 4);
  std::vector<float> host = {1, 2, 3};
  for (int64_t r = 0; r < 4; ++r) {
    std::vector<float> expected(1);
    layout.hostToShard(host, r, expected);
    CHECK(test::deviceValue(*device.executable, g, shard.id(), r) == expected);
    CHECK(test::deviceValue(*device.executable, g, full.id(), r) == host);
  }
}

TEST_CASE("sharded variables: replicas holding one shard share a buffer; in-place shard updates") {
  for (std::optional<int64_t> shardOver : {std::optional<int64_t>{}, std::optional<int64_t>{2}}) {
    Graph g(4);
    const ShardedVariable w = ops::replicaShardedVariable(g, "w", iota(30), {5, 6}, std::nullopt, shardOver);
    const int64_t shards = shardOver.value_or(4);
    const ReplicaGrouping gather = shards == 4 ? ReplicaGrouping(4) : ReplicaGrouping(4, 1, 2);
    const Tensor gradient = ops::input(g, "gradient", {5, 6});
    ops::scaledAddInplace(w.shard, ops::replicatedReduceScatter(gradient, ReductionType::Mean, gather), 1.0,
                          -0.25);
    ops::replicatedAllGather(w.shard, gather);
    checkBothModes(g, 2);
    test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized);
    CHECK(device.executable->layout(w.variable.id()).numGroups() == 4);
  }
}

TEST_CASE("seed listing 13.2: a grouped remote variable is loaded, incremented and stored in sequence") {
  Graph g(2);
  const ReplicaGrouping rg(2, 1, 1);
  RemoteBuffer buffer;
  {
    InSequence sequence(g);
    buffer = ops::remoteBuffer(g, {32}, DType::Int32);
    ops::remoteVariable(g, "remote_v", iota(64), buffer, 0, rg);
    Tensor v = ops::remoteLoad(g, buffer, 0);
    v = ops::scaledAddInplace(v, ops::constant(g, "one", {1}, {}, DType::Int32));
    ops::remoteStore(g, buffer, 0, v);
  }
  for (ExecutionMode mode : {ExecutionMode::Vectorized, ExecutionMode::PerReplicaReference}) {
    test::DeviceRun device = test::loadOnDevice(g, mode);
    std::vector<float> entry(64);
    device.executable->readRemote(buffer.id(), 0, entry);
    CHECK(entry == iota(64));
    device.executable->run({});
    device.executable->readRemote(buffer.id(), 0, entry);
    std::vector<float> expected = iota(64, 1);
    CHECK(entry == expected);
    device.executable->run({});
    device.executable->readRemote(buffer.id(), 0, entry);
    CHECK(entry == iota(64, 2));
  }
}

TEST_CASE("remote buffers: every replica has its own entries, written and read by the host") {
  Graph g(4);
  const RemoteBuffer buffer = ops::remoteBuffer(g, {2}, DType::Float32, 3);
  const Tensor loaded = ops::remoteLoad(g, buffer, 2);
  const Tensor doubled = ops::mul(loaded, ops::scalar(g, 2.0));
  ops::remoteStore(g, buffer, 1, doubled);
  ops::remoteStore(g, buffer, 0, ops::variable(g, "w", {5, 6}, {2}));
  test::DeviceRun device = test::loadOnDevice(g, ExecutionMode::Vectorized);
  CHECK(device.executable->layout(loaded.id()) == ReplicaGrouping(4, 1, 1));
  device.executable->writeRemote(buffer.id(), 2, iota(8));
  device.executable->run({});
  std::vector<float> entry(8);
  device.executable->readRemote(buffer.id(), 1, entry);
  CHECK(entry == std::vector<float>{0, 2, 4, 6, 8, 10, 12, 14});
  device.executable->readRemote(buffer.id(), 0, entry);
  CHECK(entry == std::vector<float>{5, 6, 5, 6, 5, 6, 5, 6});

  struct Row {
    int64_t buffer;
    int64_t entry;
    std::size_t size;
    std::string subject;
  };
  const std::vector<Row> table = {
      {3, 0, 8, "writeRemote"},
      {buffer.id(), 3, 8, "writeRemote"},
      {buffer.id(), 0, 7, fmt::format("remote buffer #{}", buffer.id())},
  };
  for (const Row& row : table) {
    std::vector<float> data(row.size);
    const auto error =
        test::catchError<DeviceError>([&] { device.executable->writeRemote(row.buffer, row.entry, data); });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::InvalidProgram);
    CHECK(error->subject() == row.subject);
  }
}

TEST_CASE("a device simulating part of the replicas: groups of its replicas, data of its groups") {
  Graph g(4);
  const Tensor x = ops::input(g, "x", {2});
  const Tensor grouped = ops::variable(g, "grouped", {1, 2, 3, 4}, {2}, ReplicaGrouping(4, 1, 2));
  const Tensor reduced =
      ops::replicatedAllReduce(ops::add(x, grouped), ReductionType::Sum, ReplicaGrouping(4, 1, 2));
  Program program{g};
  program.replicas.localReplicas = 2;
  program.replicas.globalReplicas = 4;
  program.replicas.replicaOffset = 2;
  auto executable = makeSimDevice()->load(program);
  CHECK(executable->layout(grouped.id()) == ReplicaGrouping(2));
  executable->run(std::vector<Executable::Feed>{{x.id(), std::vector<float>{1, 1, 2, 2}}});
  std::vector<float> out(2);
  executable->read(reduced.id(), out);
  // Replicas 2 and 3 hold group 1 of `grouped`: (1 + 3) + (2 + 3), (1 + 4) + (2 + 4).
  CHECK(out == std::vector<float>{9, 11});

  Graph spanning(4);
  const Tensor y = ops::input(spanning, "y", {2});
  const Tensor all = ops::replicatedAllReduce(y, ReductionType::Sum);
  Program partial{spanning};
  partial.replicas.localReplicas = 2;
  partial.replicas.globalReplicas = 4;
  const auto error = test::catchError<DeviceError>([&] { makeSimDevice()->load(partial); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::InvalidProgram);
  CHECK(error->subject() == all.name());
}
