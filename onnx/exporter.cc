// ONNX out: the model a session was imported from, with its initializers
// replaced by trained values (PopART's modelToHost). Everything else of the
// model (nodes, opset, metadata, inputs and outputs) is written as it was
// read, so any runtime that loaded the original loads the result.
#include <bit>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>

#include <fmt/format.h>
#include <onnx/checker.h>

#include "atomic_file.hpp"
#include "half.hpp"
#include "onnx_internal.hpp"
#include "tessera/onnx/onnx.hpp"

namespace tessera {
namespace {

using onnx::TensorProto;

[[noreturn]] void mismatch(const std::string& subject, const std::string& message) {
  onnx_import::throwOnnx(ErrorCode::OnnxExportMismatch, subject, message);
}

// Replaces the data of `tensor` by `values` in its own element type, as raw
// little-endian bytes (how PyTorch writes initializers).
void replaceData(TensorProto& tensor, const OnnxTensorValues& values, const std::string& subject) {
  Shape dims(tensor.dims().begin(), tensor.dims().end());
  if (dims != values.shape)
    mismatch(subject, fmt::format("the model's initializer has shape {}, the values {}", shapeStr(dims),
                                  shapeStr(values.shape)));
  const auto count = static_cast<std::size_t>(numElements(dims));
  if (values.values.size() != count)
    mismatch(subject, fmt::format("{} values for an initializer of {} elements", values.values.size(), count));
  std::string raw;
  switch (tensor.data_type()) {
    case TensorProto::FLOAT: {
      raw.resize(count * sizeof(float));
      std::memcpy(raw.data(), values.values.data(), raw.size());
      break;
    }
    case TensorProto::FLOAT16: {
      std::vector<uint16_t> halves(count);
      floatsToHalves(values.values.data(), halves.data(), count);
      raw.resize(count * sizeof(uint16_t));
      std::memcpy(raw.data(), halves.data(), raw.size());
      break;
    }
    case TensorProto::DOUBLE: {
      std::vector<double> doubles(values.values.begin(), values.values.end());
      raw.resize(count * sizeof(double));
      std::memcpy(raw.data(), doubles.data(), raw.size());
      break;
    }
    default:
      mismatch(subject, fmt::format("the initializer is {}; only float, float16 and double initializers take "
                                    "trained values",
                                    onnx_import::typeName(tensor.data_type())));
  }
  static_assert(std::endian::native == std::endian::little, "ONNX raw data is little-endian");
  tensor.clear_float_data();
  tensor.clear_double_data();
  tensor.clear_int32_data();  // float16's other storage
  tensor.set_raw_data(std::move(raw));
}

}  // namespace

void writeOnnx(std::span<const std::byte> source, std::string_view sourceName,
               std::span<const OnnxTensorValues> initializers, const std::filesystem::path& destination) {
  const std::string name(sourceName);
  onnx::ModelProto model =
      onnx_import::parseModel(std::string_view(reinterpret_cast<const char*>(source.data()), source.size()), name);

  std::unordered_map<std::string, TensorProto*> byName;
  for (TensorProto& tensor : *model.mutable_graph()->mutable_initializer()) byName[tensor.name()] = &tensor;
  for (const OnnxTensorValues& values : initializers) {
    const std::string subject = fmt::format("{}: initializer \"{}\"", name, values.name);
    const auto found = byName.find(values.name);
    if (found == byName.end())
      mismatch(subject, "the model has no initializer of that name (values are written only into initializers "
                        "the model already has)");
    replaceData(*found->second, values, subject);
  }

  // What is written must be a model ONNX's checker accepts (the original was
  // read; its initializers changed only in their data).
  try {
    onnx::checker::check_model(model);
  } catch (const std::exception& e) {
    mismatch(destination.string(), fmt::format("ONNX's checker refuses the model to write: {}", e.what()));
  }

  std::string bytes;
  if (!model.SerializeToString(&bytes))
    mismatch(destination.string(), "the model does not serialize (over protobuf's 2 GiB limit?)");
  // Written beside the destination, synced and renamed over it: a reader
  // never sees half a model and a failed write leaves the old file. A link
  // is followed (its target replaced, the link kept); only a regular file is
  // replaced, a device, FIFO or folder is refused.
  detail::writeFileAtomically(destination.string(),
                              std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

void writeOnnx(const std::filesystem::path& source, std::span<const OnnxTensorValues> initializers,
               const std::filesystem::path& destination) {
  const std::string bytes = onnx_import::readFile(source);
  writeOnnx(std::as_bytes(std::span(bytes)), source.string(), initializers, destination);
}

}  // namespace tessera
