// ONNX mapping of the conv family (lib/ops/conv.cc): Conv and ConvTranspose, and
// the window attributes they share with the pooling family's MaxPool and AveragePool.

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {

void Importer::mapWindow(const onnx::NodeProto& node, const std::string& subject) {
  setOutput(node, 0, mapWindowOp(node, subject));
}

// Conv, ConvTranspose, MaxPool and AveragePool: their windows from the ONNX
// attributes (auto_pad resolved to explicit pads on the bound shapes), a
// Conv's bias added per output channel.
Tensor Importer::mapWindowOp(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  const bool conv = op == "Conv" || op == "ConvTranspose";
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  Tensor x = operand(node, 0, subject);
  requireFloat(x, node, 0, subject);
  const Shape xs = x.shape();  // a copy: adding ops may move the graph's tensors
  if (xs.size() < 3 || xs.size() > 5)
    unsupported(fmt::format("X {} has {} spatial axes; 1 to 3 are supported", shapeStr(xs),
                            static_cast<int64_t>(xs.size()) - 2));
  const std::size_t r = xs.size() - 2;
  Tensor w;
  if (conv) {
    w = operand(node, 1, subject);
    requireFloat(w, node, 1, subject);
    if (w.shape().size() != xs.size())
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("W {} must have X {}'s rank", shapeStr(w.shape()), shapeStr(xs)));
  }
  // Attributes with one value per spatial axis (pads: two).
  auto perAxis = [&](std::string_view name, std::size_t count, int64_t fallback) {
    std::vector<int64_t> values =
        intsAttribute(node, name, subject).value_or(std::vector<int64_t>(count, fallback));
    if (values.size() != count)
      throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
                fmt::format("{} has {} values, needs {} for {} spatial axes", name, values.size(), count, r));
    return values;
  };
  const Shape spatialW = conv ? Shape(w.shape().begin() + 2, w.shape().end()) : Shape{};
  std::optional<std::vector<int64_t>> kernel = intsAttribute(node, "kernel_shape", subject);
  if (conv && kernel && *kernel != spatialW)
    throwOnnx(ErrorCode::OnnxNodeShape, subject,
              fmt::format("kernel_shape [{}] differs from the weight's spatial shape {}",
                          fmt::join(*kernel, ", "), shapeStr(spatialW)));
  if (!conv && !kernel) throwOnnx(ErrorCode::OnnxInvalidGraph, subject, "kernel_shape is required");
  const Shape k = conv ? spatialW : *kernel;
  if (k.size() != r)
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
              fmt::format("kernel_shape [{}] needs {} values", fmt::join(k, ", "), r));
  const std::vector<int64_t> strides = perAxis("strides", r, 1);
  const std::vector<int64_t> dilations = perAxis("dilations", r, 1);
  std::vector<int64_t> pads = perAxis("pads", 2 * r, 0);
  std::vector<int64_t> outputPadding =
      op == "ConvTranspose" ? perAxis("output_padding", r, 0) : std::vector<int64_t>{};
  const std::string autoPad = stringAttribute(node, "auto_pad", "NOTSET", subject);
  if (autoPad != "NOTSET" && autoPad != "VALID" && autoPad != "SAME_UPPER" && autoPad != "SAME_LOWER")
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
              fmt::format("auto_pad \"{}\": NOTSET, VALID, SAME_UPPER or SAME_LOWER", autoPad));
  if (autoPad == "VALID") pads.assign(2 * r, 0);
  const bool upper = autoPad != "SAME_LOWER";
  // A total pad split over the axis's two ends.
  auto split = [&](std::size_t d, int64_t total) {
    pads[d] = upper ? total / 2 : total - total / 2;
    pads[d + r] = total - pads[d];
  };
  if (op == "ConvTranspose") {
    std::optional<std::vector<int64_t>> outputShape = intsAttribute(node, "output_shape", subject);
    if (outputShape && outputShape->size() == r + 2)
      outputShape->erase(outputShape->begin(), outputShape->begin() + 2);
    if (!outputShape && (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER")) {
      outputShape = std::vector<int64_t>(r);
      for (std::size_t d = 0; d < r; ++d) (*outputShape)[d] = xs[d + 2] * strides[d];
    }
    if (outputShape) {
      if (outputShape->size() != r)
        throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
                  fmt::format("output_shape [{}] needs {} values", fmt::join(*outputShape, ", "), r));
      for (std::size_t d = 0; d < r; ++d) {
        // ONNX's rule: the total pad, split with the extra one at the begin
        // unless SAME_UPPER; a negative end grows the output at the end.
        const int64_t total = strides[d] * (xs[d + 2] - 1) + outputPadding[d] + (k[d] - 1) * dilations[d] +
                              1 - (*outputShape)[d];
        const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
        pads[d] = autoPad == "SAME_UPPER" ? half : total - half;
        pads[d + r] = total - pads[d];
        if (pads[d + r] < 0) {
          outputPadding[d] -= pads[d + r];
          pads[d + r] = 0;
        }
        if (pads[d] < 0)
          unsupported(fmt::format("output_shape [{}] would need a negative begin pad on spatial axis {}",
                                  fmt::join(*outputShape, ", "), d));
      }
    }
  } else if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") {
    for (std::size_t d = 0; d < r; ++d) {
      const int64_t out = (xs[d + 2] + strides[d] - 1) / strides[d];
      split(d, std::max<int64_t>(0, (out - 1) * strides[d] + (k[d] - 1) * dilations[d] + 1 - xs[d + 2]));
    }
  }
  if (!conv) {
    if (op == "MaxPool" && node.output_size() > 1 && !node.output(1).empty())
      throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
                fmt::format("the Indices output \"{}\" is not supported (only Y, the pooled values)",
                            node.output(1)));
    ops::PoolParams params;
    params.kernel = k;
    params.strides = strides;
    params.pads = pads;
    params.dilations = dilations;
    params.ceilMode = intAttribute(node, "ceil_mode", 0, subject) != 0;
    params.countIncludePad = op == "AveragePool" && intAttribute(node, "count_include_pad", 0, subject) != 0;
    return op == "MaxPool" ? ops::maxPool(x, params) : ops::averagePool(x, params);
  }
  ops::ConvParams params;
  params.strides = strides;
  params.pads = pads;
  params.dilations = dilations;
  params.group = intAttribute(node, "group", 1, subject);
  params.outputPadding = outputPadding;
  Tensor y = op == "Conv" ? ops::conv(x, w, params) : ops::convTranspose(x, w, params);
  if (node.input_size() > 2 && !node.input(2).empty()) {
    Tensor b = operand(node, 2, subject);
    requireFloat(b, node, 2, subject);
    const int64_t channels = y.shape()[1];
    if (b.shape() != Shape{channels})
      throwOnnx(
          ErrorCode::OnnxNodeShape, subject,
          fmt::format("B {} must be [{}], one value per output channel", shapeStr(b.shape()), channels));
    Shape perChannel(xs.size() - 1, 1);
    perChannel[0] = channels;
    y = ops::add(y, ops::reshape(b, perChannel));
  }
  return y;
}

void addConvMappings(OnnxMappingTable& table) {
  for (std::string_view op : {"Conv", "ConvTranspose"})
    table.add({.opType = op, .map = &Importer::mapWindow, .requiredInputs = 2, .differentiable = {0, 1, 2}});
}

}  // namespace tessera::onnx_import
