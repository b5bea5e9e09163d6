// ONNX mapping of the elementwise family (lib/ops/elementwise.cc): arithmetic,
// the unary functions, Clip, PRelu (a select) and the variadic Sum, Mean, Max and Min.

#include <limits>
#include <optional>

#include <fmt/format.h>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {

void Importer::mapVariadic(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  // Variadic, with numpy broadcasting: a chain of Adds (Mean divides by
  // the count); Max and Min select with Where (a tie takes the later
  // operand, and its gradient goes there).
  std::vector<Tensor> in;
  for (int k = 0; k < node.input_size(); ++k)
    if (!node.input(k).empty()) in.push_back(operand(node, k, subject));
  if (in.empty()) throwOnnx(ErrorCode::OnnxInvalidGraph, subject, fmt::format("{} without inputs", op));
  const int32_t type = values_.at(node.input(0)).type;
  for (std::size_t k = 0; k < in.size(); ++k)
    if (in[k].dtype() != in[0].dtype() || (op == "Mean" && in[k].dtype() == DType::Int32))
      unsupported(
          fmt::format("inputs of different types (or a Mean of integers): {} needs float operands of one "
                      "type, or int32 ones for Sum, Max and Min",
                      op));
  Tensor y = in[0];
  for (std::size_t k = 1; k < in.size(); ++k) {
    if (op == "Sum" || op == "Mean") {
      y = ops::add(y, in[k]);
    } else {
      y = ops::where(op == "Max" ? ops::greater(y, in[k]) : ops::less(y, in[k]), y, in[k]);
    }
  }
  if (op == "Mean" && in.size() > 1) y = ops::div(y, scalar(static_cast<double>(in.size()), y.dtype()));
  if (in.size() == 1) {
    values_[node.output(0)] = values_.at(node.input(0));
    return;
  }
  setOutput(node, 0, y, type);
}

void Importer::mapPRelu(const onnx::NodeProto& node, const std::string& subject) {
  // x < 0 ? slope * x : x, the slope broadcast to x: a select, so the
  // slope's gradient is the sum of dy * x where x < 0.
  Tensor x = operand(node, 0, subject);
  requireFloat(x, node, 0, subject);
  Tensor slope = operand(node, 1, subject);
  requireFloat(slope, node, 1, subject);
  // PyTorch's exports before opset 7 give PReLU(num_parameters=C) a slope
  // [C] meant per channel (axis 1), which numpy rules would align with the
  // last axis: where those rules cannot take it, it applies along axis 1.
  const Shape xs = x.shape();  // a copy: adding ops may move the graph's tensors
  if (slope.shape().size() == 1 && xs.size() >= 3 && slope.shape()[0] == xs[1] &&
      slope.shape()[0] != xs.back() && slope.shape()[0] != 1) {
    Shape channel(xs.size() - 1, 1);
    channel[0] = xs[1];
    slope = ops::reshape(slope, channel);
  }
  setOutput(node, 0, ops::where(ops::less(x, scalar(0.0, x.dtype())), ops::mul(slope, x), x));
}

void Importer::mapArithmetic(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  Tensor a = operand(node, 0, subject);
  Tensor b = operand(node, 1, subject);
  if (a.dtype() != b.dtype() || (op == "Div" && a.dtype() == DType::Int32))
    unsupported(fmt::format(
        "inputs of types {} and {}: the device computes {} on two values of one type, float or int32 "
        "(Div on floats only)",
        typeName(values_.at(node.input(0)).type), typeName(values_.at(node.input(1)).type), op));
  const int32_t type = values_.at(node.input(0)).type;
  Tensor y = op == "Add"   ? ops::add(a, b)
             : op == "Sub" ? ops::sub(a, b)
             : op == "Mul" ? ops::mul(a, b)
                           : ops::div(a, b);
  setOutput(node, 0, y, type);
}

void Importer::mapPow(const onnx::NodeProto& node, const std::string& subject) {
  Tensor x = operand(node, 0, subject);
  requireFloat(x, node, 0, subject);
  // A known exponent of 1, 2 or 0.5 is x, x*x or Sqrt (what torch exports
  // for x**2 and x**0.5); any other is Pow, whose exponent is float32.
  const Known* e = knownInput(node, 1);
  const double p = e != nullptr && e->size() == 1 ? e->at(0) : 0.0;
  if (e != nullptr && e->size() == 1 && p == 1.0) {
    values_[node.output(0)] = values_.at(node.input(0));
  } else if (e != nullptr && e->size() == 1 && p == 2.0) {
    setOutput(node, 0, ops::mul(x, x));
  } else if (e != nullptr && e->size() == 1 && p == 0.5) {
    setOutput(node, 0, ops::sqrt(x));
  } else if (e != nullptr) {
    std::vector<float> exponent(e->size());
    for (std::size_t i = 0; i < exponent.size(); ++i) exponent[i] = static_cast<float>(e->at(i));
    const Tensor b =
        ops::constant(graph_, graph_.uniqueName(node.input(1)), std::move(exponent), e->shape, x.dtype());
    setOutput(node, 0, ops::pow(x, b));
  } else {
    Tensor b = operand(node, 1, subject);
    requireFloat(b, node, 1, subject);
    setOutput(node, 0, ops::pow(x, b));
  }
}

void Importer::mapUnary(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  Tensor x = operand(node, 0, subject);
  requireFloat(x, node, 0, subject);
  auto attribute = [&](std::string_view name, float fallback) {
    return static_cast<double>(floatAttribute(node, name, fallback, subject));
  };
  Tensor y = op == "Abs"          ? ops::abs(x)
             : op == "Erf"        ? ops::erf(x)
             : op == "Reciprocal" ? ops::reciprocal(x)
             : op == "Sign"       ? ops::sign(x)
             : op == "Softplus"   ? ops::softplus(x)
             : op == "LeakyRelu"  ? ops::leakyRelu(x, attribute("alpha", 0.01F))
             : op == "Elu"        ? ops::elu(x, attribute("alpha", 1.0F))
                                  : ops::selu(x, attribute("alpha", 1.67326319217681884765625F),
                                              attribute("gamma", 1.05070102214355468750F));
  setOutput(node, 0, y);
}

namespace {

// `from` broadcasts to `to` without changing it (numpy's rule).
bool broadcastable(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const std::size_t skip = to.size() - from.size();
  for (std::size_t k = 0; k < from.size(); ++k)
    if (from[k] != 1 && from[k] != to[skip + k]) return false;
  return true;
}

// min(max(x, lo), hi) by bounds the model computes (either may be absent),
// each broadcasting to x, composed of selects: hi where x > hi or hi < lo
// (ONNX's min(max(x, lo), hi) when lo > hi), else lo where x < lo, else x;
// a NaN x stays NaN. The selects' gradient is torch.clamp's for tensor
// bounds: x's where lo <= x <= hi (ties go to x), lo's the sum of dy where
// x < lo and hi's where x > hi, each summed back to the bound's shape.
Tensor clipByTensors(Tensor x, const std::optional<Tensor>& lo, const std::optional<Tensor>& hi) {
  Tensor y = x;
  if (lo) y = ops::where(ops::less(x, *lo), *lo, y);
  if (hi) {
    Tensor above = ops::greater(x, *hi);
    if (lo) above = ops::logicalOr(above, ops::less(*hi, *lo));
    y = ops::where(above, *hi, y);
  }
  return y;
}

}  // namespace

void Importer::mapClip(const onnx::NodeProto& node, const std::string& subject) {
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  // Bounds are optional inputs (opset 11 on). Known at import, they are
  // Clip's attributes (one value each). Computed by the model or weights
  // (torch.clamp with parameters as bounds), Clip is clipByTensors: selects
  // whose gradient is torch.clamp's, to x where lo <= x <= hi and to the
  // bound that is selected. ONNX asks for one value; a bound that
  // broadcasts to x (one per channel, say) is taken too.
  Tensor x = operand(node, 0, subject);
  requireFloat(x, node, 0, subject);
  auto present = [&](int k) { return k < node.input_size() && !node.input(k).empty(); };
  if ((present(1) && knownInput(node, 1) == nullptr) || (present(2) && knownInput(node, 2) == nullptr)) {
    auto bound = [&](int k, std::string_view what) -> std::optional<Tensor> {
      if (!present(k)) return std::nullopt;
      Tensor b = operand(node, k, subject);
      requireFloat(b, node, k, subject);
      if (b.dtype() != x.dtype())
        unsupported(fmt::format("the {} bound \"{}\" is {} and x {}; Clip takes values of one type", what,
                                node.input(k), typeName(values_.at(node.input(k)).type),
                                typeName(values_.at(node.input(0)).type)));
      // One value of any rank is a scalar bound.
      if (numElements(b.shape()) == 1) return b.shape().empty() ? b : ops::reshape(b, {});
      if (!broadcastable(b.shape(), x.shape()))
        unsupported(
            fmt::format("the {} bound \"{}\" is {} and x {}; one value, or a shape that broadcasts "
                        "to x's, expected",
                        what, node.input(k), shapeStr(b.shape()), shapeStr(x.shape())));
      return b;
    };
    const std::optional<Tensor> lo = bound(1, "min");
    const std::optional<Tensor> hi = bound(2, "max");
    setOutput(node, 0, clipByTensors(x, lo, hi));
    return;
  }
  auto bound = [&](int k, std::string_view what, double fallback) {
    if (!present(k)) return fallback;
    const Known& b = requireKnown(node, k, subject, what);
    if (b.size() != 1) unsupported(fmt::format("the {} bound must be one value", what));
    return b.at(0);
  };
  const double lo = bound(1, "min", -std::numeric_limits<double>::infinity());
  const double hi = bound(2, "max", std::numeric_limits<double>::infinity());
  setOutput(node, 0, ops::clip(x, lo, hi));
}

void Importer::mapFloatUnary(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  // float32, or float64 computed in double.
  Tensor x = operand(node, 0, subject);
  const bool wide = x.dtype() == DType::Float64;
  if (!wide) requireFloat(x, node, 0, subject);
  Tensor y = op == "Neg"       ? ops::neg(x)
             : op == "Relu"    ? ops::relu(x)
             : op == "Tanh"    ? ops::tanh(x)
             : op == "Sigmoid" ? ops::sigmoid(x)
             : op == "Exp"     ? ops::exp(x)
             : op == "Log"     ? ops::log(x)
                               : ops::sqrt(x);
  setOutput(node, 0, y, wide ? onnx::TensorProto::DOUBLE : onnx::TensorProto::FLOAT);
}

void addElementwiseMappings(OnnxMappingTable& table) {
  for (std::string_view op : {"Add", "Sub", "Mul", "Div"})
    table.add({.opType = op,
               .map = &Importer::mapArithmetic,
               .requiredInputs = 2,
               .allInputsDifferentiable = true});
  table.add({.opType = "Pow", .map = &Importer::mapPow, .requiredInputs = 2, .differentiable = {0}});
  // One-input elementwise ops with a tessera op of their own (their attributes read in mapUnary).
  for (std::string_view op : {"Abs", "Elu", "Erf", "LeakyRelu", "Reciprocal", "Selu", "Sign", "Softplus"})
    table.add({.opType = op, .map = &Importer::mapUnary, .differentiable = {0}});
  for (std::string_view op : {"Neg", "Relu", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt"})
    table.add({.opType = op, .map = &Importer::mapFloatUnary, .differentiable = {0}});
  // A bound that is a weight (torch.clamp by parameters) trains.
  table.add({.opType = "Clip", .map = &Importer::mapClip, .differentiable = {0, 1, 2}});
  table.add(
      {.opType = "PRelu", .map = &Importer::mapPRelu, .requiredInputs = 2, .allInputsDifferentiable = true});
  for (std::string_view op : {"Sum", "Mean", "Max", "Min"})
    table.add({.opType = op, .map = &Importer::mapVariadic, .allInputsDifferentiable = true});
}

}  // namespace tessera::onnx_import
