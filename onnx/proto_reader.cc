// Reading ONNX protobuf messages: tensors, attributes, and the shape rules
// that the import-time evaluator and the node mapping share.
#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "onnx_internal.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {

using onnx::TensorProto;

void throwOnnx(ErrorCode code, const std::string& subject, std::string_view message) {
  throw OnnxError(code, subject, message);
}

bool isFloatType(int32_t type) noexcept {
  return type == TensorProto::FLOAT || type == TensorProto::DOUBLE || type == TensorProto::FLOAT16 ||
         type == TensorProto::BFLOAT16;
}

bool Known::isFloat() const noexcept { return isFloatType(type); }

std::string typeName(int32_t type) {
  switch (type) {
    case TensorProto::FLOAT: return "float";
    case TensorProto::UINT8: return "uint8";
    case TensorProto::INT8: return "int8";
    case TensorProto::UINT16: return "uint16";
    case TensorProto::INT16: return "int16";
    case TensorProto::INT32: return "int32";
    case TensorProto::INT64: return "int64";
    case TensorProto::STRING: return "string";
    case TensorProto::BOOL: return "bool";
    case TensorProto::FLOAT16: return "float16";
    case TensorProto::DOUBLE: return "double";
    case TensorProto::UINT32: return "uint32";
    case TensorProto::UINT64: return "uint64";
    case TensorProto::COMPLEX64: return "complex64";
    case TensorProto::COMPLEX128: return "complex128";
    case TensorProto::BFLOAT16: return "bfloat16";
    default: return fmt::format("type {}", type);
  }
}

int64_t checkedElements(const Shape& shape, const std::string& subject, int64_t limit) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      throwOnnx(ErrorCode::OnnxMalformed, subject,
                fmt::format("negative dimension in shape {}", shapeStr(shape)));
    if (d != 0 && n > limit / d)
      throwOnnx(ErrorCode::OnnxTooLarge, subject,
                fmt::format("shape {} has more than {} elements, the limit for values computed at import",
                            shapeStr(shape), limit));
    n *= d;
  }
  return n;
}

Known makeKnown(int32_t type, Shape shape, const std::string& subject) {
  const int64_t n = checkedElements(shape, subject, kMaxFoldedElements);
  Known k;
  k.type = type;
  k.shape = std::move(shape);
  if (k.isFloat()) {
    k.f.assign(static_cast<std::size_t>(n), 0.0);
  } else {
    k.i.assign(static_cast<std::size_t>(n), 0);
  }
  return k;
}

namespace {

// Bytes per element of raw_data, 0 for types without a fixed size.
std::size_t rawSize(int32_t type) {
  switch (type) {
    case TensorProto::FLOAT:
    case TensorProto::INT32:
    case TensorProto::UINT32: return 4;
    case TensorProto::DOUBLE:
    case TensorProto::INT64:
    case TensorProto::UINT64: return 8;
    case TensorProto::INT16:
    case TensorProto::UINT16:
    case TensorProto::FLOAT16:
    case TensorProto::BFLOAT16: return 2;
    case TensorProto::INT8:
    case TensorProto::UINT8:
    case TensorProto::BOOL: return 1;
    default: return 0;
  }
}

double halfToDouble(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(mantissa + 1024, exponent - 25);
}

double bfloatToDouble(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float value = 0;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

template <class T>
T load(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

// One element of raw (little-endian) data.
void storeRaw(Known& k, std::size_t index, const char* p) {
  switch (k.type) {
    case TensorProto::FLOAT: k.f[index] = load<float>(p); break;
    case TensorProto::DOUBLE: k.f[index] = load<double>(p); break;
    case TensorProto::FLOAT16: k.f[index] = halfToDouble(load<uint16_t>(p)); break;
    case TensorProto::BFLOAT16: k.f[index] = bfloatToDouble(load<uint16_t>(p)); break;
    case TensorProto::INT32: k.i[index] = load<int32_t>(p); break;
    case TensorProto::UINT32: k.i[index] = load<uint32_t>(p); break;
    case TensorProto::INT64: k.i[index] = load<int64_t>(p); break;
    case TensorProto::UINT64: k.i[index] = static_cast<int64_t>(load<uint64_t>(p)); break;
    case TensorProto::INT16: k.i[index] = load<int16_t>(p); break;
    case TensorProto::UINT16: k.i[index] = load<uint16_t>(p); break;
    case TensorProto::INT8: k.i[index] = load<int8_t>(p); break;
    case TensorProto::UINT8: k.i[index] = load<uint8_t>(p); break;
    case TensorProto::BOOL: k.i[index] = load<uint8_t>(p) != 0; break;
    default: break;
  }
}

}  // namespace

Known readTensor(const TensorProto& tensor, const std::string& subject) {
  const int32_t type = tensor.data_type();
  if (tensor.data_location() == TensorProto::EXTERNAL)
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
              "the tensor's data is stored in an external file; tessera reads models with their data inside "
              "(save the model with onnx.save(model, path, save_as_external_data=False))");
  const std::size_t elementBytes = rawSize(type);
  if (elementBytes == 0)
    throwOnnx(
        ErrorCode::OnnxUnsupportedFeature, subject,
        fmt::format("element type {} is not supported; tensors of numbers or bools are", typeName(type)));
  Known k;
  k.type = type;
  k.shape.assign(tensor.dims().begin(), tensor.dims().end());
  // The data present bounds the element count, so a huge shape is refused
  // before anything is allocated.
  const int64_t n = checkedElements(k.shape, subject, std::numeric_limits<int64_t>::max());
  int64_t present = 0;
  if (tensor.has_raw_data()) {
    present = static_cast<int64_t>(tensor.raw_data().size() / elementBytes);
    if (tensor.raw_data().size() % elementBytes != 0) present = -1;
  } else {
    switch (type) {
      case TensorProto::FLOAT: present = tensor.float_data_size(); break;
      case TensorProto::DOUBLE: present = tensor.double_data_size(); break;
      case TensorProto::INT64: present = tensor.int64_data_size(); break;
      case TensorProto::UINT32:
      case TensorProto::UINT64: present = tensor.uint64_data_size(); break;
      default: present = tensor.int32_data_size(); break;
    }
  }
  if (present != n)
    throwOnnx(ErrorCode::OnnxMalformed, subject,
              fmt::format("shape {} has {} elements but the tensor holds data for {} ({} bytes of raw data)",
                          shapeStr(k.shape), n, present, tensor.raw_data().size()));
  const auto count = static_cast<std::size_t>(n);
  if (k.isFloat()) {
    k.f.resize(count);
  } else {
    k.i.resize(count);
  }
  if (tensor.has_raw_data()) {
    const char* data = tensor.raw_data().data();
    for (std::size_t e = 0; e < count; ++e) storeRaw(k, e, data + e * elementBytes);
    return k;
  }
  for (std::size_t e = 0; e < count; ++e) {
    const int index = static_cast<int>(e);
    switch (type) {
      case TensorProto::FLOAT: k.f[e] = tensor.float_data(index); break;
      case TensorProto::DOUBLE: k.f[e] = tensor.double_data(index); break;
      case TensorProto::INT64: k.i[e] = tensor.int64_data(index); break;
      case TensorProto::UINT32:
      case TensorProto::UINT64: k.i[e] = static_cast<int64_t>(tensor.uint64_data(index)); break;
      case TensorProto::FLOAT16:
        k.f[e] = halfToDouble(static_cast<uint16_t>(tensor.int32_data(index)));
        break;
      case TensorProto::BFLOAT16:
        k.f[e] = bfloatToDouble(static_cast<uint16_t>(tensor.int32_data(index)));
        break;
      case TensorProto::BOOL: k.i[e] = tensor.int32_data(index) != 0; break;
      default: k.i[e] = tensor.int32_data(index); break;
    }
  }
  return k;
}

const onnx::AttributeProto* findAttribute(const onnx::NodeProto& node, std::string_view name) {
  for (const auto& attribute : node.attribute())
    if (attribute.name() == name) return &attribute;
  return nullptr;
}

namespace {

[[noreturn]] void wrongAttributeType(const onnx::AttributeProto& attribute, std::string_view expected,
                                     const std::string& subject) {
  throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
            fmt::format("attribute {} has type {}; {} expected", attribute.name(),
                        onnx::AttributeProto::AttributeType_Name(attribute.type()), expected));
}

}  // namespace

int64_t intAttribute(const onnx::NodeProto& node, std::string_view name, int64_t fallback,
                     const std::string& subject) {
  const auto* attribute = findAttribute(node, name);
  if (attribute == nullptr) return fallback;
  if (attribute->type() != onnx::AttributeProto::INT) wrongAttributeType(*attribute, "INT", subject);
  return attribute->i();
}

float floatAttribute(const onnx::NodeProto& node, std::string_view name, float fallback,
                     const std::string& subject) {
  const auto* attribute = findAttribute(node, name);
  if (attribute == nullptr) return fallback;
  if (attribute->type() != onnx::AttributeProto::FLOAT) wrongAttributeType(*attribute, "FLOAT", subject);
  return attribute->f();
}

std::string stringAttribute(const onnx::NodeProto& node, std::string_view name, std::string fallback,
                            const std::string& subject) {
  const auto* attribute = findAttribute(node, name);
  if (attribute == nullptr) return fallback;
  if (attribute->type() != onnx::AttributeProto::STRING) wrongAttributeType(*attribute, "STRING", subject);
  return attribute->s();
}

std::optional<std::vector<int64_t>> intsAttribute(const onnx::NodeProto& node, std::string_view name,
                                                  const std::string& subject) {
  const auto* attribute = findAttribute(node, name);
  if (attribute == nullptr) return std::nullopt;
  if (attribute->type() != onnx::AttributeProto::INTS) wrongAttributeType(*attribute, "INTS", subject);
  return std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
}

int64_t normalizeAxis(int64_t axis, int64_t rank, const std::string& subject) {
  if (axis < -rank || axis >= rank)
    throwOnnx(
        ErrorCode::OnnxNodeShape, subject,
        fmt::format("axis {} is out of range for rank {}; allowed: [{}, {}]", axis, rank, -rank, rank - 1));
  return axis < 0 ? axis + rank : axis;
}

std::vector<int64_t> intList(const Known& value, const std::string& subject, std::string_view what) {
  if (value.isFloat() || value.shape.size() > 1)
    throwOnnx(ErrorCode::OnnxNodeShape, subject,
              fmt::format("{} must be a 1-D integer tensor; got {} of shape {}", what, typeName(value.type),
                          shapeStr(value.shape)));
  return value.i;
}

Shape broadcastShapes(const Shape& a, const Shape& b, const std::string& subject) {
  const std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (std::size_t k = 0; k < rank; ++k) {
    const int64_t da = k < rank - a.size() ? 1 : a[k - (rank - a.size())];
    const int64_t db = k < rank - b.size() ? 1 : b[k - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("shapes {} and {} do not broadcast (axis {}: {} vs {})", shapeStr(a), shapeStr(b),
                            k, da, db));
    out[k] = da == 1 ? db : da;
  }
  return out;
}

Shape reshapeTarget(const Shape& input, const std::vector<int64_t>& request, bool allowZero,
                    const std::string& subject) {
  Shape out(request.size());
  int64_t inferred = -1;
  int64_t known = 1;
  for (std::size_t k = 0; k < request.size(); ++k) {
    int64_t d = request[k];
    if (d == 0 && !allowZero) {
      if (k >= input.size())
        throwOnnx(ErrorCode::OnnxNodeShape, subject,
                  fmt::format("shape {} copies axis {} (0) of input {}, which has no such axis",
                              fmt::join(request, ","), k, shapeStr(input)));
      d = input[k];
    }
    if (d == -1) {
      if (inferred >= 0)
        throwOnnx(ErrorCode::OnnxNodeShape, subject,
                  fmt::format("shape [{}] has more than one -1", fmt::join(request, ", ")));
      inferred = static_cast<int64_t>(k);
      out[k] = 1;
      continue;
    }
    if (d < -1)
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("shape [{}] has a dimension {} below -1", fmt::join(request, ", "), d));
    out[k] = d;
    known = d == 0 ? 0 : (known > std::numeric_limits<int64_t>::max() / d ? -1 : known * d);
  }
  const int64_t total = numElements(input);
  if (inferred >= 0) {
    if (known <= 0 || total % known != 0)
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("cannot reshape {} ({} elements) to [{}]", shapeStr(input), total,
                            fmt::join(request, ", ")));
    out[static_cast<std::size_t>(inferred)] = total / known;
  } else if (known != total) {
    throwOnnx(ErrorCode::OnnxNodeShape, subject,
              fmt::format("cannot reshape {} ({} elements) to {}", shapeStr(input), total, shapeStr(out)));
  }
  return out;
}

Shape unsqueezeShape(const Shape& input, const std::vector<int64_t>& axes, const std::string& subject) {
  const auto rank = static_cast<int64_t>(input.size() + axes.size());
  std::vector<bool> inserted(static_cast<std::size_t>(rank), false);
  for (int64_t axis : axes) {
    const int64_t a = normalizeAxis(axis, rank, subject);
    if (inserted[static_cast<std::size_t>(a)])
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("axes [{}] repeat axis {}", fmt::join(axes, ", "), a));
    inserted[static_cast<std::size_t>(a)] = true;
  }
  Shape out;
  std::size_t next = 0;
  for (int64_t k = 0; k < rank; ++k) out.push_back(inserted[static_cast<std::size_t>(k)] ? 1 : input[next++]);
  return out;
}

Shape squeezeShape(const Shape& input, const std::optional<std::vector<int64_t>>& axes,
                   const std::string& subject) {
  const auto rank = static_cast<int64_t>(input.size());
  std::vector<bool> removed(input.size(), false);
  if (!axes) {
    for (std::size_t k = 0; k < input.size(); ++k) removed[k] = input[k] == 1;
  } else {
    for (int64_t axis : *axes) {
      const auto a = static_cast<std::size_t>(normalizeAxis(axis, rank, subject));
      if (input[a] != 1)
        throwOnnx(
            ErrorCode::OnnxNodeShape, subject,
            fmt::format("cannot squeeze axis {} of {}: its size is {}, not 1", a, shapeStr(input), input[a]));
      removed[a] = true;
    }
  }
  Shape out;
  for (std::size_t k = 0; k < input.size(); ++k)
    if (!removed[k]) out.push_back(input[k]);
  return out;
}

SliceRange sliceRange(const Shape& input, const std::vector<int64_t>& starts,
                      const std::vector<int64_t>& ends, const std::optional<std::vector<int64_t>>& axes,
                      const std::optional<std::vector<int64_t>>& steps, const std::string& subject) {
  const auto rank = static_cast<int64_t>(input.size());
  if (starts.size() != ends.size() || (axes && axes->size() != starts.size()) ||
      (steps && steps->size() != starts.size()))
    throwOnnx(ErrorCode::OnnxNodeShape, subject,
              fmt::format("starts, ends, axes and steps must have the same length; got {}, {}, {}, {}",
                          starts.size(), ends.size(), axes ? axes->size() : starts.size(),
                          steps ? steps->size() : starts.size()));
  SliceRange r;
  r.starts.assign(input.size(), 0);
  r.ends = input;
  r.steps.assign(input.size(), 1);
  std::vector<bool> seen(input.size(), false);
  for (std::size_t k = 0; k < starts.size(); ++k) {
    const auto a =
        static_cast<std::size_t>(normalizeAxis(axes ? (*axes)[k] : static_cast<int64_t>(k), rank, subject));
    if (seen[a]) throwOnnx(ErrorCode::OnnxNodeShape, subject, fmt::format("axis {} is sliced twice", a));
    seen[a] = true;
    const int64_t step = steps ? (*steps)[k] : 1;
    if (step == 0 || step == std::numeric_limits<int64_t>::min())
      throwOnnx(ErrorCode::OnnxNodeShape, subject, fmt::format("a step of {}", step));
    const int64_t dim = input[a];
    auto clampIndex = [&](int64_t v, int64_t lo, int64_t hi) {
      if (v < 0) v = v < -dim ? -1 : v + dim;  // before the first element
      return std::clamp(v, lo, hi);
    };
    int64_t start = starts[k];
    int64_t end = ends[k];
    if (step > 0) {
      start = clampIndex(start, 0, dim);
      end = clampIndex(end, 0, dim);
    } else {
      start = clampIndex(start, -1, dim - 1);
      end = clampIndex(end, -1, dim - 1);
    }
    r.starts[a] = start;
    r.ends[a] = end;
    r.steps[a] = step;
  }
  for (std::size_t a = 0; a < input.size(); ++a) {
    const int64_t span = r.steps[a] > 0 ? r.ends[a] - r.starts[a] : r.starts[a] - r.ends[a];
    const int64_t step = r.steps[a] > 0 ? r.steps[a] : -r.steps[a];
    r.outShape.push_back(span <= 0 ? 0 : (span - 1) / step + 1);
  }
  return r;
}

}  // namespace tessera::onnx_import
