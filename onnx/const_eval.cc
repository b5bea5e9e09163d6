// The import-time evaluator: the shape arithmetic of exported models (Shape,
// Gather, Unsqueeze, Concat, Range, Cast, Equal/Where, ...) on values known at
// import. It exists so that the device runs only the model's real math; it is
// not a second executor, and folds only the ops listed in foldNode.
#include <cmath>
#include <functional>
#include <limits>

#include <fmt/format.h>

#include "half.hpp"
#include "onnx_internal.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {
namespace {

using onnx::TensorProto;

// Row-major strides of a shape.
std::vector<int64_t> strides(const Shape& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (std::size_t k = shape.size(); k-- > 1;) s[k - 1] = s[k] * shape[k];
  return s;
}

// For every element of `out` (row-major), the flat index of the element of
// `in` that numpy broadcasting reads.
std::vector<int64_t> broadcastIndices(const Shape& in, const Shape& out) {
  const auto inStrides = strides(in);
  const std::size_t offset = out.size() - in.size();
  const int64_t n = numElements(out);
  std::vector<int64_t> result(static_cast<std::size_t>(n));
  std::vector<int64_t> index(out.size(), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t flat = 0;
    for (std::size_t k = 0; k < in.size(); ++k)
      if (in[k] != 1) flat += index[k + offset] * inStrides[k];
    result[static_cast<std::size_t>(e)] = flat;
    for (std::size_t k = out.size(); k-- > 0;) {
      if (++index[k] < out[k]) break;
      index[k] = 0;
    }
  }
  return result;
}

// Copies elements by a list of source indices.
Known gatherElements(const Known& in, Shape shape, const std::vector<int64_t>& from, int32_t type) {
  Known out;
  out.type = type;
  out.shape = std::move(shape);
  if (in.isFloat()) {
    out.f.reserve(from.size());
    for (int64_t k : from) out.f.push_back(in.f[static_cast<std::size_t>(k)]);
  } else {
    out.i.reserve(from.size());
    for (int64_t k : from) out.i.push_back(in.i[static_cast<std::size_t>(k)]);
  }
  return out;
}

// float16 through float32, as the device narrows.
double roundTo(int32_t type, double v) {
  if (type == TensorProto::FLOAT16) return static_cast<double>(roundToHalf(static_cast<float>(v)));
  return type == TensorProto::FLOAT ? static_cast<double>(static_cast<float>(v)) : v;
}

const Known& need(const std::vector<std::optional<Known>>& inputs, std::size_t k,
                  const std::string& subject) {
  if (k >= inputs.size() || !inputs[k])
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject, fmt::format("input {} is required but missing", k));
  return *inputs[k];
}

Known binary(const Known& a, const Known& b, const std::string& op, const std::string& subject) {
  const bool compare = op == "Equal" || op == "Less" || op == "Greater" || op == "LessOrEqual" ||
                       op == "GreaterOrEqual" || op == "And" || op == "Or";
  if (a.isFloat() != b.isFloat())
    throwOnnx(
        ErrorCode::OnnxNodeShape, subject,
        fmt::format("inputs of types {} and {}; {} needs one type", typeName(a.type), typeName(b.type), op));
  const Shape shape = broadcastShapes(a.shape, b.shape, subject);
  checkedElements(shape, subject, kMaxFoldedElements);
  const auto ia = broadcastIndices(a.shape, shape);
  const auto ib = broadcastIndices(b.shape, shape);
  Known out = makeKnown(compare ? static_cast<int32_t>(TensorProto::BOOL) : a.type, shape, subject);
  for (std::size_t e = 0; e < ia.size(); ++e) {
    if (a.isFloat()) {
      const double x = a.f[static_cast<std::size_t>(ia[e])];
      const double y = b.f[static_cast<std::size_t>(ib[e])];
      double r = 0;
      if (op == "Add")
        r = x + y;
      else if (op == "Sub")
        r = x - y;
      else if (op == "Mul")
        r = x * y;
      else if (op == "Div")
        r = x / y;
      else if (op == "Equal")
        r = x == y;
      else if (op == "Less")
        r = x < y;
      else if (op == "Greater")
        r = x > y;
      else if (op == "LessOrEqual")
        r = x <= y;
      else if (op == "GreaterOrEqual")
        r = x >= y;
      if (compare) {
        out.i[e] = r != 0;
      } else {
        out.f[e] = roundTo(a.type, r);
      }
      continue;
    }
    const int64_t x = a.i[static_cast<std::size_t>(ia[e])];
    const int64_t y = b.i[static_cast<std::size_t>(ib[e])];
    int64_t r = 0;
    // Shape arithmetic stays far from overflow; wrap-around (unsigned) keeps
    // a hostile model from undefined behaviour.
    const auto ux = static_cast<uint64_t>(x);
    const auto uy = static_cast<uint64_t>(y);
    if (op == "Add")
      r = static_cast<int64_t>(ux + uy);
    else if (op == "Sub")
      r = static_cast<int64_t>(ux - uy);
    else if (op == "Mul")
      r = static_cast<int64_t>(ux * uy);
    else if (op == "Div") {
      if (y == 0 || (x == std::numeric_limits<int64_t>::min() && y == -1))
        throwOnnx(ErrorCode::OnnxNodeShape, subject, fmt::format("integer division {} / {}", x, y));
      r = x / y;
    } else if (op == "Equal")
      r = x == y;
    else if (op == "Less")
      r = x < y;
    else if (op == "Greater")
      r = x > y;
    else if (op == "LessOrEqual")
      r = x <= y;
    else if (op == "GreaterOrEqual")
      r = x >= y;
    else if (op == "And")
      r = (x != 0) && (y != 0);
    else if (op == "Or")
      r = (x != 0) || (y != 0);
    out.i[e] = r;
  }
  return out;
}

Known castTo(const Known& in, int32_t to, const std::string& subject) {
  Known out = makeKnown(to, in.shape, subject);
  for (std::size_t e = 0; e < static_cast<std::size_t>(in.size()); ++e) {
    const double v = in.at(static_cast<int64_t>(e));
    if (out.isFloat()) {
      out.f[e] = in.isFloat() ? roundTo(to, v) : roundTo(to, static_cast<double>(in.i[e]));
    } else if (to == TensorProto::BOOL) {
      out.i[e] = v != 0;
    } else if (in.isFloat()) {
      if (!std::isfinite(v) || std::fabs(v) >= 9.2e18)
        throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
                  fmt::format("cast of {} to {} is out of range", v, typeName(to)));
      out.i[e] = static_cast<int64_t>(v);
    } else {
      out.i[e] = in.i[e];
    }
  }
  return out;
}

}  // namespace

std::optional<std::vector<Known>> foldNode(const onnx::NodeProto& node, int64_t opset,
                                           const std::vector<std::optional<Known>>& inputs,
                                           const std::string& subject) {
  const std::string& op = node.op_type();
  auto one = [](Known k) { return std::optional<std::vector<Known>>(std::vector<Known>{std::move(k)}); };

  if (op == "Identity") return one(need(inputs, 0, subject));
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Equal" || op == "Less" ||
      op == "Greater" || op == "LessOrEqual" || op == "GreaterOrEqual" || op == "And" || op == "Or")
    return one(binary(need(inputs, 0, subject), need(inputs, 1, subject), op, subject));
  if (op == "Neg" || op == "Not") {
    Known out = need(inputs, 0, subject);
    if (op == "Not") {
      for (auto& v : out.i) v = v == 0;
    } else if (out.isFloat()) {
      for (auto& v : out.f) v = -v;
    } else {
      for (auto& v : out.i) v = static_cast<int64_t>(0 - static_cast<uint64_t>(v));
    }
    return one(std::move(out));
  }
  if (op == "Cast") {
    const int64_t to = intAttribute(node, "to", -1, subject);
    if (!TensorProto::DataType_IsValid(static_cast<int>(to)) || to == TensorProto::STRING ||
        to == TensorProto::UNDEFINED || to == TensorProto::COMPLEX64 || to == TensorProto::COMPLEX128)
      throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
                fmt::format("cast to element type {} is not supported", to));
    return one(castTo(need(inputs, 0, subject), static_cast<int32_t>(to), subject));
  }
  if (op == "Where") {
    const Known& c = need(inputs, 0, subject);
    const Known& x = need(inputs, 1, subject);
    const Known& y = need(inputs, 2, subject);
    if (x.isFloat() != y.isFloat() || c.isFloat())
      throwOnnx(ErrorCode::OnnxNodeShape, subject, "Where needs a bool condition and two values of one type");
    const Shape shape = broadcastShapes(broadcastShapes(c.shape, x.shape, subject), y.shape, subject);
    checkedElements(shape, subject, kMaxFoldedElements);
    const auto ic = broadcastIndices(c.shape, shape);
    const auto ix = broadcastIndices(x.shape, shape);
    const auto iy = broadcastIndices(y.shape, shape);
    Known out = makeKnown(x.type, shape, subject);
    for (std::size_t e = 0; e < ic.size(); ++e) {
      const bool pick = c.i[static_cast<std::size_t>(ic[e])] != 0;
      const auto from = static_cast<std::size_t>(pick ? ix[e] : iy[e]);
      if (out.isFloat()) {
        out.f[e] = pick ? x.f[from] : y.f[from];
      } else {
        out.i[e] = pick ? x.i[from] : y.i[from];
      }
    }
    return one(std::move(out));
  }
  if (op == "Shape") {
    const Known& in = need(inputs, 0, subject);
    const auto rank = static_cast<int64_t>(in.shape.size());
    int64_t start = opset >= 15 ? intAttribute(node, "start", 0, subject) : 0;
    int64_t end = opset >= 15 ? intAttribute(node, "end", rank, subject) : rank;
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, start, rank);
    Known out;
    out.type = TensorProto::INT64;
    out.i.assign(in.shape.begin() + start, in.shape.begin() + end);
    out.shape = {static_cast<int64_t>(out.i.size())};
    return one(std::move(out));
  }
  if (op == "Size") {
    Known out;
    out.type = TensorProto::INT64;
    out.i = {numElements(need(inputs, 0, subject).shape)};
    return one(std::move(out));
  }
  if (op == "Gather") {
    const Known& data = need(inputs, 0, subject);
    const Known& indices = need(inputs, 1, subject);
    if (indices.isFloat())
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("indices of type {}; integers expected", typeName(indices.type)));
    const auto rank = static_cast<int64_t>(data.shape.size());
    if (rank == 0) throwOnnx(ErrorCode::OnnxNodeShape, subject, "Gather of a scalar");
    const auto axis =
        static_cast<std::size_t>(normalizeAxis(intAttribute(node, "axis", 0, subject), rank, subject));
    Shape shape(data.shape.begin(), data.shape.begin() + static_cast<std::ptrdiff_t>(axis));
    shape.insert(shape.end(), indices.shape.begin(), indices.shape.end());
    shape.insert(shape.end(), data.shape.begin() + static_cast<std::ptrdiff_t>(axis) + 1, data.shape.end());
    checkedElements(shape, subject, kMaxFoldedElements);
    int64_t outer = 1;
    for (std::size_t k = 0; k < axis; ++k) outer *= data.shape[k];
    int64_t inner = 1;
    for (std::size_t k = axis + 1; k < data.shape.size(); ++k) inner *= data.shape[k];
    const int64_t dim = data.shape[axis];
    std::vector<int64_t> from;
    from.reserve(static_cast<std::size_t>(numElements(shape)));
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t index : indices.i) {
        if (index < -dim || index >= dim)
          throwOnnx(ErrorCode::OnnxNodeShape, subject,
                    fmt::format("index {} is out of range for axis {} of size {}", index, axis, dim));
        const int64_t at = index < 0 ? index + dim : index;
        for (int64_t in = 0; in < inner; ++in) from.push_back((o * dim + at) * inner + in);
      }
    }
    return one(gatherElements(data, std::move(shape), from, data.type));
  }
  if (op == "Unsqueeze" || op == "Squeeze" || op == "Reshape" || op == "Flatten") {
    Known out = need(inputs, 0, subject);
    if (op == "Reshape") {
      out.shape = reshapeTarget(out.shape, intList(need(inputs, 1, subject), subject, "shape"),
                                intAttribute(node, "allowzero", 0, subject) != 0, subject);
    } else if (op == "Flatten") {
      const auto rank = static_cast<int64_t>(out.shape.size());
      int64_t axis = intAttribute(node, "axis", 1, subject);
      axis = axis == rank ? rank : normalizeAxis(axis, rank, subject);
      int64_t outer = 1;
      for (int64_t k = 0; k < axis; ++k) outer *= out.shape[static_cast<std::size_t>(k)];
      out.shape = {outer, out.size() / std::max<int64_t>(outer, 1)};
    } else {
      std::optional<std::vector<int64_t>> axes;
      if (opset >= 13) {
        if (inputs.size() > 1 && inputs[1]) axes = intList(*inputs[1], subject, "axes");
      } else {
        axes = intsAttribute(node, "axes", subject);
      }
      if (op == "Unsqueeze") {
        if (!axes) throwOnnx(ErrorCode::OnnxInvalidGraph, subject, "Unsqueeze needs axes");
        out.shape = unsqueezeShape(out.shape, *axes, subject);
      } else {
        out.shape = squeezeShape(out.shape, axes, subject);
      }
    }
    return one(std::move(out));
  }
  if (op == "Concat") {
    std::vector<const Known*> parts;
    for (const auto& in : inputs)
      if (in) parts.push_back(&*in);
    if (parts.empty()) throwOnnx(ErrorCode::OnnxInvalidGraph, subject, "Concat without inputs");
    const auto rank = static_cast<int64_t>(parts[0]->shape.size());
    if (rank == 0) throwOnnx(ErrorCode::OnnxNodeShape, subject, "Concat of scalars");
    const auto axis =
        static_cast<std::size_t>(normalizeAxis(intAttribute(node, "axis", 0, subject), rank, subject));
    Shape shape = parts[0]->shape;
    shape[axis] = 0;
    for (const Known* p : parts) {
      Shape check = p->shape;
      if (check.size() != shape.size() || p->isFloat() != parts[0]->isFloat())
        throwOnnx(ErrorCode::OnnxNodeShape, subject,
                  fmt::format("input {} does not match {}", shapeStr(p->shape), shapeStr(parts[0]->shape)));
      for (std::size_t k = 0; k < shape.size(); ++k)
        if (k != axis && check[k] != shape[k])
          throwOnnx(ErrorCode::OnnxNodeShape, subject,
                    fmt::format("input {} does not match {} outside axis {}", shapeStr(p->shape),
                                shapeStr(parts[0]->shape), axis));
      shape[axis] += check[axis];
    }
    Known out = makeKnown(parts[0]->type, shape, subject);
    int64_t outer = 1;
    for (std::size_t k = 0; k < axis; ++k) outer *= shape[k];
    std::size_t at = 0;
    for (int64_t o = 0; o < outer; ++o) {
      for (const Known* p : parts) {
        const int64_t chunk = p->size() / std::max<int64_t>(outer, 1);
        for (int64_t e = 0; e < chunk; ++e, ++at) {
          const auto from = static_cast<std::size_t>(o * chunk + e);
          if (out.isFloat()) {
            out.f[at] = p->f[from];
          } else {
            out.i[at] = p->i[from];
          }
        }
      }
    }
    return one(std::move(out));
  }
  if (op == "Slice") {
    const Known& data = need(inputs, 0, subject);
    std::optional<std::vector<int64_t>> axes, steps;
    std::vector<int64_t> starts, ends;
    if (opset >= 10) {
      starts = intList(need(inputs, 1, subject), subject, "starts");
      ends = intList(need(inputs, 2, subject), subject, "ends");
      if (inputs.size() > 3 && inputs[3]) axes = intList(*inputs[3], subject, "axes");
      if (inputs.size() > 4 && inputs[4]) steps = intList(*inputs[4], subject, "steps");
    }
    const SliceRange r = sliceRange(data.shape, starts, ends, axes, steps, subject);
    const int64_t n = checkedElements(r.outShape, subject, kMaxFoldedElements);
    const auto inStrides = strides(data.shape);
    std::vector<int64_t> from;
    from.reserve(static_cast<std::size_t>(n));
    std::vector<int64_t> index(r.outShape.size(), 0);
    for (int64_t e = 0; e < n; ++e) {
      int64_t flat = 0;
      for (std::size_t k = 0; k < index.size(); ++k)
        flat += (r.starts[k] + index[k] * r.steps[k]) * inStrides[k];
      from.push_back(flat);
      for (std::size_t k = index.size(); k-- > 0;) {
        if (++index[k] < r.outShape[k]) break;
        index[k] = 0;
      }
    }
    return one(gatherElements(data, r.outShape, from, data.type));
  }
  if (op == "Expand") {
    const Known& data = need(inputs, 0, subject);
    const Shape request = intList(need(inputs, 1, subject), subject, "shape");
    const Shape shape = broadcastShapes(data.shape, request, subject);
    checkedElements(shape, subject, kMaxFoldedElements);
    return one(gatherElements(data, shape, broadcastIndices(data.shape, shape), data.type));
  }
  if (op == "ConstantOfShape") {
    const Shape shape = intList(need(inputs, 0, subject), subject, "shape");
    Known fill;
    fill.type = TensorProto::FLOAT;
    fill.f = {0.0};
    if (const auto* value = findAttribute(node, "value")) {
      fill = readTensor(value->t(), subject + " attribute value");
      if (fill.size() != 1)
        throwOnnx(ErrorCode::OnnxNodeShape, subject,
                  fmt::format("value has {} elements; one expected", fill.size()));
    }
    Known out = makeKnown(fill.type, shape, subject);
    if (out.isFloat()) {
      std::fill(out.f.begin(), out.f.end(), fill.f[0]);
    } else {
      std::fill(out.i.begin(), out.i.end(), fill.i[0]);
    }
    return one(std::move(out));
  }
  if (op == "Range") {
    const Known& start = need(inputs, 0, subject);
    const Known& limit = need(inputs, 1, subject);
    const Known& delta = need(inputs, 2, subject);
    if (start.size() != 1 || limit.size() != 1 || delta.size() != 1)
      throwOnnx(ErrorCode::OnnxNodeShape, subject, "start, limit and delta must be scalars");
    const double s = start.at(0), l = limit.at(0), d = delta.at(0);
    if (d == 0 || !std::isfinite(s) || !std::isfinite(l) || !std::isfinite(d))
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("Range({}, {}, {}) has no finite length", s, l, d));
    const double count = std::max(0.0, std::ceil((l - s) / d));
    if (count > static_cast<double>(kMaxFoldedElements))
      throwOnnx(
          ErrorCode::OnnxTooLarge, subject,
          fmt::format("Range({}, {}, {}) has {} elements, over the limit of {} for values computed at import",
                      s, l, d, count, kMaxFoldedElements));
    Known out = makeKnown(start.type, {static_cast<int64_t>(count)}, subject);
    for (int64_t e = 0; e < static_cast<int64_t>(count); ++e) {
      if (out.isFloat()) {
        out.f[static_cast<std::size_t>(e)] = roundTo(out.type, s + static_cast<double>(e) * d);
      } else {
        // Unsigned: a hostile delta wraps instead of overflowing.
        out.i[static_cast<std::size_t>(e)] = static_cast<int64_t>(
            static_cast<uint64_t>(start.i[0]) + static_cast<uint64_t>(e) * static_cast<uint64_t>(delta.i[0]));
      }
    }
    return one(std::move(out));
  }
  return std::nullopt;
}

}  // namespace tessera::onnx_import
