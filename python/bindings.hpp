// Shared pieces of the Python module's translation units (python/*.cc).
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

#include "tessera/lib/enum_names.hpp"
#include "tessera/lib/tensor_location.hpp"

// SessionOptions::tensorLocationSettingsOverride is bound as a mutable
// mapping (opts.tensorLocationSettingsOverride["w"] = ...), not copied to a
// dict; every translation unit must see this before pybind11/stl.h's casters.
PYBIND11_MAKE_OPAQUE(std::map<std::string, tessera::TensorLocation>)

namespace tessera::python {

namespace py = pybind11;

// A Python value (None, bool, int, float, str, a tuple or list, a dict with
// str keys) as JSON, for the C++ readers that check and report it; any other
// type is a ConfigError(WrongType) naming `path`.
nlohmann::json toJson(py::handle value, const std::string& path);

// An enum with the C++ enumerators' names (tessera/lib/enum_names.hpp), which are
// PopART's.
template <NamedEnum E>
py::enum_<E> bindEnum(py::module_& module, const char* doc) {
  py::enum_<E> bound(module, std::string(EnumNames<E>::kTypeName).c_str(), doc);
  for (const auto& [value, name] : EnumNames<E>::kNames) bound.value(std::string(name).c_str(), value);
  return bound;
}

void bindOptions(py::module_& module);
void bindSettings(py::module_& module);
void bindSessions(py::module_& module);
void bindBuilder(py::module_& module);
void bindDatasets(py::module_& module);

}  // namespace tessera::python
