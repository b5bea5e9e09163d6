#include "tessera/lib/ops.hpp"

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "tessera/lib/error.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

// A graph of 4 replicas with float inputs a [2, 3], b [3, 4], v [3], s [] and
// int32 labels [2].
struct Fixture {
  Graph g{4};
  Tensor a = ops::input(g, "a", {2, 3});
  Tensor b = ops::input(g, "b", {3, 4});
  Tensor v = ops::input(g, "v", {3});
  Tensor s = ops::input(g, "s", {});
  Tensor labels = ops::input(g, "labels", {2}, DType::Int32);
};

struct ShapeCase {
  std::string name;
  std::function<Tensor(Fixture&)> build;
  Shape shape;
  DType dtype = DType::Float32;
  Shape metaShape = {};
};

struct ErrorCase {
  std::string name;
  std::function<void(Fixture&)> build;
  ErrorCode code;
  std::string subject;
};

}  // namespace

TEST_CASE("shape inference of every op") {
  const ReplicaGrouping pairs(4, 1, 2);
  const std::vector<ShapeCase> cases = {
      {"matmul", [](Fixture& f) { return ops::matmul(f.a, f.b); }, {2, 4}},
      {"gather rows of a table", [](Fixture& f) { return ops::gather(f.b, f.labels); }, {2, 4}},
      {"gather by a matrix of indices",
       [](Fixture& f) {
         return ops::gather(f.v, ops::input(f.g, "ids", {2, 5}, DType::Int32));
       },
       {2, 5}},
      {"gather along axis 1 by a matrix of indices",
       [](Fixture& f) {
         return ops::gather(ops::input(f.g, "t", {3, 7, 4}), ops::input(f.g, "ids", {2, 5}, DType::Int32), 1);
       },
       {3, 2, 5, 4}},
      {"gather along the last axis (-1) by a scalar index",
       [](Fixture& f) {
         return ops::gather(ops::input(f.g, "t", {3, 7, 4}), ops::input(f.g, "id", {}, DType::Int32), -1);
       },
       {3, 7}},
      {"batched matmul",
       [](Fixture& f) {
         return ops::matmul(ops::input(f.g, "x", {5, 2, 3}), f.b);
       },
       {5, 2, 4}},
      {"conv 2-D with groups, strides, pads and dilations",
       [](Fixture& f) {
         return ops::conv(ops::input(f.g, "img", {2, 4, 9, 8}), ops::input(f.g, "k", {6, 2, 3, 2}),
                          {.strides = {2, 3}, .pads = {1, 0, 1, 2}, .dilations = {1, 2}, .group = 2});
       },
       {2, 6, 5, 3}},
      {"conv 1-D and 3-D",
       [](Fixture& f) {
         ops::conv(ops::input(f.g, "seq", {3, 2, 10}), ops::input(f.g, "k1", {4, 2, 3}));
         return ops::conv(ops::input(f.g, "vol", {1, 2, 4, 5, 6}), ops::input(f.g, "k3", {3, 2, 2, 2, 2}));
       },
       {1, 3, 3, 4, 5}},
      {"convTranspose with output padding",
       [](Fixture& f) {
         return ops::convTranspose(
             ops::input(f.g, "img", {2, 4, 3, 3}), ops::input(f.g, "k", {4, 3, 3, 3}),
             {.strides = {2, 2}, .pads = {1, 1, 1, 1}, .group = 2, .outputPadding = {1, 0}});
       },
       {2, 6, 6, 5}},
      {"maxPool with ceil mode",
       [](Fixture& f) {
         return ops::maxPool(ops::input(f.g, "img", {2, 3, 5, 5}),
                             {.kernel = {2, 2}, .strides = {2, 2}, .ceilMode = true});
       },
       {2, 3, 3, 3}},
      {"averagePool with pads",
       [](Fixture& f) {
         return ops::averagePool(ops::input(f.g, "img", {2, 3, 5}), {.kernel = {3}, .pads = {1, 1}});
       },
       {2, 3, 5}},
      {"global pools keep the spatial axes as ones",
       [](Fixture& f) {
         ops::globalMaxPool(ops::input(f.g, "vol", {2, 3, 4, 5, 6}));
         return ops::globalAveragePool(ops::input(f.g, "img", {2, 3, 4, 5}));
       },
       {2, 3, 1, 1}},
      {"add a row", [](Fixture& f) { return ops::add(f.a, f.v); }, {2, 3}},
      {"sub a scalar", [](Fixture& f) { return ops::sub(f.s, f.a); }, {2, 3}},
      {"mul outer",
       [](Fixture& f) {
         return ops::mul(ops::reshape(f.v, {3, 1}), ops::input(f.g, "r", {1, 4}));
       },
       {3, 4}},
      {"div", [](Fixture& f) { return ops::div(f.a, f.a); }, {2, 3}},
      {"neg", [](Fixture& f) { return ops::neg(f.a); }, {2, 3}},
      {"relu", [](Fixture& f) { return ops::relu(f.a); }, {2, 3}},
      {"gelu", [](Fixture& f) { return ops::gelu(f.a); }, {2, 3}},
      {"tanh", [](Fixture& f) { return ops::tanh(f.a); }, {2, 3}},
      {"sigmoid", [](Fixture& f) { return ops::sigmoid(f.a); }, {2, 3}},
      {"exp", [](Fixture& f) { return ops::exp(f.a); }, {2, 3}},
      {"log", [](Fixture& f) { return ops::log(f.a); }, {2, 3}},
      {"sqrt", [](Fixture& f) { return ops::sqrt(f.a); }, {2, 3}},
      {"softmax", [](Fixture& f) { return ops::softmax(f.a); }, {2, 3}},
      {"logSoftmax", [](Fixture& f) { return ops::logSoftmax(f.a); }, {2, 3}},
      {"softmaxCrossEntropy", [](Fixture& f) { return ops::softmaxCrossEntropy(f.a, f.labels); }, {}},
      {"reduceSum all", [](Fixture& f) { return ops::reduceSum(f.a); }, {}},
      {"reduceSum axis -1", [](Fixture& f) { return ops::reduceSum(f.a, {-1}); }, {2}},
      {"reduceMean keepDims", [](Fixture& f) { return ops::reduceMean(f.a, {0}, true); }, {1, 3}},
      {"reshape with -1",
       [](Fixture& f) {
         return ops::reshape(f.b, {-1, 2});
       },
       {6, 2}},
      {"transpose", [](Fixture& f) { return ops::transpose(f.a); }, {3, 2}},
      {"transpose perm",
       [](Fixture& f) {
         return ops::transpose(ops::input(f.g, "x", {2, 3, 4}), {1, 2, 0});
       },
       {3, 4, 2}},
      {"slice",
       [](Fixture& f) {
         return ops::slice(f.b, {1, 0}, {3, 2});
       },
       {2, 2}},
      {"concat",
       [](Fixture& f) {
         return ops::concat({f.a, f.a, ops::input(f.g, "x", {1, 3})}, 0);
       },
       {5, 3}},
      {"concat negative axis",
       [](Fixture& f) {
         return ops::concat({f.a, f.a}, -1);
       },
       {2, 6}},
      {"broadcastTo",
       [](Fixture& f) {
         return ops::broadcastTo(f.v, {4, 2, 3});
       },
       {4, 2, 3}},
      {"scaledAddInplace", [](Fixture& f) { return ops::scaledAddInplace(f.a, f.v, 0.5, 2.0); }, {2, 3}},
      {"copy", [](Fixture& f) { return ops::copy(f.labels); }, {2}, DType::Int32},
      {"copyInplace", [](Fixture& f) { return ops::copyInplace(f.a, f.a); }, {2, 3}},
      {"argmax", [](Fixture& f) { return ops::argmax(f.a); }, {2}, DType::Int32},
      {"int32 add", [](Fixture& f) { return ops::add(f.labels, f.labels); }, {2}, DType::Int32},
      {"less broadcasts to a float mask", [](Fixture& f) { return ops::less(f.a, f.v); }, {2, 3}},
      {"equal of int32 is a float mask", [](Fixture& f) { return ops::equal(f.labels, f.labels); }, {2}},
      {"where broadcasts all three",
       [](Fixture& f) {
         return ops::where(ops::greater(f.v, f.s), ops::input(f.g, "col", {2, 1}), f.s);
       },
       {2, 3}},
      {"castToInt32", [](Fixture& f) { return ops::castToInt32(f.a); }, {2, 3}, DType::Int32},
      {"castToFloat32", [](Fixture& f) { return ops::castToFloat32(f.labels); }, {2}},
      {"where of int32 values",
       [](Fixture& f) { return ops::where(f.s, f.labels, f.labels); },
       {2},
       DType::Int32},
      {"allReduce", [](Fixture& f) { return ops::replicatedAllReduce(f.a); }, {2, 3}},
      {"reduceScatter over 4",
       [](Fixture& f) { return ops::replicatedReduceScatter(f.b); },
       {3},
       DType::Float32,
       {3, 4}},
      {"reduceScatter over pairs with padding",
       [&](Fixture& f) { return ops::replicatedReduceScatter(f.v, ReductionType::Sum, pairs); },
       {2},
       DType::Float32,
       {3}},
      {"allGather to the metaShape",
       [](Fixture& f) { return ops::replicatedAllGather(ops::replicatedReduceScatter(f.b)); },
       {3, 4}},
      {"allGather concatenates without metaShape",
       [&](Fixture& f) { return ops::replicatedAllGather(ops::input(f.g, "x", {5}), pairs); },
       {10}},
      {"allGather to an explicit shape",
       [](Fixture& f) { return ops::replicatedAllGather(ops::input(f.g, "x", {2}), std::nullopt, {7}); },
       {7}},
      {"replicaShardedSlice",
       [](Fixture& f) { return ops::replicaShardedSlice(f.a); },
       {2},
       DType::Float32,
       {2, 3}},
      {"remoteLoad",
       [](Fixture& f) {
         return ops::remoteLoad(f.g, ops::remoteBuffer(f.g, {4, 2}, DType::Int32, 3), 2);
       },
       {4, 2},
       DType::Int32},
  };
  for (const ShapeCase& c : cases) {
    CAPTURE(c.name);
    Fixture f;
    const Tensor t = c.build(f);
    CHECK(t.shape() == c.shape);
    CHECK(toString(t.dtype()) == toString(c.dtype));
    CHECK(t.metaShape() == c.metaShape);
  }
}

TEST_CASE("every misuse is a GraphError naming the op or tensor") {
  const ReplicaGrouping pairs(4, 1, 2);
  const std::vector<ErrorCase> cases = {
      {"matmul inner dims", [](Fixture& f) { ops::matmul(f.b, f.a); }, ErrorCode::ShapeMismatch, "MatMul"},
      {"matmul of a vector", [](Fixture& f) { ops::matmul(f.v, f.b); }, ErrorCode::ShapeMismatch, "MatMul"},
      {"batchMatmul of matrices", [](Fixture& f) { ops::batchMatmul(f.a, f.b); }, ErrorCode::ShapeMismatch,
       "BatchMatMul"},
      {"batchMatmul with other batches",
       [](Fixture& f) {
         ops::batchMatmul(ops::input(f.g, "p", {2, 2, 3}), ops::input(f.g, "q", {3, 3, 4}));
       },
       ErrorCode::ShapeMismatch, "BatchMatMul"},
      {"add not broadcastable", [](Fixture& f) { ops::add(f.a, f.b); }, ErrorCode::ShapeMismatch, "Add"},
      {"mul float by int", [](Fixture& f) { ops::mul(f.v, f.labels); }, ErrorCode::InvalidOperand, "Mul"},
      {"div of ints", [](Fixture& f) { ops::div(f.labels, f.labels); }, ErrorCode::InvalidOperand, "Div"},
      {"relu of int", [](Fixture& f) { ops::relu(f.labels); }, ErrorCode::InvalidOperand, "Relu"},
      {"erf of int", [](Fixture& f) { ops::erf(f.labels); }, ErrorCode::InvalidOperand, "Erf"},
      {"gather by float indices", [](Fixture& f) { ops::gather(f.a, f.v); }, ErrorCode::InvalidOperand,
       "Gather"},
      {"gather from a scalar", [](Fixture& f) { ops::gather(f.s, f.labels); }, ErrorCode::ShapeMismatch,
       "Gather"},
      {"gather along an axis the table does not have", [](Fixture& f) { ops::gather(f.a, f.labels, 2); },
       ErrorCode::InvalidAxis, "Gather"},
      {"conv with a rank mismatch",
       [](Fixture& f) {
         ops::conv(ops::input(f.g, "img", {2, 4, 9, 8}), ops::input(f.g, "k", {6, 4, 3}));
       },
       ErrorCode::ShapeMismatch, "Conv"},
      {"conv of a matrix", [](Fixture& f) { ops::conv(f.a, f.b); }, ErrorCode::ShapeMismatch, "Conv"},
      {"conv channels not divisible by groups",
       [](Fixture& f) {
         ops::conv(ops::input(f.g, "img", {2, 3, 9, 8}), ops::input(f.g, "k", {6, 1, 3, 3}), {.group = 2});
       },
       ErrorCode::InvalidOperand, "Conv"},
      {"conv weight of other channels",
       [](Fixture& f) {
         ops::conv(ops::input(f.g, "img", {2, 4, 9, 8}), ops::input(f.g, "k", {6, 3, 3, 3}));
       },
       ErrorCode::ShapeMismatch, "Conv"},
      {"conv kernel larger than the padded input",
       [](Fixture& f) {
         ops::conv(ops::input(f.g, "img", {2, 4, 4, 4}), ops::input(f.g, "k", {6, 4, 5, 3}),
                   {.pads = {0, 0, 0, 0}});
       },
       ErrorCode::ShapeMismatch, "Conv"},
      {"conv with pads for the wrong number of axes",
       [](Fixture& f) {
         ops::conv(ops::input(f.g, "img", {2, 4, 9, 8}), ops::input(f.g, "k", {6, 4, 3, 3}),
                   {.pads = {1, 1}});
       },
       ErrorCode::InvalidOperand, "Conv"},
      {"conv with a zero stride",
       [](Fixture& f) {
         ops::conv(ops::input(f.g, "img", {2, 4, 9, 8}), ops::input(f.g, "k", {6, 4, 3, 3}),
                   {.strides = {1, 0}});
       },
       ErrorCode::InvalidOperand, "Conv"},
      {"conv with output padding",
       [](Fixture& f) {
         ops::conv(ops::input(f.g, "img", {2, 4, 9, 8}), ops::input(f.g, "k", {6, 4, 3, 3}),
                   {.outputPadding = {1, 1}});
       },
       ErrorCode::InvalidOperand, "Conv"},
      {"convTranspose output padding not below the stride",
       [](Fixture& f) {
         ops::convTranspose(ops::input(f.g, "img", {2, 4, 3, 3}), ops::input(f.g, "k", {4, 3, 3, 3}),
                            {.strides = {2, 2}, .outputPadding = {2, 0}});
       },
       ErrorCode::InvalidOperand, "ConvTranspose"},
      {"convTranspose pads larger than the output",
       [](Fixture& f) {
         ops::convTranspose(ops::input(f.g, "img", {2, 4, 1, 1}), ops::input(f.g, "k", {4, 3, 1, 1}),
                            {.pads = {1, 0, 0, 0}});
       },
       ErrorCode::ShapeMismatch, "ConvTranspose"},
      {"maxPool without a kernel",
       [](Fixture& f) {
         ops::maxPool(ops::input(f.g, "img", {2, 3, 5, 5}), {});
       },
       ErrorCode::InvalidOperand, "MaxPool"},
      {"maxPool pads as large as the window",
       [](Fixture& f) {
         ops::maxPool(ops::input(f.g, "img", {2, 3, 5, 5}), {.kernel = {2, 2}, .pads = {2, 0, 0, 0}});
       },
       ErrorCode::InvalidOperand, "MaxPool"},
      {"averagePool window larger than the input",
       [](Fixture& f) {
         ops::averagePool(ops::input(f.g, "img", {2, 3, 5}), {.kernel = {6}});
       },
       ErrorCode::ShapeMismatch, "AveragePool"},
      {"pool of a rank-6 tensor",
       [](Fixture& f) {
         ops::averagePool(ops::input(f.g, "img", {1, 1, 2, 2, 2, 2}), {.kernel = {1, 1, 1, 1}});
       },
       ErrorCode::ShapeMismatch, "AveragePool"},
      {"clip with empty bounds", [](Fixture& f) { ops::clip(f.a, 1.0, -1.0); }, ErrorCode::InvalidOperand,
       "Clip"},
      {"pow not broadcastable", [](Fixture& f) { ops::pow(f.a, f.b); }, ErrorCode::ShapeMismatch, "Pow"},
      {"equal of float and int", [](Fixture& f) { ops::equal(f.v, f.labels); }, ErrorCode::InvalidOperand,
       "Equal"},
      {"greater not broadcastable", [](Fixture& f) { ops::greater(f.a, f.b); }, ErrorCode::ShapeMismatch,
       "Greater"},
      {"and of int32", [](Fixture& f) { ops::logicalAnd(f.labels, f.labels); }, ErrorCode::InvalidOperand,
       "And"},
      {"where with an int32 condition", [](Fixture& f) { ops::where(f.labels, f.v, f.v); },
       ErrorCode::InvalidOperand, "Where"},
      {"where of float and int", [](Fixture& f) { ops::where(f.s, f.a, f.labels); },
       ErrorCode::InvalidOperand, "Where"},
      {"dropout ratio of 1",
       [](Fixture& f) { ops::dropout(f.a, ops::constant(f.g, "k", {0}, {}, DType::Int32), 1.0); },
       ErrorCode::InvalidOperand, "Dropout"},
      {"dropout with a float step", [](Fixture& f) { ops::dropout(f.a, f.s, 0.5); },
       ErrorCode::InvalidOperand, "Dropout"},
      {"dropout with a vector step", [](Fixture& f) { ops::dropout(f.a, f.labels, 0.5); },
       ErrorCode::ShapeMismatch, "Dropout"},
      {"castToInt32 of int32", [](Fixture& f) { ops::castToInt32(f.labels); }, ErrorCode::InvalidOperand,
       "CastToInt32"},
      {"castToFloat32 of float32", [](Fixture& f) { ops::castToFloat32(f.a); }, ErrorCode::InvalidOperand,
       "CastToFloat32"},
      {"where not broadcastable", [](Fixture& f) { ops::where(f.a, f.b, f.s); }, ErrorCode::ShapeMismatch,
       "Where"},
      {"softmax of a scalar", [](Fixture& f) { ops::softmax(f.s); }, ErrorCode::ShapeMismatch, "Softmax"},
      {"cross-entropy float labels", [](Fixture& f) { ops::softmaxCrossEntropy(f.a, f.v); },
       ErrorCode::InvalidOperand, "SoftmaxCrossEntropy"},
      {"cross-entropy label count", [](Fixture& f) { ops::softmaxCrossEntropy(f.b, f.labels); },
       ErrorCode::ShapeMismatch, "SoftmaxCrossEntropy"},
      {"reduce axis out of range", [](Fixture& f) { ops::reduceSum(f.a, {2}); }, ErrorCode::InvalidAxis,
       "ReduceSum"},
      {"reduce axis twice",
       [](Fixture& f) {
         ops::reduceMean(f.a, {1, -1});
       },
       ErrorCode::InvalidAxis, "ReduceMean"},
      {"reshape element count",
       [](Fixture& f) {
         ops::reshape(f.a, {4, 2});
       },
       ErrorCode::ShapeMismatch, "Reshape"},
      {"reshape two -1",
       [](Fixture& f) {
         ops::reshape(f.b, {-1, -1});
       },
       ErrorCode::ShapeMismatch, "Reshape"},
      {"transpose not a permutation",
       [](Fixture& f) {
         ops::transpose(f.a, {0, 0});
       },
       ErrorCode::InvalidAxis, "Transpose"},
      {"slice past the end",
       [](Fixture& f) {
         ops::slice(f.a, {0, 1}, {2, 4});
       },
       ErrorCode::InvalidAxis, "Slice"},
      {"slice rank", [](Fixture& f) { ops::slice(f.a, {0}, {1}); }, ErrorCode::InvalidAxis, "Slice"},
      {"concat dims",
       [](Fixture& f) {
         ops::concat({f.a, f.b}, 0);
       },
       ErrorCode::ShapeMismatch, "Concat"},
      {"concat axis", [](Fixture& f) { ops::concat({f.a}, 2); }, ErrorCode::InvalidAxis, "Concat"},
      {"concat nothing", [](Fixture&) { ops::concat({}, 0); }, ErrorCode::InvalidOperand, "Concat"},
      {"broadcastTo smaller", [](Fixture& f) { ops::broadcastTo(f.a, {3}); }, ErrorCode::ShapeMismatch,
       "BroadcastTo"},
      {"scaledAdd y larger than x", [](Fixture& f) { ops::scaledAddInplace(f.v, f.a); },
       ErrorCode::ShapeMismatch, "ScaledAddInplace"},
      {"copyInplace shapes", [](Fixture& f) { ops::copyInplace(f.a, f.b); }, ErrorCode::ShapeMismatch,
       "CopyInplace"},
      {"argmax of a scalar", [](Fixture& f) { ops::argmax(f.s); }, ErrorCode::ShapeMismatch, "ArgMax"},
      {"empty handle", [](Fixture& f) { ops::add(f.a, Tensor{}); }, ErrorCode::InvalidOperand, "Add"},
      {"operands of two graphs",
       [](Fixture& f) {
         Graph other(4);
         ops::add(f.a, ops::input(other, "a", {2, 3}));
       },
       ErrorCode::InvalidOperand, "Add"},
      {"duplicate input name", [](Fixture& f) { ops::input(f.g, "a", {1}); }, ErrorCode::DuplicateTensorName,
       "a"},
      {"collective grouping of another replica count",
       [](Fixture& f) { ops::replicatedAllReduce(f.a, ReductionType::Sum, ReplicaGrouping(8, 1, 2)); },
       ErrorCode::InvalidCollective, "ReplicatedAllReduce"},
      {"allGather of a 2-D tensor", [](Fixture& f) { ops::replicatedAllGather(f.a); },
       ErrorCode::InvalidCollective, "ReplicatedAllGather"},
      {"allGather shard does not fit the shape",
       [](Fixture& f) { ops::replicatedAllGather(f.v, std::nullopt, {20}); }, ErrorCode::InvalidCollective,
       "ReplicatedAllGather"},
      {"allGather metaShape of another group size",
       [&](Fixture& f) { ops::replicatedAllGather(ops::replicatedReduceScatter(f.b), pairs); },
       ErrorCode::InvalidCollective, "ReplicatedAllGather"},
      {"remote buffer without entries", [](Fixture& f) { ops::remoteBuffer(f.g, {2}, DType::Float32, 0); },
       ErrorCode::InvalidRemoteBuffer, "remote buffer #0"},
      {"remote load past the last entry",
       [](Fixture& f) { ops::remoteLoad(f.g, ops::remoteBuffer(f.g, {2}, DType::Float32, 2), 2); },
       ErrorCode::InvalidRemoteBuffer, "RemoteLoad"},
      {"remote store of the wrong shape",
       [](Fixture& f) { ops::remoteStore(f.g, ops::remoteBuffer(f.g, {2}), 0, f.v); },
       ErrorCode::ShapeMismatch, "RemoteStore"},
      {"remote buffer of another graph",
       [](Fixture& f) {
         Graph other(4);
         ops::remoteLoad(f.g, ops::remoteBuffer(other, {2}), 0);
       },
       ErrorCode::InvalidRemoteBuffer, "RemoteLoad"},
  };
  for (const ErrorCase& c : cases) {
    CAPTURE(c.name);
    Fixture f;
    auto e = test::catchError<GraphError>([&] { c.build(f); });
    REQUIRE(e);
    INFO(e->what());
    CHECK(e->code() == c.code);
    CHECK(e->subject() == c.subject);
  }
}

TEST_CASE("error messages name the tensors, their shapes and what is allowed") {
  Fixture f;
  auto e = test::catchError<GraphError>([&] { ops::matmul(f.b, f.a); });
  REQUIRE(e);
  CHECK(std::string(e->what()) ==
        "[tessera.graph.201] MatMul: MatMul: \"b\" [3, 4] float32 x \"a\" [2, 3] float32: the right operand "
        "must be "
        "[K, N] with K equal to the left operand's last dimension");
}

TEST_CASE("convolution and pooling errors name the op, the tensors and the allowed values") {
  Fixture f;
  const Tensor img = ops::input(f.g, "img", {2, 3, 9, 8});
  auto e = test::catchError<GraphError>([&] {
    ops::conv(img, ops::input(f.g, "k", {6, 1, 3, 3}), {.group = 2});
  });
  REQUIRE(e);
  CHECK(std::string(e->what()) ==
        "[tessera.graph.202] Conv: Conv: `group` 2 must be >= 1 and divide both channel counts 3 and 6");
  e = test::catchError<GraphError>([&] { ops::conv(img, ops::input(f.g, "k2", {6, 3, 10, 3})); });
  REQUIRE(e);
  CHECK(
      std::string(e->what()) ==
      "[tessera.graph.201] Conv: Conv: the window [10, 3] (dilations [1, 1]) does not fit into input \"img\" "
      "[2, 3, 9, 8] float32 padded by [0, 0, 0, 0] on spatial axis 0");
  e = test::catchError<GraphError>([&] { ops::conv(img, ops::input(f.g, "k3", {6, 3, 3})); });
  REQUIRE(e);
  CHECK(
      std::string(e->what()) ==
      "[tessera.graph.201] Conv: Conv: inputs \"img\" [2, 3, 9, 8] float32 and \"k3\" [6, 3, 3] float32 must "
      "have the same rank (2 spatial axes)");
  e = test::catchError<GraphError>([&] { ops::maxPool(img, {.kernel = {2, 2}, .pads = {0, 2, 0, 0}}); });
  REQUIRE(e);
  CHECK(std::string(e->what()) ==
        "[tessera.graph.202] MaxPool: MaxPool: `pads` [0, 2, 0, 0] must be smaller than the window [2, 2] "
        "(dilations [1, 1]) on every axis");
}

TEST_CASE(
    "recurrence weights and states that do not fit the cell are InvalidRecurrence with the shapes allowed") {
  Graph g;
  const Tensor x = ops::input(g, "x", {6, 2, 5});
  struct Case {
    std::function<void()> build;
    const char* message;
  };
  const Case cases[] = {
      {[&] {
         ops::recurrence(OpKind::Gru, x, ops::input(g, "w1", {1, 12, 4}), ops::input(g, "r1", {1, 12, 4}));
       },
       "[tessera.graph.221] Gru: Forward Gru over x [6, 2, 5]: W [1, 12, 4] must be [1, 12, 5] (hidden size "
       "4 from "
       "R)"},
      {[&] {
         ops::recurrence(OpKind::Lstm, x, ops::input(g, "w2", {2, 32, 5}), ops::input(g, "r2", {1, 32, 8}),
                         {}, {}, {}, {RecurrenceDirection::Bidirectional, false});
       },
       "[tessera.graph.221] Lstm: Bidirectional Lstm over x [6, 2, 5]: R [1, 32, 8] must be [D, G*H, H] with "
       "D = 2 "
       "directions and G = 4 gates"},
      {[&] {
         ops::recurrence(OpKind::Rnn, x, ops::input(g, "w3", {1, 8, 5}), ops::input(g, "r3", {1, 8, 8}), {},
                         ops::input(g, "h3", {1, 3, 8}));
       },
       "[tessera.graph.221] Rnn: Forward Rnn over x [6, 2, 5]: h0 [1, 3, 8] must be [1, 2, 8] (hidden size 8 "
       "from "
       "R)"},
      {[&] {
         ops::recurrence(OpKind::Rnn, x, ops::input(g, "w4", {1, 8, 5}), ops::input(g, "r4", {1, 8, 8}), {},
                         {}, ops::input(g, "c4", {1, 2, 8}));
       },
       "[tessera.graph.221] Rnn: Forward Rnn over x [6, 2, 5]: only Lstm has a cell state c0"},
  };
  for (const Case& c : cases) {
    auto e = test::catchError<GraphError>(c.build);
    REQUIRE(e);
    CHECK(e->code() == ErrorCode::InvalidRecurrence);
    CHECK(std::string(e->what()) == c.message);
  }
}

TEST_CASE("variable host data has the group dimension when there is more than one group") {
  struct Case {
    std::optional<ReplicaGrouping> grouping;
    std::size_t elements;
    bool ok;
  };
  // PopXL's shape_on_host for a [3, 3] variable on 8 replicas.
  const std::vector<Case> cases = {
      {std::nullopt, 9, true},
      {ReplicaGrouping(8, 1, 1), 72, true},
      {ReplicaGrouping(8, 1, 2), 36, true},
      {ReplicaGrouping(8, 4, 2), 36, true},
      {ReplicaGrouping(8, 1, 8), 9, true},
      {std::nullopt, 72, false},
      {ReplicaGrouping(8, 1, 2), 9, false},
  };
  for (const Case& c : cases) {
    CAPTURE(c.elements);
    Graph g(8);
    auto e = test::catchError<GraphError>([&] {
      ops::variable(g, "w", std::vector<float>(c.elements, 1.0f), {3, 3}, c.grouping);
    });
    if (c.ok) {
      CHECK_FALSE(e);
      CHECK(toString(g.tensor(g.find("w")).category) == toString(TensorCategory::Weight));
    } else {
      REQUIRE(e);
      CHECK(e->code() == ErrorCode::HostShapeMismatch);
      CHECK(e->subject() == "w");
    }
  }
  Graph g(8);
  auto e = test::catchError<GraphError>([&] {
    ops::variable(g, "w", std::vector<float>(9), {3, 3}, ReplicaGrouping(8, 1, 2));
  });
  REQUIRE(e);
  CHECK(e->detail() ==
        "host data has 9 elements; expected host shape [4, 3, 3] (36 elements): [numGroups 4] + shape [3, 3] "
        "from "
        "ReplicaGrouping(numReplicas=8, stride=1, groupSize=2)");
  e = test::catchError<GraphError>([&] {
    ops::variable(g, "v", std::vector<float>(9), {3, 3}, ReplicaGrouping(4, 1, 2));
  });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::InvalidOperand);
  CHECK(e->subject() == "v");
}

TEST_CASE("variables carry their category, grouping and retrieval mode") {
  Graph g(4);
  const Tensor m = ops::variable(g, "m", std::vector<float>(6), {3}, ReplicaGrouping(4, 2, 2),
                                 RetrievalMode::AllReplicas, TensorCategory::OptimizerState);
  CHECK(toString(m.node().category) == toString(TensorCategory::OptimizerState));
  CHECK(m.node().grouping.value() == ReplicaGrouping(4, 2, 2));
  CHECK(toString(m.node().retrievalMode) == toString(RetrievalMode::AllReplicas));
  const Tensor c = ops::constant(g, "c", {1, 2}, {2});
  CHECK(c.node().data == std::vector<float>{1, 2});
  auto e = test::catchError<GraphError>([&] { ops::constant(g, "d", {1, 2}, {3}); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::HostShapeMismatch);
  CHECK(e->subject() == "d");
}

TEST_CASE("replica-sharded variables") {
  SUBCASE("a shard of ceil(n/shardOver) with the full metaShape") {
    Graph g(4);
    const ShardedVariable w = ops::replicaShardedVariable(g, "W0", std::vector<float>(30), {5, 2, 3});
    CHECK(w.variable == w.shard);
    CHECK(w.shard.shape() == Shape{8});
    CHECK(w.shard.metaShape() == Shape{5, 2, 3});
    CHECK(w.shard.node().shardCount == 4);
    const ShardedVariable grouped =
        ops::replicaShardedVariable(g, "W1", std::vector<float>(60), {5, 2, 3}, ReplicaGrouping(4, 2, 2), 2);
    CHECK(grouped.shard.shape() == Shape{15});
  }
  SUBCASE("errors") {
    Graph g(4);
    auto e = test::catchError<GraphError>([&] {
      ops::replicaShardedVariable(g, "W", std::vector<float>(30), {30}, ReplicaGrouping(4, 1, 4), 3);
    });
    REQUIRE(e);
    CHECK(e->code() == ErrorCode::InvalidCollective);
    CHECK(e->subject() == "W");
    e = test::catchError<GraphError>(
        [&] { ops::replicaShardedVariable(g, "W", std::vector<float>(30), {30}, ReplicaGrouping(4, 1, 2)); });
    REQUIRE(e);
    CHECK(e->code() == ErrorCode::HostShapeMismatch);
    CHECK(e->subject() == "W");
  }
  SUBCASE("remote replica-sharded variables check the buffer") {
    Graph g(4);
    const RemoteBuffer buffer = ops::remoteBuffer(g, {8}, DType::Float32, 4);
    const Tensor w = ops::remoteReplicaShardedVariable(g, "W", std::vector<float>(30), {5, 6}, buffer, 1);
    CHECK(w.shape() == Shape{8});
    CHECK(w.node().remoteBuffer == buffer.id());
    CHECK(w.node().remoteEntry == 1);
    CHECK(buffer.info().metaShape == Shape{5, 6});
    CHECK(ops::remoteLoad(g, buffer, 1).metaShape() == Shape{5, 6});
    auto e = test::catchError<GraphError>(
        [&] { ops::remoteReplicaShardedVariable(g, "V", std::vector<float>(32), {32}, buffer, 0); });
    REQUIRE(e);
    CHECK(e->code() == ErrorCode::InvalidRemoteBuffer);
    CHECK(e->subject() == "V");
    e = test::catchError<GraphError>(
        [&] { ops::remoteReplicaShardedVariable(g, "V", std::vector<float>(40), {40}, buffer, 0); });
    REQUIRE(e);
    CHECK(e->code() == ErrorCode::InvalidRemoteBuffer);
    e = test::catchError<GraphError>([&] {
      ops::remoteReplicaShardedVariable(g, "V", std::vector<float>(30), {5, 6}, buffer, 4);
    });
    REQUIRE(e);
    CHECK(e->code() == ErrorCode::InvalidRemoteBuffer);
    Graph single(1);
    const RemoteBuffer b1 = ops::remoteBuffer(single, {30});
    e = test::catchError<GraphError>(
        [&] { ops::remoteReplicaShardedVariable(single, "V", std::vector<float>(30), {30}, b1, 0); });
    REQUIRE(e);
    CHECK(e->code() == ErrorCode::InvalidCollective);
    CHECK(e->subject() == "V");
  }
}

TEST_CASE("remote variables take the buffer's shape and dtype") {
  Graph g(2);
  const RemoteBuffer buffer = ops::remoteBuffer(g, {32}, DType::Int32, 1);
  const Tensor v = ops::remoteVariable(g, "v", std::vector<float>(64), buffer, 0, ReplicaGrouping(2, 1, 1));
  CHECK(v.shape() == Shape{32});
  CHECK(toString(v.dtype()) == toString(DType::Int32));
  auto e =
      test::catchError<GraphError>([&] { ops::remoteVariable(g, "u", std::vector<float>(32), buffer, 1); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::InvalidRemoteBuffer);
  CHECK(e->subject() == "u");
  e = test::catchError<GraphError>(
      [&] { ops::remoteVariable(g, "u", std::vector<float>(32), buffer, 0, ReplicaGrouping(2, 1, 1)); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::HostShapeMismatch);
  CHECK(e->subject() == "u");
}
