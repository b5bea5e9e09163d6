#include "support/reference_evaluator.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "tessera/lib/ops.hpp"

using namespace tessera;
using test::ReferenceEvaluator;

namespace {

std::vector<float> iota(std::size_t n, float first = 0.0f) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<double> iotaD(std::size_t n, double first = 0.0) {
  std::vector<double> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

}  // namespace

TEST_CASE("seed listing 13.2: a grouped remote variable loaded, incremented and stored in sequence") {
  Graph g(2);
  const int64_t numGroups = 2;
  const ReplicaGrouping rg(2, 1, g.replicationFactor() / numGroups);
  {
    InSequence sequence(g);
    const RemoteBuffer buffer = ops::remoteBuffer(g, {32}, DType::Int32);
    ops::remoteVariable(g, "remote_v", iota(64), buffer, 0, rg);
    Tensor v = ops::remoteLoad(g, buffer, 0);
    v = ops::scaledAddInplace(v, ops::constant(g, "one", {1}, {}, DType::Int32));
    ops::remoteStore(g, buffer, 0, v);
  }
  ReferenceEvaluator ev(g);
  CHECK(ev.buffer(0, 0, 0) == iotaD(32, 0));
  CHECK(ev.buffer(0, 0, 1) == iotaD(32, 32));
  ev.run();
  CHECK(ev.buffer(0, 0, 0) == iotaD(32, 1));
  CHECK(ev.buffer(0, 0, 1) == iotaD(32, 33));
  ev.run();
  CHECK(ev.buffer(0, 0, 0) == iotaD(32, 2));
  CHECK(ev.buffer(0, 0, 1) == iotaD(32, 34));
}

TEST_CASE(
    "replicaShardedVariable + replicatedAllGather recovers the full weight on every replica (n=30, R=4)") {
  Graph g(4);
  const ShardedVariable w = ops::replicaShardedVariable(g, "W", iota(30), {5, 2, 3});
  const Tensor full = ops::replicatedAllGather(w.shard);
  CHECK(full.shape() == Shape{5, 2, 3});
  ReferenceEvaluator ev(g);
  ev.run();
  // The balanced layout of 30 over 4: 7, 8, 7, 8 real elements, zero padding at the end.
  CHECK(ev.value(w.shard.id(), 0) == std::vector<double>{0, 1, 2, 3, 4, 5, 6, 0});
  CHECK(ev.value(w.shard.id(), 1) == iotaD(8, 7));
  CHECK(ev.value(w.shard.id(), 2) == std::vector<double>{15, 16, 17, 18, 19, 20, 21, 0});
  CHECK(ev.value(w.shard.id(), 3) == iotaD(8, 22));
  for (int64_t r = 0; r < 4; ++r) CHECK(ev.value(full.id(), r) == iotaD(30));
}

TEST_CASE("shardOver: group member m holds shard m mod shardOver") {
  // PopXL's example: w = [1, 2], one group of 4, shardOver 2 -> [1], [2], [1], [2].
  Graph g(4);
  const ShardedVariable w = ops::replicaShardedVariable(g, "w", {1, 2}, {2}, std::nullopt, 2);
  const Tensor full = ops::replicatedAllGather(w.shard, ReplicaGrouping(4, 1, 2));
  ReferenceEvaluator ev(g);
  ev.run();
  const std::vector<std::vector<double>> expected = {{1}, {2}, {1}, {2}};
  for (int64_t r = 0; r < 4; ++r) {
    CHECK(ev.value(w.shard.id(), r) == expected[static_cast<std::size_t>(r)]);
    CHECK(ev.value(full.id(), r) == std::vector<double>{1, 2});
  }
}

TEST_CASE("grouped variables: replica r holds its group's row of the host data") {
  Graph g(4);
  const Tensor v = ops::variable(g, "v", {10, 11, 20, 21}, {2}, ReplicaGrouping(4, 2, 2));
  ReferenceEvaluator ev(g);
  // Groups [0, 2] and [1, 3].
  CHECK(ev.value(v.id(), 0) == std::vector<double>{10, 11});
  CHECK(ev.value(v.id(), 1) == std::vector<double>{20, 21});
  CHECK(ev.value(v.id(), 2) == std::vector<double>{10, 11});
  CHECK(ev.value(v.id(), 3) == std::vector<double>{20, 21});
}

TEST_CASE("collectives combine the replicas of each group") {
  Graph g(4);
  const ReplicaGrouping orthogonal(4, 2, 2);  // groups [0, 2] and [1, 3]
  const Tensor x = ops::input(g, "x", {3});
  const Tensor sum = ops::replicatedAllReduce(x, ReductionType::Sum, orthogonal);
  const Tensor mean = ops::replicatedAllReduce(x, ReductionType::Mean);
  const Tensor scattered = ops::replicatedReduceScatter(x, ReductionType::Sum, orthogonal);
  const Tensor sliced = ops::replicaShardedSlice(x, orthogonal);
  const Tensor gathered = ops::replicatedAllGather(scattered, orthogonal);
  ReferenceEvaluator ev(g);
  for (int64_t r = 0; r < 4; ++r) ev.feed(x.id(), r, {1.0 * r, 10.0 * r, 100.0 * r});
  ev.run();
  CHECK(ev.value(sum.id(), 0) == std::vector<double>{2, 20, 200});
  CHECK(ev.value(sum.id(), 2) == std::vector<double>{2, 20, 200});
  CHECK(ev.value(sum.id(), 1) == std::vector<double>{4, 40, 400});
  CHECK(ev.value(mean.id(), 3) == std::vector<double>{1.5, 15, 150});
  // 3 elements over 2 shards: [e0, pad] and [e1, e2].
  CHECK(ev.value(scattered.id(), 0) == std::vector<double>{2, 0});
  CHECK(ev.value(scattered.id(), 2) == std::vector<double>{20, 200});
  CHECK(ev.value(scattered.id(), 3) == std::vector<double>{40, 400});
  CHECK(ev.value(sliced.id(), 1) == std::vector<double>{1, 0});
  CHECK(ev.value(sliced.id(), 3) == std::vector<double>{30, 300});
  CHECK(ev.value(gathered.id(), 0) == std::vector<double>{2, 20, 200});
  CHECK(ev.value(gathered.id(), 3) == std::vector<double>{4, 40, 400});
}

TEST_CASE("dense op semantics") {
  Graph g;
  const Tensor a = ops::input(g, "a", {2, 3});
  const Tensor b = ops::input(g, "b", {3, 2});
  const Tensor mm = ops::matmul(a, b);
  const Tensor t = ops::transpose(a);
  const Tensor sl = ops::slice(a, {0, 1}, {2, 3});
  const Tensor cat = ops::concat({a, a}, 1);
  const Tensor am = ops::argmax(ops::neg(a));
  const Tensor sm = ops::softmax(a);
  const Tensor rs = ops::reduceSum(a, {0});
  const Tensor rm = ops::reduceMean(a);
  const Tensor bc = ops::broadcastTo(ops::reshape(rs, {3, 1}), {3, 2});
  const Tensor labels = ops::constant(g, "labels", {2, 0}, {2}, DType::Int32);
  const Tensor ce = ops::softmaxCrossEntropy(a, labels, ReductionType::Sum);
  const Tensor ge = ops::gelu(a);
  ReferenceEvaluator ev(g);
  ev.feed(a.id(), 0, {1, 2, 3, 4, 5, 6});
  ev.feed(b.id(), 0, {1, 0, 0, 1, 1, 1});
  ev.run();
  CHECK(ev.value(mm.id(), 0) == std::vector<double>{4, 5, 10, 11});
  CHECK(ev.value(t.id(), 0) == std::vector<double>{1, 4, 2, 5, 3, 6});
  CHECK(ev.value(sl.id(), 0) == std::vector<double>{2, 3, 5, 6});
  CHECK(ev.value(cat.id(), 0) == std::vector<double>{1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6});
  CHECK(ev.value(am.id(), 0) == std::vector<double>{0, 0});
  CHECK(ev.value(rs.id(), 0) == std::vector<double>{5, 7, 9});
  CHECK(ev.value(rm.id(), 0) == std::vector<double>{3.5});
  CHECK(ev.value(bc.id(), 0) == std::vector<double>{5, 5, 7, 7, 9, 9});
  const std::vector<double>& p = ev.value(sm.id(), 0);
  CHECK(p[0] + p[1] + p[2] == doctest::Approx(1.0));
  CHECK(p[2] / p[1] == doctest::Approx(std::exp(1.0)));
  // -log softmax(row 0)[2] - log softmax(row 1)[0]
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  CHECK(ev.value(ce.id(), 0)[0] == doctest::Approx((lse - 3.0) + (lse + 3.0 - 4.0)));
  CHECK(ev.value(ge.id(), 0)[0] == doctest::Approx(0.841192).epsilon(1e-6));
}

TEST_CASE("in-place updates are seen by later readers and persist across runs") {
  Graph g;
  const Tensor w = ops::variable(g, "w", {1, 2}, {2});
  const Tensor d = ops::input(g, "d", {2});
  const Tensor before = ops::copy(w);
  ops::scaledAddInplace(w, d, 1.0, -0.5);
  const Tensor after = ops::copy(w);
  ReferenceEvaluator ev(g);
  ev.feed(d.id(), 0, {2, 4});
  ev.run();
  CHECK(ev.value(before.id(), 0) == std::vector<double>{1, 2});
  CHECK(ev.value(after.id(), 0) == std::vector<double>{0, 0});
  ev.run();
  CHECK(ev.value(before.id(), 0) == std::vector<double>{0, 0});
  CHECK(ev.value(w.id(), 0) == std::vector<double>{-1, -2});
}
