// runTransform: applies a transform and names it in the errors it reports.
#include "tessera/sessions/transform.hpp"

#include <fmt/format.h>

#include "tessera/lib/error.hpp"

namespace tessera {
namespace {

[[noreturn]] void rethrowNamed(const Error& error, std::string_view transform) {
  const std::string detail = fmt::format("{}: {}", transform, error.detail());
  switch (error.kind()) {
    case ErrorKind::Config: throw ConfigError(error.code(), error.subject(), detail);
    case ErrorKind::Graph: throw GraphError(error.code(), error.subject(), detail);
    case ErrorKind::Autodiff: throw AutodiffError(error.code(), error.subject(), detail);
    case ErrorKind::Device: throw DeviceError(error.code(), error.subject(), detail);
    case ErrorKind::Dist: throw DistError(error.code(), error.subject(), detail);
    case ErrorKind::Io: throw IoError(error.code(), error.subject(), detail);
    case ErrorKind::Onnx: throw OnnxError(error.code(), error.subject(), detail);
    case ErrorKind::Internal: break;
  }
  throw InternalError(error.code(), error.subject(), detail);
}

}  // namespace

void runTransform(Transform& transform, Graph& graph) {
  try {
    transform.apply(graph);
  } catch (const Error& error) {
    rethrowNamed(error, transform.name());
  }
}

}  // namespace tessera
