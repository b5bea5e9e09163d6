// ONNX mapping of the gather family (lib/ops/gather.cc): Gather of a model value
// (a Gather of a value known at import is folded, onnx/const_eval.cc),
// GatherElements and ScatterElements.

#include <fmt/format.h>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {

Importer::IndexedData Importer::indexedData(const onnx::NodeProto& node, const std::string& subject) {
  Tensor data = operand(node, 0, subject);
  requireFloat(data, node, 0, subject);
  const auto rank = static_cast<int64_t>(data.shape().size());
  const int64_t axis = normalizeAxis(intAttribute(node, "axis", 0, subject), rank, subject);
  Tensor indices = operand(node, 1, subject);
  if (indices.dtype() != DType::Int32)
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
              fmt::format("indices \"{}\" are {}; integer indices are expected", node.input(1),
                          typeName(values_.at(node.input(1)).type)));
  return {std::move(data), std::move(indices), axis};
}

void Importer::mapGather(const onnx::NodeProto& node, const std::string& subject) {
  // A Gather of known data with computed indices.
  if (knownInput(node, 0) != nullptr) refuseComputedInput(node.op_type(), subject);
  // Slices of a model value along any axis (rows of an embedding table,
  // a class token): the device's Gather.
  const IndexedData in = indexedData(node, subject);
  setOutput(node, 0, ops::gather(in.data, in.indices, in.axis));
}

void Importer::mapElements(const onnx::NodeProto& node, const std::string& subject) {
  // Elements by index along `axis` (torch.gather, scatter, scatter_add).
  const bool scatter = node.op_type() == "ScatterElements";
  const std::string reduction = scatter ? stringAttribute(node, "reduction", "none", subject) : "none";
  if (reduction != "none" && reduction != "add")
    throwOnnx(ErrorCode::OnnxUnsupportedScatterReduction, subject,
              fmt::format("attribute reduction is \"{}\"; allowed: \"none\" (write), \"add\"", reduction));
  const IndexedData in = indexedData(node, subject);
  if (!scatter) {
    setOutput(node, 0, ops::gatherElements(in.data, in.indices, in.axis));
    return;
  }
  Tensor updates = operand(node, 2, subject);
  requireFloat(updates, node, 2, subject);
  setOutput(node, 0, ops::scatterElements(in.data, in.indices, updates, in.axis, reduction == "add"));
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
