// The Python module `tessera`: PopART's, PopXL's and PopDist's Python names
// bound to the C++ objects that mean them (docs/python.md). Nothing is
// computed, checked or defaulted here that the C++ API does not compute,
// check or default itself; this file holds the module, tessera.Error,
// tessera.popdist and tessera.replica_grouping, options.cc the options and
// settings.cc devices, optimizers and data flows, session.cc the sessions,
// builder.cc PopART's Builder.
#include "bindings.hpp"  // first: it declares an opaque type before pybind11/stl.h

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <pybind11/stl.h>

#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/replica_grouping.hpp"

namespace tessera::python {

nlohmann::json toJson(py::handle value, const std::string& path) {
  if (value.is_none()) return nullptr;
  // bool before int: Python's bool is an int.
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>();
  if (py::isinstance<py::int_>(value)) return value.cast<int64_t>();
  if (py::isinstance<py::float_>(value)) return value.cast<double>();
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  // numpy's scalars: an integer type has __index__, a float type __float__.
  if (py::hasattr(value, "__index__"))
    return py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr())).cast<int64_t>();
  if (py::hasattr(value, "__float__"))
    return py::float_(py::reinterpret_borrow<py::object>(value)).cast<double>();
  if (py::isinstance<py::dict>(value)) {
    nlohmann::json object = nlohmann::json::object();
    for (const auto& [key, item] : value.cast<py::dict>()) {
      if (!py::isinstance<py::str>(key)) {
        throw ConfigError(ErrorCode::WrongType, path,
                          fmt::format("the key {} is not a str", py::repr(key).cast<std::string>()));
      }
      const auto name = key.cast<std::string>();
      object[name] = toJson(item, path + "/" + name);
    }
    return object;
  }
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    nlohmann::json array = nlohmann::json::array();
    size_t index = 0;
    for (const auto& item : value) array.push_back(toJson(item, fmt::format("{}/{}", path, index++)));
    return array;
  }
  throw ConfigError(
      ErrorCode::WrongType, path,
      fmt::format("a {} cannot be given here; expected a bool, a number, a str, a list or a dict",
                  py::type::of(value).attr("__name__").cast<std::string>()));
}

namespace {

// PopXL's ReplicaGrouping fields over tessera::ReplicaGrouping.
void bindReplicaGrouping(py::module_& module) {
  py::class_<ReplicaGrouping>(
      module, "ReplicaGrouping",
      "Which replicas belong together (PopXL's ReplicaGrouping): groups of group_size "
      "replicas whose members are stride apart, tiling num_replicas replicas.")
      .def_property_readonly("num_replicas", &ReplicaGrouping::numReplicas)
      .def_property_readonly("stride", &ReplicaGrouping::stride)
      .def_property_readonly("group_size", &ReplicaGrouping::groupSize)
      .def_property_readonly("num_groups", &ReplicaGrouping::numGroups)
      .def_property_readonly("assignment", &ReplicaGrouping::assignment,
                             "The group of each replica, replica by replica.")
      .def_property_readonly(
          "groups",
          [](const ReplicaGrouping& grouping) {
            std::vector<std::vector<int64_t>> groups;
            for (int64_t group = 0; group < grouping.numGroups(); ++group) {
              groups.push_back(grouping.replicasAt(group));
            }
            return groups;
          },
          "The replicas of each group, group by group.")
      .def("transpose", &ReplicaGrouping::transpose,
           "The grouping whose groups take one replica of each group of this one.")
      .def("__eq__", [](const ReplicaGrouping& a, const ReplicaGrouping& b) { return a == b; })
      .def("__repr__", &ReplicaGrouping::str);

  module.def(
      "replica_grouping",
      [](int64_t numReplicas, int64_t stride, std::optional<int64_t> groupSize) {
        if (groupSize) return ReplicaGrouping(numReplicas, stride, *groupSize);
        if (stride != 1) {
          throw ConfigError(ErrorCode::InvalidReplicaGrouping,
                            fmt::format("replica_grouping(num_replicas={}, stride={})", numReplicas, stride),
                            "a stride needs a group_size; give group_size too");
        }
        return ReplicaGrouping(numReplicas);
      },
      py::arg("num_replicas"), py::arg("stride") = 1, py::arg("group_size") = py::none(),
      "PopXL's ir.replica_grouping(stride, group_size) for num_replicas replicas: without group_size one "
      "group of every replica. Errors are tessera.Error (tessera.config.140, 141).");
}

// PopDist's queries, reading the variables `tessera launch` sets each time.
void bindPopdist(py::module_& module) {
  py::module_ popdist = module.def_submodule(
      "popdist", "PopDist's queries, reading the environment `tessera launch` sets (tessera/popdist/dist.hpp).");
  popdist.def("isPopdistEnvSet", &dist::isDistEnvSet, "Whether the process was started by `tessera launch`.");
  popdist.def("getNumInstances", &dist::numInstances, "Instances of the run.");
  popdist.def("getInstanceIndex", &dist::instanceIndex, "This instance's index.");
  popdist.def("getNumTotalReplicas", &dist::numTotalReplicas, "Replicas of the whole run.");
  popdist.def("getNumLocalReplicas", &dist::numLocalReplicas, "Replicas of this instance.");
  popdist.def("getReplicaIndexOffset", &dist::replicaIndexOffset,
              "The global index of this instance's first replica.");
  popdist.def("getNumIpusPerReplica", &dist::numIpusPerReplica, "Processors per replica (1).");
  popdist.def("getLocalInstanceIndex", &dist::localInstanceIndex, "This instance's index on its host.");
}

}  // namespace
}  // namespace tessera::python

PYBIND11_MODULE(tessera, module) {
  namespace py = pybind11;
  using namespace tessera::python;
  module.doc() =
      "tessera: distributed training sessions on a simulated multi-replica device, with PopART's Python "
      "names (docs/python.md).";

  // One exception class for every tessera error, with the C++ error's id,
  // subject (path) and detail as attributes.
  static py::exception<tessera::Error> error(module, "Error");
  error.doc() =
      "Every tessera error. Attributes: id (e.g. 'tessera.config.110'), code (110), kind ('config'), path "
      "(the JSON path, tensor or file the error is about; may be empty) and detail (the message without "
      "the id and path).";
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const tessera::Error& e) {
      // py::exception's own call raises; calling the class makes an instance.
      py::object raised = py::reinterpret_borrow<py::object>(error.ptr())(e.what());
      raised.attr("id") = e.id();
      raised.attr("code") = static_cast<int>(e.code());
      raised.attr("kind") = std::string(tessera::kindName(e.kind()));
      raised.attr("path") = e.subject();
      raised.attr("detail") = e.detail();
      PyErr_SetObject(error.ptr(), raised.ptr());
    }
  });

  bindReplicaGrouping(module);
  bindPopdist(module);
  bindOptions(module);
  bindSettings(module);
  bindSessions(module);
  bindBuilder(module);
  bindDatasets(module);
}
