// ONNX mapping of the shape ops family (lib/ops/shape_ops.cc): reshapes,
// transposes, slices, concatenations, broadcasts and pads; Shape and Size are
// folded at import (onnx/const_eval.cc, from the input's static shape).

#include <algorithm>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {

void Importer::mapPad(const onnx::NodeProto& node, const std::string& subject) {
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  // pads [b1.., e1..] known at import. constant: SlicePad places the input
  // into zeros (a non-zero value is selected where the padding is); edge and
  // reflect: slices of the border concatenated on each side, axis by axis.
  Tensor x = operand(node, 0, subject);
  const Shape shape = x.shape();
  const std::size_t rank = shape.size();
  const std::vector<int64_t> pads = intList(requireKnown(node, 1, subject, "pads"), subject, "pads");
  if (pads.size() != 2 * rank)
    throwOnnx(
        ErrorCode::OnnxNodeShape, subject,
        fmt::format("pads [{}] need 2 x {} entries for {}", fmt::join(pads, ", "), rank, shapeStr(shape)));
  for (int64_t p : pads)
    if (p < 0)
      unsupported(
          fmt::format("pads [{}]: negative pads (cropping) are not supported", fmt::join(pads, ", ")));
  const std::string mode = stringAttribute(node, "mode", "constant", subject);
  const int32_t type = values_.at(node.input(0)).type;
  Shape out = shape;
  for (std::size_t d = 0; d < rank; ++d) out[d] += pads[d] + pads[rank + d];
  if (mode == "constant") {
    // The value: known at import, or a computed scalar.
    double value = 0.0;
    Tensor computedValue;
    if (node.input_size() > 2 && !node.input(2).empty()) {
      if (const Known* v = knownInput(node, 2)) {
        if (v->size() != 1) unsupported("constant_value must be one value");
        value = v->at(0);
      } else {
        computedValue = operand(node, 2, subject);
        if (numElements(computedValue.shape()) != 1 || computedValue.dtype() != x.dtype())
          unsupported("constant_value must be one value of the input's type");
        computedValue = ops::reshape(computedValue, {});
      }
    }
    OpAttributes attributes;
    attributes.shape = out;
    for (std::size_t d = 0; d < rank; ++d) {
      attributes.starts.push_back(pads[d]);
      attributes.ends.push_back(pads[d] + shape[d]);
    }
    Tensor y{&graph_, graph_.op(graph_.addOp(OpKind::SlicePad, {x.id()}, attributes)).outputs.at(0)};
    if (value != 0.0 || computedValue.valid()) {
      // A select (not an add), so that an infinite value stays out of the input's place.
      std::vector<float> padding(static_cast<std::size_t>(numElements(out)), 1.0F);
      for (std::size_t i = 0; i < padding.size(); ++i) {
        bool inside = true;
        std::size_t rest = i;
        for (std::size_t d = rank; d-- > 0;) {
          const auto index = static_cast<int64_t>(rest % static_cast<std::size_t>(out[d]));
          rest /= static_cast<std::size_t>(out[d]);
          inside = inside && index >= pads[d] && index < pads[d] + shape[d];
        }
        if (inside) padding[i] = 0.0F;
      }
      const Tensor mask =
          ops::constant(graph_, graph_.uniqueName(node.output(0) + ".padding"), std::move(padding), out);
      const Tensor fill = computedValue.valid()
                              ? computedValue
                              : ops::constant(graph_, graph_.uniqueName(node.output(0) + ".value"),
                                              {static_cast<float>(value)}, {}, x.dtype());
      y = ops::where(mask, fill, y);
    }
    setOutput(node, 0, y, type);
    return;
  }
  if (mode != "edge" && mode != "reflect")
    unsupported(fmt::format("mode \"{}\": constant, edge and reflect are supported", mode));
  for (std::size_t d = 0; d < rank; ++d) {
    const int64_t before = pads[d];
    const int64_t after = pads[rank + d];
    if (before == 0 && after == 0) continue;
    const int64_t n = x.shape()[d];
    if (mode == "reflect" && (before >= n || after >= n))
      unsupported(fmt::format("reflect pads of {} and {} on axis {} of size {}: each must be below the size",
                              before, after, d, n));
    auto at = [&](int64_t i) {
      std::vector<int64_t> starts(rank, 0);
      std::vector<int64_t> ends = x.shape();
      starts[d] = i;
      ends[d] = i + 1;
      return ops::slice(x, starts, ends);
    };
    std::vector<Tensor> parts;
    for (int64_t k = before; k >= 1; --k) parts.push_back(mode == "edge" ? at(0) : at(k));
    parts.push_back(x);
    for (int64_t k = 1; k <= after; ++k) parts.push_back(mode == "edge" ? at(n - 1) : at(n - 1 - k));
    x = ops::concat(parts, static_cast<int64_t>(d));
  }
  setOutput(node, 0, x, type);
}

void Importer::mapIdentity(const onnx::NodeProto& node, const std::string& /*subject*/) {
  values_[node.output(0)] = values_.at(node.input(0));
}

void Importer::mapSplit(const onnx::NodeProto& node, const std::string& subject) {
  // Slices of the input along `axis`: the sizes from the `split` input
  // (opset 13 on) or attribute, else equal parts, one per output.
  Tensor x = operand(node, 0, subject);
  const Shape shape = x.shape();
  const auto rank = static_cast<int64_t>(shape.size());
  const int64_t axis = normalizeAxis(intAttribute(node, "axis", 0, subject), rank, subject);
  const auto a = static_cast<std::size_t>(axis);
  std::optional<std::vector<int64_t>> sizes;
  if (opset_ >= 13) {
    if (node.input_size() > 1 && !node.input(1).empty())
      sizes = intList(requireKnown(node, 1, subject, "split"), subject, "split");
  } else {
    sizes = intsAttribute(node, "split", subject);
  }
  const auto parts = static_cast<int64_t>(node.output_size());
  if (!sizes) {
    if (parts < 1 || shape[a] % parts != 0)
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("axis {} of {} does not split into {} equal parts; give the sizes", axis,
                            shapeStr(shape), parts));
    sizes = std::vector<int64_t>(static_cast<std::size_t>(parts), shape[a] / parts);
  }
  int64_t total = 0;
  bool negative = false;
  for (int64_t size : *sizes) {
    negative = negative || size < 0;
    total += size;
  }
  if (negative || static_cast<int64_t>(sizes->size()) != parts || total != shape[a])
    throwOnnx(ErrorCode::OnnxNodeShape, subject,
              fmt::format("split sizes [{}] for {} outputs do not add up to axis {} of {}",
                          fmt::join(*sizes, ", "), parts, axis, shapeStr(shape)));
  std::vector<int64_t> starts(shape.size(), 0);
  std::vector<int64_t> ends = shape;
  for (int k = 0; k < node.output_size(); ++k) {
    ends[a] = starts[a] + (*sizes)[static_cast<std::size_t>(k)];
    if (!node.output(k).empty())
      setOutput(node, k, ops::slice(x, starts, ends), values_.at(node.input(0)).type);
    starts[a] = ends[a];
  }
}

void Importer::mapTile(const onnx::NodeProto& node, const std::string& subject) {
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  // Copies concatenated along each axis; the repeats are known at import.
  Tensor x = operand(node, 0, subject);
  const std::vector<int64_t> repeats = intList(requireKnown(node, 1, subject, "repeats"), subject, "repeats");
  if (repeats.size() != x.shape().size())
    throwOnnx(ErrorCode::OnnxNodeShape, subject,
              fmt::format("repeats [{}] need one entry per axis of {}", fmt::join(repeats, ", "),
                          shapeStr(x.shape())));
  for (std::size_t d = 0; d < repeats.size(); ++d) {
    if (repeats[d] < 1)
      unsupported(fmt::format("repeat {} on axis {}: repeats must be at least 1", repeats[d], d));
    if (repeats[d] > 1)
      x = ops::concat(std::vector<Tensor>(static_cast<std::size_t>(repeats[d]), x), static_cast<int64_t>(d));
  }
  setOutput(node, 0, x, values_.at(node.input(0)).type);
}

void Importer::mapReshape(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  Tensor x = operand(node, 0, subject);
  const Shape s = x.shape();  // a copy: adding ops may move the graph's tensors
  Shape target;
  if (op == "Reshape") {
    const bool allowZero = opset_ >= 14 && intAttribute(node, "allowzero", 0, subject) != 0;
    target = reshapeTarget(s, intList(requireKnown(node, 1, subject, "shape"), subject, "shape"), allowZero,
                           subject);
  } else if (op == "Flatten") {
    const auto rank = static_cast<int64_t>(s.size());
    int64_t axis = intAttribute(node, "axis", 1, subject);
    axis = axis == rank ? rank : normalizeAxis(axis, rank, subject);
    const int64_t outer = std::accumulate(s.begin(), s.begin() + axis, int64_t{1}, std::multiplies<>());
    target = {outer, numElements(s) / std::max<int64_t>(outer, 1)};
  } else {
    std::optional<std::vector<int64_t>> axes;
    if (opset_ >= 13) {
      if (node.input_size() > 1 && !node.input(1).empty())
        axes = intList(requireKnown(node, 1, subject, "axes"), subject, "axes");
    } else {
      axes = intsAttribute(node, "axes", subject);
    }
    if (op == "Unsqueeze") {
      if (!axes) throwOnnx(ErrorCode::OnnxInvalidGraph, subject, "Unsqueeze needs axes");
      target = unsqueezeShape(s, *axes, subject);
    } else {
      target = squeezeShape(s, axes, subject);
    }
  }
  if (std::find(target.begin(), target.end(), 0) != target.end())
    unsupported(
        fmt::format("the result {} is empty; tensors of zero elements are not supported", shapeStr(target)));
  setOutput(node, 0, ops::reshape(x, target), values_.at(node.input(0)).type);
}

void Importer::mapTranspose(const onnx::NodeProto& node, const std::string& subject) {
  Tensor x = operand(node, 0, subject);
  std::vector<int64_t> perm = intsAttribute(node, "perm", subject).value_or(std::vector<int64_t>{});
  if (perm.empty()) {
    perm.resize(x.shape().size());
    std::iota(perm.rbegin(), perm.rend(), 0);
  }
  setOutput(node, 0, ops::transpose(x, perm), values_.at(node.input(0)).type);
}

void Importer::mapSlice(const onnx::NodeProto& node, const std::string& subject) {
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  Tensor x = operand(node, 0, subject);
  std::optional<std::vector<int64_t>> axes, steps;
  const auto starts = intList(requireKnown(node, 1, subject, "starts"), subject, "starts");
  const auto ends = intList(requireKnown(node, 2, subject, "ends"), subject, "ends");
  if (node.input_size() > 3 && !node.input(3).empty())
    axes = intList(requireKnown(node, 3, subject, "axes"), subject, "axes");
  if (node.input_size() > 4 && !node.input(4).empty())
    steps = intList(requireKnown(node, 4, subject, "steps"), subject, "steps");
  const SliceRange r = sliceRange(x.shape(), starts, ends, axes, steps, subject);
  for (int64_t step : r.steps)
    if (step != 1) unsupported(fmt::format("step {}: only steps of 1 are supported", step));
  if (std::find(r.outShape.begin(), r.outShape.end(), 0) != r.outShape.end())
    unsupported(fmt::format("the result {} is empty; tensors of zero elements are not supported",
                            shapeStr(r.outShape)));
  setOutput(node, 0, ops::slice(x, r.starts, r.ends), values_.at(node.input(0)).type);
}

void Importer::mapConcat(const onnx::NodeProto& node, const std::string& subject) {
  std::vector<Tensor> parts;
  for (int k = 0; k < node.input_size(); ++k)
    if (!node.input(k).empty()) parts.push_back(operand(node, k, subject));
  if (parts.empty()) throwOnnx(ErrorCode::OnnxInvalidGraph, subject, "Concat without inputs");
  const auto rank = static_cast<int64_t>(parts[0].shape().size());
  const int64_t axis = normalizeAxis(intAttribute(node, "axis", 0, subject), rank, subject);
  setOutput(node, 0, parts.size() == 1 ? parts[0] : ops::concat(parts, axis), values_.at(node.input(0)).type);
}

void Importer::mapExpand(const onnx::NodeProto& node, const std::string& subject) {
  Tensor x = operand(node, 0, subject);
  const Shape target =
      broadcastShapes(x.shape(), intList(requireKnown(node, 1, subject, "shape"), subject, "shape"), subject);
  if (target == x.shape()) {
    values_[node.output(0)] = values_.at(node.input(0));
    return;
  }
  setOutput(node, 0, ops::broadcastTo(x, target), values_.at(node.input(0)).type);
}

void addShapeMappings(OnnxMappingTable& table) {
  table.add({.opType = "Identity", .map = &Importer::mapIdentity, .differentiable = {0}});
  for (std::string_view op : {"Reshape", "Flatten", "Squeeze"})
    table.add({.opType = op,
               .map = &Importer::mapReshape,
               .requiredInputs = op == "Reshape" ? 2 : 1,
               .differentiable = {0}});
  // Unsqueeze's axes: an attribute before opset 13, a required input from it on.
  table.add({.opType = "Unsqueeze", .maxOpset = 12, .map = &Importer::mapReshape, .differentiable = {0}});
  table.add({.opType = "Unsqueeze",
             .minOpset = 13,
             .map = &Importer::mapReshape,
             .requiredInputs = 2,
             .differentiable = {0}});
  table.add({.opType = "Transpose", .map = &Importer::mapTranspose, .differentiable = {0}});
  table.add({.opType = "Slice", .map = &Importer::mapSlice, .requiredInputs = 3, .differentiable = {0}});
  table.add({.opType = "Concat", .map = &Importer::mapConcat, .allInputsDifferentiable = true});
  table.add({.opType = "Expand", .map = &Importer::mapExpand, .requiredInputs = 2, .differentiable = {0}});
  table.add({.opType = "Split", .map = &Importer::mapSplit, .differentiable = {0}});
  table.add({.opType = "Tile", .map = &Importer::mapTile, .requiredInputs = 2, .differentiable = {0}});
  table.add({.opType = "Pad", .map = &Importer::mapPad, .requiredInputs = 2, .differentiable = {0}});
  table.add({.opType = "Shape"});
  table.add({.opType = "Size"});
}

}  // namespace tessera::onnx_import
