// Float16 in the IR: which ops take float16 operands, the dtypes of their
// outputs, the refusal of float16 beside float32, the casts and their
// gradients, and autodiff through float16 graphs.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "half.hpp"
#include "tessera/lib/autodiff.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

constexpr DType kF16 = DType::Float16;
constexpr DType kF32 = DType::Float32;

// Float16 inputs a [2, 3], b [3, 4], v [3], s [], an image [2, 2, 5, 5],
// filters [3, 2, 3, 3], a float32 twin of a, and int32 labels [2].
struct Fixture {
  Graph g{4};
  Tensor a = ops::input(g, "a", {2, 3}, kF16);
  Tensor b = ops::input(g, "b", {3, 4}, kF16);
  Tensor v = ops::input(g, "v", {3}, kF16);
  Tensor s = ops::input(g, "s", {}, kF16);
  Tensor image = ops::input(g, "image", {2, 2, 5, 5}, kF16);
  Tensor filters = ops::input(g, "filters", {3, 2, 3, 3}, kF16);
  Tensor a32 = ops::input(g, "a32", {2, 3}, kF32);
  Tensor labels = ops::input(g, "labels", {2}, DType::Int32);
};

struct DTypeCase {
  std::string name;
  std::function<Tensor(Fixture&)> build;
  DType dtype;
};

struct MixCase {
  std::string name;
  std::function<void(Fixture&)> build;
  std::string f16Name;
  std::string f32Name;
};

}  // namespace

TEST_CASE("every op family takes float16 operands and its float outputs follow them") {
  const std::vector<DTypeCase> cases = {
      {"matmul", [](Fixture& f) { return ops::matmul(f.a, f.b); }, kF16},
      {"batched matmul",
       [](Fixture& f) {
         return ops::batchMatmul(ops::input(f.g, "x", {5, 2, 3}, kF16), ops::input(f.g, "y", {5, 3, 4}, kF16));
       },
       kF16},
      {"add with broadcasting", [](Fixture& f) { return ops::add(f.a, f.v); }, kF16},
      {"div by a scalar", [](Fixture& f) { return ops::div(f.a, f.s); }, kF16},
      {"pow", [](Fixture& f) { return ops::pow(f.a, f.s); }, kF16},
      {"gelu", [](Fixture& f) { return ops::gelu(f.a); }, kF16},
      {"clip", [](Fixture& f) { return ops::clip(f.a, -1.0, 1.0); }, kF16},
      {"scalar of the same dtype", [](Fixture& f) { return ops::mul(f.a, ops::scalar(f.g, 0.5, kF16)); }, kF16},
      {"reduce mean", [](Fixture& f) { return ops::reduceMean(f.a, {1}); }, kF16},
      {"softmax", [](Fixture& f) { return ops::softmax(f.a); }, kF16},
      {"log softmax", [](Fixture& f) { return ops::logSoftmax(f.a); }, kF16},
      {"argmax is int32", [](Fixture& f) { return ops::argmax(f.a); }, DType::Int32},
      {"cross entropy of float16 logits", [](Fixture& f) { return ops::softmaxCrossEntropy(f.a, f.labels); },
       kF16},
      {"gather rows", [](Fixture& f) { return ops::gather(f.b, f.labels); }, kF16},
      {"conv", [](Fixture& f) { return ops::conv(f.image, f.filters); }, kF16},
      {"conv transpose",
       [](Fixture& f) { return ops::convTranspose(f.image, ops::input(f.g, "wt", {2, 3, 3, 3}, kF16)); }, kF16},
      {"max pool", [](Fixture& f) { return ops::maxPool(f.image, {.kernel = {2, 2}}); }, kF16},
      {"average pool", [](Fixture& f) { return ops::averagePool(f.image, {.kernel = {2, 2}}); }, kF16},
      {"global average pool", [](Fixture& f) { return ops::globalAveragePool(f.image); }, kF16},
      {"reshape", [](Fixture& f) { return ops::reshape(f.a, {3, 2}); }, kF16},
      {"transpose", [](Fixture& f) { return ops::transpose(f.a); }, kF16},
      {"slice", [](Fixture& f) { return ops::slice(f.a, {0, 1}, {2, 3}); }, kF16},
      {"concat", [](Fixture& f) { return ops::concat({f.a, f.a}, 0); }, kF16},
      {"broadcastTo", [](Fixture& f) { return ops::broadcastTo(f.v, {4, 3}); }, kF16},
      {"copy", [](Fixture& f) { return ops::copy(f.a); }, kF16},
      {"scaled add in place",
       [](Fixture& f) { return ops::scaledAddInplace(ops::copy(f.a), f.v, 0.5, 2.0); }, kF16},
      {"comparisons give float32 masks", [](Fixture& f) { return ops::less(f.a, f.v); }, kF32},
      {"logic on a float16 mask", [](Fixture& f) { return ops::logicalNot(f.a); }, kF32},
      {"where with a float32 mask selects float16 values",
       [](Fixture& f) { return ops::where(ops::greater(f.a, f.s), f.a, f.v); }, kF16},
      {"where with a float16 mask", [](Fixture& f) { return ops::where(f.a, f.a, f.s); }, kF16},
      {"dropout",
       [](Fixture& f) { return ops::dropout(f.a, ops::input(f.g, "step", {}, DType::Int32), 0.25); }, kF16},
      {"all-reduce", [](Fixture& f) { return ops::replicatedAllReduce(f.a); }, kF16},
      {"reduce-scatter", [](Fixture& f) { return ops::replicatedReduceScatter(f.a); }, kF16},
      {"all-gather of a shard",
       [](Fixture& f) { return ops::replicatedAllGather(ops::replicatedReduceScatter(f.a)); }, kF16},
      {"sharded slice", [](Fixture& f) { return ops::replicaShardedSlice(f.a); }, kF16},
      {"remote load",
       [](Fixture& f) { return ops::remoteLoad(f.g, ops::remoteBuffer(f.g, {2, 3}, kF16)); }, kF16},
  };
  for (const DTypeCase& c : cases) {
    CAPTURE(c.name);
    Fixture f;
    const Tensor out = c.build(f);
    CHECK(out.dtype() == c.dtype);
  }
}

TEST_CASE("float16 beside float32 in one op is DTypeMismatch naming both tensors") {
  const std::vector<MixCase> cases = {
      {"matmul", [](Fixture& f) { ops::matmul(f.a32, f.b); }, "b", "a32"},
      {"add", [](Fixture& f) { ops::add(f.a, f.a32); }, "a", "a32"},
      {"div", [](Fixture& f) { ops::div(f.a32, f.s); }, "s", "a32"},
      {"a float32 scalar", [](Fixture& f) { ops::mul(f.a, ops::input(f.g, "half", {})); }, "a", "half"},
      {"conv",
       [](Fixture& f) { ops::conv(ops::input(f.g, "image32", {2, 2, 5, 5}), f.filters); }, "filters",
       "image32"},
      {"where's two values", [](Fixture& f) { ops::where(f.a, f.a, f.a32); }, "a", "a32"},
      {"comparison", [](Fixture& f) { ops::equal(f.a, f.a32); }, "a", "a32"},
      {"concat", [](Fixture& f) { ops::concat({f.a, f.a32}, 0); }, "a", "a32"},
      {"copy in place", [](Fixture& f) { ops::copyInplace(f.a32, f.a); }, "a", "a32"},
      {"scaled add in place", [](Fixture& f) { ops::scaledAddInplace(f.a, f.a32); }, "a", "a32"},
  };
  for (const MixCase& c : cases) {
    CAPTURE(c.name);
    Fixture f;
    const auto e = test::catchError<GraphError>([&] { c.build(f); });
    REQUIRE(e.has_value());
    CHECK(e->code() == ErrorCode::DTypeMismatch);
    CHECK(errorId(e->code()) == "tessera.graph.212");
    const std::string message = e->what();
    CHECK(message.find('"' + c.f16Name + '"') != std::string::npos);
    CHECK(message.find('"' + c.f32Name + '"') != std::string::npos);
    CHECK(message.find("float16") != std::string::npos);
    CHECK(message.find("float32") != std::string::npos);
    CHECK(message.find("cast") != std::string::npos);
  }
}

TEST_CASE("int32 operands keep their own checks beside float16") {
  Fixture f;
  // Labels and indices stay int32.
  CHECK(ops::gather(f.b, f.labels).dtype() == kF16);
  TESSERA_CHECK_ERROR(ops::gather(f.b, f.a), GraphError, ErrorCode::InvalidOperand);
  // Int32 is not a float: an int32 operand beside float16 is InvalidOperand.
  TESSERA_CHECK_ERROR(ops::add(f.v, ops::castToInt32(f.v)), GraphError, ErrorCode::InvalidOperand);
  TESSERA_CHECK_ERROR(ops::relu(f.labels), GraphError, ErrorCode::InvalidOperand);
}

TEST_CASE("casts between float32, float16 and int32") {
  Fixture f;
  const Tensor h = ops::cast(f.a32, kF16);
  CHECK(h.dtype() == kF16);
  CHECK(h.node().shape == Shape{2, 3});
  CHECK(f.g.op(h.node().producer).kind == OpKind::CastToFloat16);
  const Tensor back = ops::cast(h, kF32);
  CHECK(back.dtype() == kF32);
  CHECK(f.g.op(back.node().producer).kind == OpKind::CastToFloat32);
  CHECK(ops::castToFloat32(f.a).dtype() == kF32);
  const Tensor ints = ops::cast(f.a, DType::Int32);
  CHECK(ints.dtype() == DType::Int32);
  CHECK(f.g.op(ints.node().producer).kind == OpKind::CastToInt32);
  CHECK(ops::cast(ints, kF32).dtype() == kF32);
  // A cast to the tensor's own dtype is the tensor.
  CHECK(ops::cast(f.a, kF16).id() == f.a.id());
  CHECK(ops::cast(f.labels, DType::Int32).id() == f.labels.id());
  // Int32 goes to float16 through float32 only.
  TESSERA_CHECK_ERROR(ops::cast(f.labels, kF16), GraphError, ErrorCode::InvalidOperand);
  TESSERA_CHECK_ERROR(ops::castToFloat32(f.a32), GraphError, ErrorCode::InvalidOperand);
  // A shard stays a shard through a cast.
  const Tensor shard = ops::replicatedReduceScatter(f.a32);
  CHECK(ops::cast(shard, kF16).node().metaShape == Shape{2, 3});
}

TEST_CASE("float16 sources: inputs, variables, sharded variables, constants and scalars") {
  Graph g(2);
  const Tensor w = ops::variable(g, "w", {1.0f, 2.0f, 3.0f}, {3}, std::nullopt, RetrievalMode::OnePerGroup,
                                 TensorCategory::Weight, kF16);
  CHECK(w.dtype() == kF16);
  const ShardedVariable sharded = ops::replicaShardedVariable(g, "ws", std::vector<float>(6, 0.5f), {2, 3},
                                                              std::nullopt, std::nullopt,
                                                              TensorCategory::Weight, kF16);
  CHECK(sharded.variable.dtype() == kF16);
  CHECK(sharded.variable.shape() == Shape{3});
  const RemoteBuffer buffer = ops::remoteBuffer(g, {3}, kF16);
  const Tensor remote = ops::remoteReplicaShardedVariable(g, "wr", std::vector<float>(6, 0.25f), {2, 3}, buffer);
  CHECK(remote.dtype() == kF16);
  // Constants hold their values rounded to half (nearest, ties to even).
  const Tensor c = ops::constant(g, "c", {0.1f, 65519.0f, 65520.0f, 1.0f + 1.0f / 4096.0f}, {4}, kF16);
  REQUIRE(c.node().data.size() == 4);
  CHECK(c.node().data[0] == roundToHalf(0.1f));
  CHECK(c.node().data[0] != 0.1f);
  CHECK(c.node().data[1] == 65504.0f);
  CHECK(std::isinf(c.node().data[2]));
  CHECK(c.node().data[3] == 1.0f);  // the tie goes to the even half
  const Tensor s = ops::scalar(g, 0.1, kF16);
  CHECK(s.dtype() == kF16);
  CHECK(s.node().data[0] == roundToHalf(0.1f));
  CHECK(ops::scalar(g, 0.1).dtype() == kF32);
}

TEST_CASE("autodiff of a float16 graph: the seed has the loss's dtype, gradients their tensor's") {
  Graph g;
  const Tensor x = ops::input(g, "x", {4, 3}, kF16);
  const Tensor w = ops::variable(g, "w", std::vector<float>(12, 0.1f), {3, 4}, std::nullopt,
                                 RetrievalMode::OnePerGroup, TensorCategory::Weight, kF16);
  const Tensor bias = ops::variable(g, "bias", std::vector<float>(4, 0.0f), {4}, std::nullopt,
                                    RetrievalMode::OnePerGroup, TensorCategory::Weight, kF16);
  const Tensor labels = ops::input(g, "labels", {4}, DType::Int32);
  const Tensor h = ops::add(ops::matmul(x, w), bias);
  const Tensor act = ops::sqrt(ops::add(ops::mul(h, h), ops::scalar(g, 1.0, kF16)));
  const Tensor loss = ops::softmaxCrossEntropy(ops::where(ops::greater(act, bias), act, h), labels);
  REQUIRE(loss.dtype() == kF16);
  const std::vector<Tensor> grads = autodiff(g, loss, {w, bias, x});
  REQUIRE(grads.size() == 3);
  for (const Tensor& grad : grads) CHECK(grad.dtype() == kF16);
  CHECK(grads[0].shape() == Shape{3, 4});
  CHECK(grads[1].shape() == Shape{4});
  // Every tensor autodiff added is float16 except the masks.
  for (const TensorNode& t : g.tensors()) {
    if (t.producer != kNoOp && g.op(t.producer).kind == OpKind::Greater) continue;
    if (t.dtype == DType::Int32) continue;
    CAPTURE(t.name);
    CHECK(t.dtype == kF16);
  }
}

TEST_CASE("autodiff through casts: the gradient of a cast is the cast back") {
  Graph g;
  const Tensor master = ops::variable(g, "master", std::vector<float>(6, 0.5f), {2, 3});
  const Tensor x = ops::input(g, "x", {4, 2}, kF16);
  const Tensor w16 = ops::cast(master, kF16);
  const Tensor y = ops::matmul(x, w16);
  const Tensor loss = ops::reduceSum(ops::cast(y, kF32));
  REQUIRE(loss.dtype() == kF32);
  const std::vector<Tensor> grads = autodiff(g, loss, {master, w16});
  CHECK(grads[0].dtype() == kF32);
  CHECK(grads[1].dtype() == kF16);
  CHECK(g.op(grads[0].node().producer).kind == OpKind::CastToFloat32);
  // A mixed-precision step that forgot the cast names both tensors.
  TESSERA_CHECK_ERROR(ops::matmul(x, master), GraphError, ErrorCode::DTypeMismatch);
  // Int32 casts stop gradients: a tensor reached only through them gets zeros
  // of its own dtype.
  Graph g2;
  const Tensor v = ops::variable(g2, "v", {1.0f, 2.0f}, {2}, std::nullopt, RetrievalMode::OnePerGroup,
                                 TensorCategory::Weight, kF16);
  const Tensor viaInts = ops::reduceSum(ops::castToFloat32(ops::castToInt32(v)));
  const std::vector<Tensor> none = autodiff(g2, viaInts, {v});
  REQUIRE(none.size() == 1);
  CHECK(none[0].dtype() == kF16);
  CHECK(g2.op(none[0].node().producer).kind == OpKind::Constant);
}

TEST_CASE("autodiff refuses int32 losses and weights, naming float16 as allowed") {
  Graph g;
  const Tensor n = ops::input(g, "n", {}, DType::Int32);
  const auto e = test::catchError<AutodiffError>([&] { autodiff(g, n, {}); });
  REQUIRE(e.has_value());
  CHECK(e->code() == ErrorCode::LossNotScalar);
  CHECK(std::string(e->what()).find("float16") != std::string::npos);
}
