#include "tessera/lib/graph.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

// The position of each op in a schedule.
std::vector<std::size_t> positions(const Graph& graph, const std::vector<OpId>& order) {
  std::vector<std::size_t> at(graph.ops().size());
  for (std::size_t i = 0; i < order.size(); ++i) at[static_cast<std::size_t>(order[i])] = i;
  return at;
}

OpId producerOf(const Tensor& t) { return t.node().producer; }

}  // namespace

TEST_CASE("numElements and shapeStr") {
  CHECK(numElements({}) == 1);
  CHECK(numElements({2, 3, 4}) == 24);
  CHECK(numElements({5, 0}) == 0);
  CHECK(shapeStr({2, 3}) == "[2, 3]");
  CHECK(shapeStr({}) == "[]");
  auto e = test::catchError<GraphError>([] { numElements({2, -1}); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::ShapeMismatch);
  CHECK(e->subject() == "[2, -1]");
  e = test::catchError<GraphError>([] { numElements({int64_t{1} << 40, int64_t{1} << 40}); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::ShapeMismatch);
}

TEST_CASE("a graph needs a positive replication factor") {
  auto e = test::catchError<GraphError>([] { Graph g(0); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::InvalidOperand);
  CHECK(e->subject() == "Graph");
  CHECK(Graph(4).replicationFactor() == 4);
}

TEST_CASE("tensors are found by name; unknown names and ids are errors") {
  Graph g;
  const Tensor x = ops::input(g, "x", {2, 3});
  CHECK(g.find("x") == x.id());
  CHECK(g.tryFind("y") == std::nullopt);
  auto e = test::catchError<GraphError>([&] { g.find("y"); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::UnknownTensor);
  CHECK(e->subject() == "y");
  e = test::catchError<GraphError>([&] { g.tensor(17); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::UnknownTensor);
  CHECK(e->subject() == "tensor #17");
  e = test::catchError<GraphError>([&] { g.addOp(OpKind::Relu, {42}); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::UnknownTensor);
  CHECK(e->subject() == "Relu");
}

TEST_CASE("names are unique: duplicates are errors, generated names get suffixes") {
  Graph g;
  const Tensor x = ops::input(g, "x", {2});
  auto e = test::catchError<GraphError>([&] { ops::input(g, "x", {3}); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::DuplicateTensorName);
  CHECK(e->subject() == "x");
  const Tensor a = ops::relu(x);
  const Tensor b = ops::relu(x);
  const Tensor c = ops::relu(x);
  CHECK(a.name() == "Relu");
  CHECK(b.name() == "Relu.1");
  CHECK(c.name() == "Relu.2");
  CHECK(g.uniqueName("x") == "x.1");
  g.rename(a.id(), "hidden");
  CHECK(g.find("hidden") == a.id());
  CHECK_FALSE(g.tryFind("Relu"));
  e = test::catchError<GraphError>([&] { g.rename(b.id(), "x"); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::DuplicateTensorName);
  CHECK(e->subject() == "x");
}

TEST_CASE("producers and consumers are linked") {
  Graph g;
  const Tensor x = ops::input(g, "x", {2});
  const Tensor y = ops::relu(x);
  const Tensor z = ops::add(x, y);
  CHECK(toString(g.op(producerOf(y)).kind) == std::string_view("Relu"));
  CHECK(toString(g.op(producerOf(x)).kind) == std::string_view("Input"));
  CHECK(x.node().consumers == std::vector<OpId>{producerOf(y), producerOf(z)});
  CHECK(g.op(producerOf(z)).inputs == std::vector<TensorId>{x.id(), y.id()});
}

TEST_CASE("the schedule respects data flow and explicit after edges") {
  Graph g;
  const Tensor x = ops::input(g, "x", {2});
  const Tensor a = ops::relu(x);
  const Tensor b = ops::neg(x);
  const Tensor c = ops::add(a, b);
  // Without constraints, creation order among ready ops.
  std::vector<OpId> order = g.schedule();
  CHECK(order.size() == g.ops().size());
  auto at = positions(g, order);
  CHECK(at[static_cast<std::size_t>(producerOf(x))] < at[static_cast<std::size_t>(producerOf(a))]);
  CHECK(at[static_cast<std::size_t>(producerOf(a))] < at[static_cast<std::size_t>(producerOf(b))]);
  CHECK(at[static_cast<std::size_t>(producerOf(b))] < at[static_cast<std::size_t>(producerOf(c))]);
  // An after edge reverses the two independent ops.
  g.addAfter(producerOf(a), producerOf(b));
  at = positions(g, g.schedule());
  CHECK(at[static_cast<std::size_t>(producerOf(b))] < at[static_cast<std::size_t>(producerOf(a))]);
  CHECK(at[static_cast<std::size_t>(producerOf(a))] < at[static_cast<std::size_t>(producerOf(c))]);
}

TEST_CASE("a cycle of after edges is rejected naming an op on it") {
  Graph g;
  const Tensor x = ops::input(g, "x", {2});
  const Tensor a = ops::relu(x);
  const Tensor b = ops::neg(a);
  g.addAfter(producerOf(a), producerOf(b));
  auto e = test::catchError<GraphError>([&] { g.schedule(); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::InvalidProgramOrder);
  CHECK(e->subject() == a.name());
  auto bad = test::catchError<GraphError>([&] { g.addAfter(producerOf(a), 99); });
  REQUIRE(bad);
  CHECK(bad->code() == ErrorCode::InvalidOperand);
  CHECK(bad->subject() == "op #99");
}

TEST_CASE("InSequence orders independent ops in creation order and nests") {
  Graph g;
  const Tensor x = ops::input(g, "x", {2});
  const Tensor y = ops::input(g, "y", {2});
  Tensor late;
  Tensor early;
  {
    InSequence sequence(g);
    late = ops::relu(y);
    {
      InSequence inner(g);
      early = ops::relu(x);
    }
  }
  // Outside the sequence, a new independent op is unconstrained.
  const Tensor free = ops::neg(x);
  const OpNode& earlyOp = g.op(producerOf(early));
  CHECK(std::find(earlyOp.after.begin(), earlyOp.after.end(), producerOf(late)) != earlyOp.after.end());
  CHECK(g.op(producerOf(free)).after.empty());
  auto e = test::catchError<GraphError>([&] { g.endSequence(); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::InvalidProgramOrder);
  CHECK(e->subject() == "endSequence");
}

TEST_CASE("an in-place op runs after earlier readers and before later readers of the same storage") {
  Graph g;
  const Tensor w = ops::variable(g, "w", {1, 2}, {2});
  const Tensor d = ops::input(g, "d", {2});
  const Tensor before = ops::mul(w, d);  // reads the old w
  const Tensor updated = ops::scaledAddInplace(w, d, 1.0, -0.5);
  const Tensor afterRead = ops::neg(w);  // created later: sees the new w
  CHECK(updated.node().aliasOf == w.id());
  CHECK(g.storageOf(updated.id()) == w.id());
  const auto at = positions(g, g.schedule());
  CHECK(at[static_cast<std::size_t>(producerOf(before))] < at[static_cast<std::size_t>(producerOf(updated))]);
  CHECK(at[static_cast<std::size_t>(producerOf(updated))] <
        at[static_cast<std::size_t>(producerOf(afterRead))]);
  // The constraint exists as an after edge, not only by creation order.
  const OpNode& readOp = g.op(producerOf(afterRead));
  CHECK(std::find(readOp.after.begin(), readOp.after.end(), producerOf(updated)) != readOp.after.end());
}

TEST_CASE("remote loads and stores on one buffer keep creation order") {
  Graph g;
  const RemoteBuffer buffer = ops::remoteBuffer(g, {2}, DType::Float32, 1);
  const Tensor x = ops::input(g, "x", {2});
  ops::remoteStore(g, buffer, 0, x);
  const OpId store = static_cast<OpId>(g.ops().size()) - 1;
  const Tensor loaded = ops::remoteLoad(g, buffer, 0);
  const OpNode& load = g.op(producerOf(loaded));
  CHECK(std::find(load.after.begin(), load.after.end(), store) != load.after.end());
}

TEST_CASE("scheduling many ops is fast enough for large graphs") {
  // Many variables each feeding one op: naming and scheduling stay near-linear.
  Graph g;
  Tensor acc = ops::input(g, "x", {1});
  for (int i = 0; i < 20000; ++i) {
    const Tensor v = ops::variable(g, "w" + std::to_string(i), {1.0f}, {1});
    acc = ops::add(acc, v);
  }
  CHECK(g.schedule().size() == g.ops().size());
  CHECK(g.find("w19999") >= 0);
}
