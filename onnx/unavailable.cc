// importOnnx in a build without ONNX: every call explains how to get a build
// that has it.
#include <fmt/format.h>

#include "tessera/lib/error.hpp"
#include "tessera/onnx/onnx.hpp"

namespace tessera {
namespace {

[[noreturn]] void unavailable(const std::string& subject) {
  throw OnnxError(
      ErrorCode::OnnxUnavailable, subject,
      "this build of tessera has no ONNX support; install libonnx-dev and libprotobuf-dev (Debian) and "
      "configure with -Donnx=enabled (or auto)");
}

}  // namespace

bool onnxSupported() noexcept { return false; }

OnnxModel importOnnx(const std::filesystem::path& path, const OnnxImportOptions&) {
  unavailable(path.string());
}

OnnxModel importOnnx(std::span<const std::byte>, const OnnxImportOptions&, std::string_view source) {
  unavailable(std::string(source));
}

OnnxTensor readOnnxTensor(const std::filesystem::path& path) { unavailable(path.string()); }

OnnxSignature readOnnxSignature(const std::filesystem::path& path) { unavailable(path.string()); }

void writeOnnx(std::span<const std::byte>, std::string_view sourceName, std::span<const OnnxTensorValues>,
               const std::filesystem::path&) {
  unavailable(std::string(sourceName));
}

void writeOnnx(const std::filesystem::path& source, std::span<const OnnxTensorValues>,
               const std::filesystem::path&) {
  unavailable(source.string());
}

}  // namespace tessera
