// ONNX mapping of the softmax family (lib/ops/softmax.cc): Softmax and
// LogSoftmax along any axis, and the losses SoftmaxCrossEntropyLoss and
// NegativeLogLikelihoodLoss (the fused SoftmaxCrossEntropy where it fits, else composed).

#include <numeric>

#include <fmt/format.h>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {

void Importer::mapSoftmax(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  Tensor x = operand(node, 0, subject);
  requireFloat(x, node, 0, subject);
  const auto rank = static_cast<int64_t>(x.shape().size());
  if (rank == 0) unsupported("a scalar input");
  const int64_t axis =
      normalizeAxis(intAttribute(node, "axis", opset_ >= 13 ? -1 : 1, subject), rank, subject);
  auto apply = [&](Tensor t) { return op == "Softmax" ? ops::softmax(t) : ops::logSoftmax(t); };
  if (axis == rank - 1) {
    setOutput(node, 0, apply(x));
  } else if (opset_ < 13) {
    // Before opset 13 the op works on the input flattened to 2-D at `axis`.
    const Shape s = x.shape();  // a copy: adding ops may move the graph's tensors
    const int64_t outer = std::accumulate(s.begin(), s.begin() + axis, int64_t{1}, std::multiplies<>());
    const int64_t inner = std::accumulate(s.begin() + axis, s.end(), int64_t{1}, std::multiplies<>());
    setOutput(node, 0, ops::reshape(apply(ops::reshape(x, {outer, inner})), s));
  } else {
    std::vector<int64_t> perm(static_cast<std::size_t>(rank));
    std::iota(perm.begin(), perm.end(), 0);
    std::swap(perm[static_cast<std::size_t>(axis)], perm.back());
    setOutput(node, 0, ops::transpose(apply(ops::transpose(x, perm)), perm));
  }
}

void Importer::mapLoss(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  // Scores [N, C, d1...] and labels [N, d1...]. [N, C] scores with reduction
  // mean or sum, no weights and no ignored class run tessera's fused
  // SoftmaxCrossEntropy (which refuses labels outside [0, C)). Everything
  // else is composed exactly: log-probabilities with the class axis last,
  // a one-hot mask of the labels (Equal against the class indices), the
  // picked values summed, ignored labels masked out; mean divides by the
  // summed weights of the labels kept (their count without weights), as
  // ONNX and PyTorch do. A label outside [0, C) that is not ignore_index
  // selects no class there (loss 0) where PyTorch raises.
  const bool softmax = op == "SoftmaxCrossEntropyLoss";
  Tensor scores = operand(node, 0, subject);
  requireFloat(scores, node, 0, subject);
  // Float16 scores (OnnxImportOptions::floatType) are cast to float32 first,
  // as mixed-precision training casts its logits: the loss, its
  // log-probabilities and their gradient are float32.
  if (scores.dtype() == DType::Float16) scores = ops::cast(scores, DType::Float32);
  const Shape shape = scores.shape();
  const auto rank = static_cast<int64_t>(shape.size());
  if (rank < 2) unsupported(fmt::format("scores {} need a class axis: [N, C, d1...]", shapeStr(shape)));
  const std::string reduction = stringAttribute(node, "reduction", "mean", subject);
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    unsupported(fmt::format("reduction \"{}\": only \"mean\", \"sum\" and \"none\" exist", reduction));
  Tensor labels = operand(node, 1, subject);
  if (labels.dtype() != DType::Int32)
    unsupported(fmt::format("labels \"{}\" are {}; int64 or int32 class indices are supported", node.input(1),
                            typeName(values_.at(node.input(1)).type)));
  Shape labelShape = shape;
  labelShape.erase(labelShape.begin() + 1);
  if (labels.shape() != labelShape)
    throwOnnx(ErrorCode::OnnxNodeShape, subject,
              fmt::format("labels {} do not fit scores {}: expected {}", shapeStr(labels.shape()),
                          shapeStr(shape), shapeStr(labelShape)));
  const int64_t classes = shape[1];
  const bool hasWeights = node.input_size() > 2 && !node.input(2).empty();
  const bool hasIgnore = findAttribute(node, "ignore_index") != nullptr;
  const int64_t ignore = intAttribute(node, "ignore_index", 0, subject);
  const bool ignoresAClass = hasIgnore && ignore >= 0 && ignore < classes;
  if (softmax && rank == 2 && reduction != "none" && !hasWeights && !ignoresAClass) {
    setOutput(node, 0,
              ops::softmaxCrossEntropy(scores, labels,
                                       reduction == "mean" ? ReductionType::Mean : ReductionType::Sum));
    if (node.output_size() > 1) setOutput(node, 1, ops::logSoftmax(scores));
    return;
  }
  // The class axis last: [N, d1..., C].
  std::vector<int64_t> perm{0};
  for (int64_t a = 2; a < rank; ++a) perm.push_back(a);
  perm.push_back(1);
  std::vector<int64_t> back(perm.size());
  for (std::size_t a = 0; a < perm.size(); ++a)
    back[static_cast<std::size_t>(perm[a])] = static_cast<int64_t>(a);
  Tensor logp = rank == 2 ? scores : ops::transpose(scores, perm);
  if (softmax) logp = ops::logSoftmax(logp);
  if (softmax && node.output_size() > 1 && !node.output(1).empty())
    setOutput(node, 1, rank == 2 ? logp : ops::transpose(logp, back));
  std::vector<float> indices(static_cast<std::size_t>(classes));
  for (std::size_t c = 0; c < indices.size(); ++c) indices[c] = static_cast<float>(c);
  const Tensor classIndex = ops::constant(graph_, graph_.uniqueName(node.output(0) + ".classes"),
                                          std::move(indices), {classes}, DType::Int32);
  Shape column = labelShape;
  column.push_back(1);
  Tensor picked = ops::equal(ops::reshape(labels, column), classIndex);  // [N, d..., C] one-hot
  if (hasWeights) {
    Tensor weights = operand(node, 2, subject);
    requireFloat(weights, node, 2, subject);
    if (weights.dtype() == DType::Float16) weights = ops::cast(weights, DType::Float32);
    if (weights.shape() != Shape{classes})
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("weights {} must be [C] = [{}]", shapeStr(weights.shape()), classes));
    picked = ops::mul(picked, weights);
  }
  if (hasIgnore) {
    if (ignore < -(int64_t{1} << 24) || ignore > (int64_t{1} << 24))
      unsupported(fmt::format("ignore_index {} does not fit the device's integers (|v| <= 2^24)", ignore));
    const Tensor ignored = ops::constant(graph_, graph_.uniqueName(node.output(0) + ".ignore_index"),
                                         {static_cast<float>(ignore)}, {}, DType::Int32);
    picked = ops::mul(picked, ops::reshape(ops::logicalNot(ops::equal(labels, ignored)), column));
  }
  const Tensor losses = ops::neg(ops::reduceSum(ops::mul(picked, logp), {-1}));  // [N, d...]
  Tensor loss = losses;
  if (reduction == "sum") {
    loss = ops::reduceSum(losses);
  } else if (reduction == "mean") {
    loss = ops::div(ops::reduceSum(losses), ops::reduceSum(picked));
  }
  setOutput(node, 0, loss);
}

void addSoftmaxMappings(OnnxMappingTable& table) {
  for (std::string_view op : {"Softmax", "LogSoftmax"})
    table.add({.opType = op, .map = &Importer::mapSoftmax, .differentiable = {0}});
  for (std::string_view op : {"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"})
    table.add({.opType = op, .map = &Importer::mapLoss, .requiredInputs = 2, .differentiable = {0}});
}

}  // namespace tessera::onnx_import
