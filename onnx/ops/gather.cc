// ONNX mapping of the gather family (lib/ops/gather.cc): Gather of a model value
// (a Gather of a value known at import is folded, onnx/const_eval.cc),
// GatherElements and ScatterElements.

#include <fmt/format.h>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/error.hpp"

namespace tessera::onnx_import {

void Importer::mapGather(const onnx::NodeProto& node, const std::string& subject) {
  // A Gather of known data with computed indices.
  if (knownInput(node, 0) != nullptr) refuseComputedInput(node.op_type(), subject);
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  // Slices of a model value along any axis (rows of an embedding table,
  // a class token): the device's Gather.
  Tensor data = operand(node, 0, subject);
  requireFloat(data, node, 0, subject);
  const auto rank = static_cast<int64_t>(data.shape().size());
  const int64_t axis = normalizeAxis(intAttribute(node, "axis", 0, subject), rank, subject);
  Tensor indices = operand(node, 1, subject);
  if (indices.dtype() != DType::Int32)
    unsupported(fmt::format("indices \"{}\" are {}; integer indices are expected", node.input(1),
                            typeName(values_.at(node.input(1)).type)));
  setOutput(node, 0, ops::gather(data, indices, axis));
}

void Importer::mapElements(const onnx::NodeProto& node, const std::string& subject) {
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  // Elements by index along `axis` (torch.gather, scatter, scatter_add).
  const bool scatter = node.op_type() == "ScatterElements";
  const std::string reduction = scatter ? stringAttribute(node, "reduction", "none", subject) : "none";
  if (reduction != "none" && reduction != "add")
    throwOnnx(ErrorCode::OnnxUnsupportedScatterReduction, subject,
              fmt::format("attribute reduction is \"{}\"; allowed: \"none\" (write), \"add\"", reduction));
  Tensor data = operand(node, 0, subject);
  requireFloat(data, node, 0, subject);
  const auto rank = static_cast<int64_t>(data.shape().size());
  const int64_t axis = normalizeAxis(intAttribute(node, "axis", 0, subject), rank, subject);
  Tensor indices = operand(node, 1, subject);
  if (indices.dtype() != DType::Int32)
    unsupported(fmt::format("indices \"{}\" are {}; integer indices are expected", node.input(1),
                            typeName(values_.at(node.input(1)).type)));
  if (!scatter) {
    setOutput(node, 0, ops::gatherElements(data, indices, axis));
    return;
  }
  Tensor updates = operand(node, 2, subject);
  requireFloat(updates, node, 2, subject);
  setOutput(node, 0, ops::scatterElements(data, indices, updates, axis, reduction == "add"));
}

void addGatherMappings(OnnxMappingTable& table) {
  table.add({.opType = "Gather",
             .map = &Importer::mapGather,
             .requiredInputs = 2,
             .differentiable = {0},
             .checksFloatOperands = false,
             .onKnownValues = true});
  table.add({.opType = "GatherElements", .map = &Importer::mapElements, .requiredInputs = 2, .differentiable = {0}});
  table.add(
      {.opType = "ScatterElements", .map = &Importer::mapElements, .requiredInputs = 3, .differentiable = {0, 2}});
}

}  // namespace tessera::onnx_import
