// ONNX mapping of the sources family (lib/ops/sources.cc): Constant nodes, and the
// ops that make values known at import only (ConstantOfShape, Range; onnx/const_eval.cc
// folds them).

#include <fmt/format.h>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {

void Importer::mapConstant(const onnx::NodeProto& node, const std::string& subject) {
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  Known value;
  if (const auto* a = findAttribute(node, "value")) {
    value = readTensor(a->t(), subject + " attribute value");
  } else if (const auto* f = findAttribute(node, "value_float")) {
    value.type = onnx::TensorProto::FLOAT;
    value.f = {f->f()};
  } else if (const auto* fs = findAttribute(node, "value_floats")) {
    value.type = onnx::TensorProto::FLOAT;
    value.f.assign(fs->floats().begin(), fs->floats().end());
    value.shape = {static_cast<int64_t>(value.f.size())};
  } else if (const auto* i = findAttribute(node, "value_int")) {
    value.type = onnx::TensorProto::INT64;
    value.i = {i->i()};
  } else if (const auto* is = findAttribute(node, "value_ints")) {
    value.type = onnx::TensorProto::INT64;
    value.i.assign(is->ints().begin(), is->ints().end());
    value.shape = {static_cast<int64_t>(value.i.size())};
  } else {
    unsupported("only the attributes value, value_float(s) and value_int(s) are supported");
  }
  if (node.output_size() < 1) throwOnnx(ErrorCode::OnnxInvalidGraph, subject, "Constant without an output");
  const int32_t type = value.type;
  values_[node.output(0)] = Value{std::move(value), kNoTensor, type};
}

void addSourceMappings(OnnxMappingTable& table) {
  table.add({.opType = "Constant",
             .map = &Importer::mapConstant,
             .requiredInputs = 0,
             .checksFloatOperands = false});
  table.add({.opType = "ConstantOfShape", .requiredInputs = 1, .listed = false, .onKnownValues = true});
  table.add({.opType = "Range", .requiredInputs = 3, .listed = false, .onKnownValues = true});
}

}  // namespace tessera::onnx_import
