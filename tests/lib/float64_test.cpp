// Float64 in the IR: which ops take float64 operands, the dtypes of their
// outputs, the refusal of float64 beside another float dtype and by the ops
// that do not take it, the casts and their gradients, and exact double
// constants in the reference evaluator. The device's float64 kernels are
// checked in tests/simdevice (executor_test, float64_device_test).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "support/reference_evaluator.hpp"
#include "tessera/lib/autodiff.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

constexpr DType kF64 = DType::Float64;

struct Fixture {
  Graph g{1};
  Tensor a = ops::input(g, "a", {2, 3}, kF64);
  Tensor v = ops::input(g, "v", {3}, kF64);
  Tensor a32 = ops::input(g, "a32", {2, 3});
  Tensor a16 = ops::input(g, "a16", {2, 3}, DType::Float16);
  Tensor labels = ops::input(g, "labels", {2}, DType::Int32);
};

struct DTypeCase {
  std::string name;
  std::function<Tensor(Fixture&)> build;
};

}  // namespace

TEST_CASE("float64 names and sizes") {
  CHECK(toString(kF64) == "float64");
  CHECK(dtypeBytes(kF64) == 8);
  CHECK(dtypeSlots(kF64) == 2);
  CHECK(dtypeSlots(DType::Float32) == 1);
  CHECK(isFloating(kF64));
  const std::vector<double> values = {1e200, -0.1, 1.0 + 0x1p-40};
  CHECK(unpackDoubles(packDoubles(values)) == values);
}

TEST_CASE("the elementwise family, Where, the casts and the shape ops take float64; outputs follow") {
  const std::vector<DTypeCase> cases = {
      {"add with broadcasting", [](Fixture& f) { return ops::add(f.a, f.v); }},
      {"sub", [](Fixture& f) { return ops::sub(f.v, f.a); }},
      {"mul by a float64 scalar", [](Fixture& f) { return ops::mul(f.a, ops::scalar(f.g, 2.0, kF64)); }},
      {"div", [](Fixture& f) { return ops::div(f.a, f.v); }},
      {"pow", [](Fixture& f) { return ops::pow(f.a, f.v); }},
      {"neg", [](Fixture& f) { return ops::neg(f.a); }},
      {"abs", [](Fixture& f) { return ops::abs(f.a); }},
      {"sqrt", [](Fixture& f) { return ops::sqrt(f.a); }},
      {"exp", [](Fixture& f) { return ops::exp(f.a); }},
      {"log", [](Fixture& f) { return ops::log(f.a); }},
      {"tanh", [](Fixture& f) { return ops::tanh(f.a); }},
      {"sigmoid", [](Fixture& f) { return ops::sigmoid(f.a); }},
      {"relu", [](Fixture& f) { return ops::relu(f.a); }},
      {"where", [](Fixture& f) { return ops::where(ops::less(f.a32, f.a32), f.a, f.v); }},
      {"reshape", [](Fixture& f) { return ops::reshape(f.a, {3, 2}); }},
      {"transpose", [](Fixture& f) { return ops::transpose(f.a, {1, 0}); }},
      {"concat", [](Fixture& f) { return ops::concat({f.a, f.a}, 0); }},
      {"broadcastTo", [](Fixture& f) { return ops::broadcastTo(f.v, {4, 3}); }},
      {"cast from float32", [](Fixture& f) { return ops::cast(f.a32, kF64); }},
      {"cast from float16", [](Fixture& f) { return ops::cast(f.a16, kF64); }},
      {"cast from int32", [](Fixture& f) { return ops::cast(f.labels, kF64); }},
  };
  for (const DTypeCase& c : cases) {
    CAPTURE(c.name);
    Fixture f;
    const Tensor y = c.build(f);
    CHECK(y.dtype() == kF64);
  }
  Fixture f;
  CHECK(ops::cast(f.a, DType::Float32).dtype() == DType::Float32);
  CHECK(ops::cast(f.a, DType::Int32).dtype() == DType::Int32);
  CHECK(ops::cast(f.a, DType::Float16).dtype() == DType::Float16);  // rounded once, not through float32
  CHECK(ops::cast(f.a, kF64).id() == f.a.id());
}

TEST_CASE("float64 beside float32 or float16 in one op is DTypeMismatch naming both tensors") {
  Fixture f;
  const auto e = test::catchError<GraphError>([&] { ops::add(f.a, f.a32); });
  REQUIRE(e.has_value());
  CHECK(e->code() == ErrorCode::DTypeMismatch);
  const std::string message = e->what();
  CHECK(message.find("\"a\"") != std::string::npos);
  CHECK(message.find("\"a32\"") != std::string::npos);
  CHECK(message.find("float64") != std::string::npos);
  TESSERA_CHECK_ERROR(ops::mul(f.a16, f.a), GraphError, ErrorCode::DTypeMismatch);
  TESSERA_CHECK_ERROR(ops::mul(f.a, ops::scalar(f.g, 2.0)), GraphError, ErrorCode::DTypeMismatch);
}

TEST_CASE("ops that do not take float64 refuse it, naming the op, the tensor and what to do") {
  Fixture f;
  const auto e = test::catchError<GraphError>([&] { ops::matmul(f.a, ops::transpose(f.a, {1, 0})); });
  REQUIRE(e.has_value());
  CHECK(e->code() == ErrorCode::InvalidOperand);
  const std::string message = e->what();
  CHECK(message.find("MatMul") != std::string::npos);
  CHECK(message.find("\"a\" [2, 3] float64") != std::string::npos);
  CHECK(message.find("ops::cast") != std::string::npos);
  TESSERA_CHECK_ERROR(ops::reduceSum(f.a), GraphError, ErrorCode::InvalidOperand);
  TESSERA_CHECK_ERROR(ops::softmax(f.a), GraphError, ErrorCode::InvalidOperand);
  TESSERA_CHECK_ERROR(ops::gelu(f.a), GraphError, ErrorCode::InvalidOperand);
  TESSERA_CHECK_ERROR(ops::cast(f.labels, DType::Float16), GraphError, ErrorCode::InvalidOperand);
  TESSERA_CHECK_ERROR(ops::castToFloat32(f.a32), GraphError, ErrorCode::InvalidOperand);
  TESSERA_CHECK_ERROR(ops::variable(f.g, "w", std::vector<float>(3, 1.0f), {3}, std::nullopt,
                                    RetrievalMode::OnePerGroup, TensorCategory::Weight, kF64),
                      GraphError, ErrorCode::InvalidOperand);
  TESSERA_CHECK_ERROR(ops::constantFloat64(f.g, "c", {1.0, 2.0}, {3}), GraphError, ErrorCode::HostShapeMismatch);
}

TEST_CASE("float64 constants hold doubles exactly; the reference computes beyond float32's range") {
  Graph g{1};
  const Tensor x = ops::input(g, "x", {3}, kF64);
  const Tensor big = ops::constantFloat64(g, "big", {1e200, 1.0 + 0x1p-40, -3.0}, {3});
  const Tensor sum = ops::add(x, big);
  const Tensor narrowed = ops::cast(sum, DType::Float32);
  const Tensor widened = ops::cast(ops::constant(g, "f", {0.1f}, {}), kF64);
  test::ReferenceEvaluator ref(g);
  ref.feedAll(x.id(), {1e198, 1.0, 0.5});
  ref.run();
  const std::vector<double>& y = ref.value(sum.id(), 0);
  REQUIRE(y.size() == 3);
  CHECK(y[0] == 1e198 + 1e200);
  CHECK(y[1] == 2.0 + 0x1p-40);  // float32 would lose the 2^-40
  CHECK(y[2] == -2.5);
  CHECK(std::isinf(ref.value(narrowed.id(), 0)[0]));
  CHECK(ref.value(narrowed.id(), 0)[1] == 2.0);
  CHECK(ref.value(widened.id(), 0)[0] == static_cast<double>(0.1f));
}

TEST_CASE("autodiff through a float64 graph: gradients have the dtype of their tensors") {
  Graph g{1};
  const Tensor w = ops::input(g, "w", {3});
  const Tensor x = ops::input(g, "x", {3}, kF64);
  const Tensor y = ops::mul(ops::cast(w, kF64), ops::exp(x));
  const Tensor back = ops::cast(ops::sqrt(ops::abs(y)), DType::Float32);
  const Tensor loss = ops::reduceSum(back);
  const std::vector<Tensor> grads = autodiff(g, loss, {w, x});
  REQUIRE(grads.size() == 2);
  CHECK(grads[0].dtype() == DType::Float32);
  CHECK(grads[1].dtype() == kF64);
}

TEST_CASE("a float16 scalar from a double is the nearest half, rounded once") {
  Graph g{1};
  const Tensor s = ops::scalar(g, 1.0 + 0x1p-11 + 0x1p-40, DType::Float16);
  REQUIRE(g.tensor(s.id()).data.size() == 1);
  CHECK(g.tensor(s.id()).data[0] == 1.0f + 0x1p-10f);  // through float32: 1
  CHECK(g.tensor(ops::scalar(g, 1.0 + 0x1p-11, DType::Float16).id()).data[0] == 1.0f);
}
