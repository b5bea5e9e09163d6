// ONNX mapping of the matmul family (lib/ops/matmul.cc): MatMul (numpy's
// broadcasting of batches) and Gemm (transposes, a MatMul and a scaled Add).

#include <algorithm>

#include <fmt/format.h>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {

void Importer::mapMatMul(const onnx::NodeProto& node, const std::string& subject) {
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  Tensor a = operand(node, 0, subject);
  Tensor b = operand(node, 1, subject);
  requireFloat(a, node, 0, subject);
  requireFloat(b, node, 1, subject);
  const Shape sa = a.shape();
  const Shape sb = b.shape();
  if (sa.empty() || sb.empty()) throwOnnx(ErrorCode::OnnxNodeShape, subject, "MatMul of a scalar");
  // ONNX's output shape (numpy matmul), computed before the operands are reshaped.
  const Shape batchA(sa.begin(), sa.end() - (sa.size() > 1 ? 2 : 1));
  const Shape batchB(sb.begin(), sb.end() - (sb.size() > 1 ? 2 : 1));
  Shape outShape = broadcastShapes(batchA, batchB, subject);
  if (std::any_of(batchB.begin(), batchB.end(), [](int64_t d) { return d != 1; })) {
    // A batched right operand (attention's scores and context): both
    // operands broadcast to the common batch, then one product per index.
    if (sa.size() < 2 || sb.size() < 2)
      unsupported(fmt::format("a vector times the batched {}: give the vector a matrix axis", shapeStr(sb)));
    Shape fullA = outShape;
    fullA.insert(fullA.end(), sa.end() - 2, sa.end());
    Shape fullB = outShape;
    fullB.insert(fullB.end(), sb.end() - 2, sb.end());
    if (sa != fullA) a = ops::broadcastTo(a, fullA);
    if (sb != fullB) b = ops::broadcastTo(b, fullB);
    Shape result = outShape;
    result.push_back(sa[sa.size() - 2]);
    result.push_back(sb.back());
    const Tensor y = ops::batchMatmul(a, b);
    setOutput(node, 0, y.shape() == result ? y : ops::reshape(y, result));
    return;
  }
  if (sa.size() > 1) outShape.push_back(sa[sa.size() - 2]);
  if (sb.size() > 1) outShape.push_back(sb.back());
  if (sa.size() == 1) a = ops::reshape(a, {1, sa[0]});
  if (sb.size() == 1) {
    b = ops::reshape(b, {sb[0], 1});
  } else if (sb.size() > 2) {
    b = ops::reshape(b, {sb[sb.size() - 2], sb.back()});
  }
  Tensor y = ops::matmul(a, b);
  setOutput(node, 0, y.shape() == outShape ? y : ops::reshape(y, outShape));
}

void Importer::mapGemm(const onnx::NodeProto& node, const std::string& subject) {
  Tensor a = operand(node, 0, subject);
  Tensor b = operand(node, 1, subject);
  requireFloat(a, node, 0, subject);
  requireFloat(b, node, 1, subject);
  if (a.shape().size() != 2 || b.shape().size() != 2)
    throwOnnx(ErrorCode::OnnxNodeShape, subject,
              fmt::format("A {} and B {} must be matrices", shapeStr(a.shape()), shapeStr(b.shape())));
  const double alpha = floatAttribute(node, "alpha", 1.0F, subject);
  const double beta = floatAttribute(node, "beta", 1.0F, subject);
  if (intAttribute(node, "transA", 0, subject) != 0) a = ops::transpose(a, {1, 0});
  if (intAttribute(node, "transB", 0, subject) != 0) b = ops::transpose(b, {1, 0});
  Tensor y = ops::matmul(a, b);
  if (alpha != 1.0) y = ops::mul(y, scalar(alpha, y.dtype()));
  if (node.input_size() > 2 && !node.input(2).empty() && beta != 0.0) {
    Tensor c = operand(node, 2, subject);
    requireFloat(c, node, 2, subject);
    y = ops::add(y, beta == 1.0 ? c : ops::mul(c, scalar(beta, c.dtype())));
  }
  setOutput(node, 0, y);
}

void addMatMulMappings(OnnxMappingTable& table) {
  table.add({.opType = "MatMul",
             .map = &Importer::mapMatMul,
             .requiredInputs = 2,
             .allInputsDifferentiable = true});
  table.add(
      {.opType = "Gemm", .map = &Importer::mapGemm, .requiredInputs = 2, .allInputsDifferentiable = true});
}

}  // namespace tessera::onnx_import
