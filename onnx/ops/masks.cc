// ONNX mapping of the masks family (lib/ops/masks.cc): comparisons and logic on
// float32 0/1 masks, Where, Cast and Dropout.

#include <algorithm>

#include <fmt/format.h>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {

void Importer::mapCompare(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  // Masks are float32 0/1 (tessera's mask ops). a <= b is (a < b) or
  // (a == b), exact for NaN too.
  Tensor a = operand(node, 0, subject);
  Tensor b = operand(node, 1, subject);
  if (a.dtype() != b.dtype())
    unsupported(fmt::format("inputs of types {} and {}: {} compares two float or two integer values",
                            typeName(values_.at(node.input(0)).type),
                            typeName(values_.at(node.input(1)).type), op));
  Tensor y = op == "Equal"         ? ops::equal(a, b)
             : op == "Less"        ? ops::less(a, b)
             : op == "Greater"     ? ops::greater(a, b)
             : op == "LessOrEqual" ? ops::logicalOr(ops::less(a, b), ops::equal(a, b))
                                   : ops::logicalOr(ops::greater(a, b), ops::equal(a, b));
  setOutput(node, 0, y, onnx::TensorProto::BOOL);
}

void Importer::mapLogical(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  std::vector<Tensor> in;
  for (int k = 0; k < (op == "Not" ? 1 : 2); ++k) {
    if (values_.at(node.input(k)).type != onnx::TensorProto::BOOL)
      unsupported(fmt::format("input {} (\"{}\") is {}; {} takes bool values", k, node.input(k),
                              typeName(values_.at(node.input(k)).type), op));
    in.push_back(operand(node, k, subject));
  }
  Tensor y = op == "Not"   ? ops::logicalNot(in[0])
             : op == "And" ? ops::logicalAnd(in[0], in[1])
                           : ops::logicalOr(in[0], in[1]);
  setOutput(node, 0, y, onnx::TensorProto::BOOL);
}

void Importer::mapWhere(const onnx::NodeProto& node, const std::string& subject) {
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  if (values_.at(node.input(0)).type != onnx::TensorProto::BOOL)
    unsupported(fmt::format("the condition \"{}\" is {}; bool expected", node.input(0),
                            typeName(values_.at(node.input(0)).type)));
  Tensor cond = operand(node, 0, subject);
  Tensor x = operand(node, 1, subject);
  Tensor y = operand(node, 2, subject);
  const int32_t type = values_.at(node.input(1)).type;
  if (x.dtype() != y.dtype())
    unsupported(fmt::format("x is {} and y {}: Where selects between values of one type", typeName(type),
                            typeName(values_.at(node.input(2)).type)));
  setOutput(node, 0, ops::where(cond, x, y), type);
}

void Importer::mapDropout(const onnx::NodeProto& node, const std::string& subject) {
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  const Value input = values_.at(node.input(0));
  float ratio = 0.5F;
  bool training = false;
  if (opset_ >= 12) {
    auto scalarOf = [&](const Known& k, std::string_view what) {
      if (k.size() != 1)
        throwOnnx(ErrorCode::OnnxNodeShape, subject,
                  fmt::format("{} has shape {}; one value expected", what, shapeStr(k.shape)));
      return k.at(0);
    };
    if (const Known* r = knownInput(node, 1)) ratio = static_cast<float>(scalarOf(*r, "ratio"));
    if (node.input_size() > 2 && !node.input(2).empty())
      training = scalarOf(requireKnown(node, 2, subject, "training_mode"), "training_mode") != 0;
  }
  if (training && ratio != 0.0F) {
    if (!options_.randomDropout)
      unsupported(fmt::format(
          "training mode with ratio {} draws random masks; set OnnxImportOptions::randomDropout for "
          "tessera's seeded masks (not onnxruntime's), or use inference mode or ratio 0, where "
          "Dropout passes its input through",
          ratio));
    if (!(ratio > 0.0F && ratio < 1.0F)) unsupported(fmt::format("ratio {} is outside [0, 1)", ratio));
    Tensor x = operand(node, 0, subject);
    requireFloat(x, node, 0, subject);
    if (!dropoutStep_.valid()) {
      // One counter for the model: read once per run (a snapshot that the
      // gradient reads too), then advanced in place.
      const Tensor counter =
          ops::variable(graph_, graph_.uniqueName("dropout.step"), {0.0F}, {}, std::nullopt,
                        RetrievalMode::OnePerGroup, TensorCategory::OptimizerState, DType::Int32);
      state_.push_back(counter.name());
      dropoutStep_ = ops::copy(counter);
      ops::scaledAddInplace(counter,
                            ops::constant(graph_, graph_.uniqueName("dropout.one"), {1.0F}, {}, DType::Int32),
                            1.0, 1.0);
    }
    const auto* seedAttribute = findAttribute(node, "seed");
    const uint64_t seed =
        seedAttribute != nullptr ? static_cast<uint64_t>(seedAttribute->i()) : options_.dropoutSeed;
    // Seeds stay below 2^53 (they travel as a double attribute).
    const uint64_t mixed =
        (seed * 1000003 + static_cast<uint64_t>(dropoutNodes_++)) & ((uint64_t{1} << 53) - 1);
    const Tensor y = ops::dropout(x, dropoutStep_, ratio, mixed);
    setOutput(node, 0, y);
    if (node.output_size() > 1 && !node.output(1).empty())
      setOutput(node, 1,
                ops::logicalNot(ops::equal(
                    ops::dropout(ops::add(ops::mul(x, scalar(0.0, x.dtype())), scalar(1.0, x.dtype())),
                                 dropoutStep_, ratio, mixed),
                    scalar(0.0, x.dtype()))),
                onnx::TensorProto::BOOL);
    return;
  }
  values_[node.output(0)] = input;
  if (node.output_size() > 1 && !node.output(1).empty()) {
    const Shape shape = input.id != kNoTensor ? graph_.tensor(input.id).shape : input.known->shape;
    Known mask = makeKnown(onnx::TensorProto::BOOL, shape, subject);
    std::fill(mask.i.begin(), mask.i.end(), 1);
    values_[node.output(1)] = Value{std::move(mask), kNoTensor, onnx::TensorProto::BOOL};
  }
}

void Importer::mapCast(const onnx::NodeProto& node, const std::string& subject) {
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  const int64_t to = intAttribute(node, "to", -1, subject);
  const Value& in = values_.at(node.input(0));
  const bool fromInteger = in.type == onnx::TensorProto::INT64 || in.type == onnx::TensorProto::INT32;
  const bool fromFloating = in.type == onnx::TensorProto::FLOAT || in.type == onnx::TensorProto::FLOAT16 ||
                            in.type == onnx::TensorProto::DOUBLE;
  if (to == onnx::TensorProto::FLOAT16 &&
      (fromFloating || fromInteger || in.type == onnx::TensorProto::BOOL)) {
    // float16 from anything numeric: a double rounded once to the nearest
    // half, the rest through float32 (exact for int32 up to 2^24, beyond
    // the half's range anyway); x itself when it is float16 (a float16
    // model, or float under floatType Float16).
    setOutput(node, 0, toFloat(operand(node, 0, subject), DType::Float16), onnx::TensorProto::FLOAT16);
    return;
  }
  if (in.type == onnx::TensorProto::FLOAT16 &&
      (to == onnx::TensorProto::FLOAT || to == onnx::TensorProto::DOUBLE)) {
    // Exact: float to the import's float type, double to float64.
    const Tensor x = operand(node, 0, subject);
    const DType target = deviceFloat(static_cast<int32_t>(to));
    setOutput(node, 0, target == DType::Float64 ? ops::cast(x, target) : toFloat(x, target),
              static_cast<int32_t>(to));
    return;
  }
  if (in.type == onnx::TensorProto::BOOL &&
      (to == onnx::TensorProto::BOOL ||
       (to == onnx::TensorProto::FLOAT && options_.floatType == DType::Float32))) {
    // A mask is float32 0/1 already.
    Value out = in;
    out.type = static_cast<int32_t>(to);
    values_[node.output(0)] = out;
    return;
  }
  if (in.type == onnx::TensorProto::BOOL && to == onnx::TensorProto::FLOAT) {
    setOutput(node, 0, toFloat(operand(node, 0, subject), options_.floatType), onnx::TensorProto::FLOAT);
    return;
  }
  if (to == onnx::TensorProto::BOOL &&
      (in.type == onnx::TensorProto::FLOAT || in.type == onnx::TensorProto::FLOAT16 ||
       in.type == onnx::TensorProto::INT64 || in.type == onnx::TensorProto::INT32)) {
    // Anything not zero is true (NaN too, as numpy casts it).
    Tensor x = operand(node, 0, subject);
    const Tensor zero = x.dtype() != DType::Int32
                            ? ops::scalar(graph_, 0.0, x.dtype())
                            : ops::constant(graph_, graph_.uniqueName("zero"), {0.0F}, {}, DType::Int32);
    setOutput(node, 0, ops::logicalNot(ops::equal(x, zero)), onnx::TensorProto::BOOL);
    return;
  }
  const bool fromInt = in.type == onnx::TensorProto::INT64 || in.type == onnx::TensorProto::INT32;
  const bool toInt = to == onnx::TensorProto::INT64 || to == onnx::TensorProto::INT32;
  // float64: exact from float32 and integers; to float32 the nearest
  // float, to integers truncated toward zero.
  const bool fromDouble = in.type == onnx::TensorProto::DOUBLE;
  if (to == onnx::TensorProto::DOUBLE && (in.type == onnx::TensorProto::FLOAT || fromInt)) {
    setOutput(node, 0, ops::cast(operand(node, 0, subject), DType::Float64), onnx::TensorProto::DOUBLE);
    return;
  }
  if (fromDouble && (to == onnx::TensorProto::FLOAT || toInt)) {
    const Tensor x = operand(node, 0, subject);
    setOutput(node, 0, toInt ? ops::castToInt32(x) : toFloat(x, options_.floatType),
              static_cast<int32_t>(to));
    return;
  }
  if ((in.type == onnx::TensorProto::FLOAT || in.type == onnx::TensorProto::FLOAT16 ||
       in.type == onnx::TensorProto::BOOL) &&
      toInt) {
    // Truncated toward zero, as numpy's astype (a mask gives 0 and 1).
    setOutput(node, 0, ops::castToInt32(operand(node, 0, subject)), static_cast<int32_t>(to));
    return;
  }
  if (fromInt && to == onnx::TensorProto::FLOAT) {
    // To the import's float type (float16 under OnnxImportOptions::floatType).
    setOutput(node, 0, toFloat(operand(node, 0, subject), options_.floatType), onnx::TensorProto::FLOAT);
    return;
  }
  const bool floatToFloat = (in.type == onnx::TensorProto::FLOAT && to == onnx::TensorProto::FLOAT) ||
                            (fromDouble && to == onnx::TensorProto::DOUBLE);
  const bool intToInt = (in.type == onnx::TensorProto::INT64 || in.type == onnx::TensorProto::INT32) &&
                        (to == onnx::TensorProto::INT64 || to == onnx::TensorProto::INT32);
  if (!floatToFloat && !intToInt)
    unsupported(
        fmt::format("cast from {} to {} of a computed value: the device casts between float32, float16, "
                    "float64, int32/int64 and bool only",
                    typeName(in.type), typeName(static_cast<int32_t>(to))));
  Value out = in;
  out.type = static_cast<int32_t>(to);
  values_[node.output(0)] = out;
}

void addMaskMappings(OnnxMappingTable& table) {
  for (std::string_view op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"})
    table.add({.opType = op, .map = &Importer::mapCompare, .requiredInputs = 2});
  table.add({.opType = "Not", .map = &Importer::mapLogical});
  for (std::string_view op : {"And", "Or"})
    table.add({.opType = op, .map = &Importer::mapLogical, .requiredInputs = 2});
  table.add({.opType = "Where", .map = &Importer::mapWhere, .requiredInputs = 3, .differentiable = {1, 2}});
  table.add({.opType = "Cast", .map = &Importer::mapCast, .differentiable = {0}});
  table.add({.opType = "Dropout", .map = &Importer::mapDropout, .differentiable = {0}});
}

}  // namespace tessera::onnx_import
