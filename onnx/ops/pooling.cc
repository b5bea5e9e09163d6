// ONNX mapping of the pooling family (lib/ops/pooling.cc): MaxPool and AveragePool
// (their windows read by Importer::mapWindowOp, onnx/ops/conv.cc), and the global pools.

#include <fmt/format.h>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {

void Importer::mapGlobalPool(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  Tensor x = operand(node, 0, subject);
  requireFloat(x, node, 0, subject);
  if (x.shape().size() < 3)
    throwOnnx(ErrorCode::OnnxNodeShape, subject,
              fmt::format("X {} must be [N, C, D..] with at least one spatial axis", shapeStr(x.shape())));
  setOutput(node, 0, op == "GlobalAveragePool" ? ops::globalAveragePool(x) : ops::globalMaxPool(x));
}

void addPoolingMappings(OnnxMappingTable& table) {
  for (std::string_view op : {"MaxPool", "AveragePool"})
    table.add({.opType = op, .map = &Importer::mapWindow, .differentiable = {0}});
  for (std::string_view op : {"GlobalAveragePool", "GlobalMaxPool"})
    table.add({.opType = op, .map = &Importer::mapGlobalPool, .differentiable = {0}});
}

}  // namespace tessera::onnx_import
