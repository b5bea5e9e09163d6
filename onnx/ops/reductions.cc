// ONNX mapping of the reductions family (lib/ops/reductions.cc): ReduceSum and
// ReduceMean, their axes an attribute or (ReduceSum from opset 13) an input known at import.

#include <numeric>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {

void Importer::mapReduce(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  Tensor x = operand(node, 0, subject);
  requireFloat(x, node, 0, subject);
  std::optional<std::vector<int64_t>> axes;
  bool noopWithEmptyAxes = false;
  if (op == "ReduceSum" && opset_ >= 13) {
    if (const Known* a = knownInput(node, 1)) {
      axes = intList(*a, subject, "axes");
    } else if (node.input_size() > 1 && !node.input(1).empty()) {
      requireKnown(node, 1, subject, "axes");
    }
    noopWithEmptyAxes = intAttribute(node, "noop_with_empty_axes", 0, subject) != 0;
  } else {
    axes = intsAttribute(node, "axes", subject);
  }
  const bool keepDims = intAttribute(node, "keepdims", 1, subject) != 0;
  if (!axes || axes->empty()) {
    if (noopWithEmptyAxes) {
      values_[node.output(0)] = values_.at(node.input(0));
      return;
    }
    axes = std::vector<int64_t>(x.shape().size());
    std::iota(axes->begin(), axes->end(), 0);
  }
  const auto rank = static_cast<int64_t>(x.shape().size());
  for (int64_t& a : *axes) a = normalizeAxis(a, rank, subject);
  if (axes->empty()) {
    values_[node.output(0)] = values_.at(node.input(0));
    return;
  }
  setOutput(node, 0,
            op == "ReduceSum" ? ops::reduceSum(x, *axes, keepDims) : ops::reduceMean(x, *axes, keepDims));
}

void addReductionMappings(OnnxMappingTable& table) {
  for (std::string_view op : {"ReduceSum", "ReduceMean"})
    table.add({.opType = op, .map = &Importer::mapReduce, .differentiable = {0}});
}

}  // namespace tessera::onnx_import
