// What the sessions of the Python module are made from (python/settings.cc
// binds them): a device, an optimizer, a data flow, input shapes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/sessions/data_flow.hpp"
#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/optimizers/optimizer_options.hpp"

namespace tessera::python {

// A device to be made for a session: the DeviceSpec, and the number of
// processors a ported script asked for (PopART's "numIPUs"), which must be
// the session's replicas (one processor per replica).
struct DeviceInfo {
  DeviceSpec spec;
  std::optional<int64_t> numIpus;
};

// An optimizer: the run config's optimizer section it stands for.
struct PyOptimizer {
  OptimizerConfig config;
};

// PopART's DataFlow and AnchorReturnType are tessera's own
// (tessera/sessions/data_flow.hpp).
using tessera::AnchorReturnType;
using tessera::DataFlow;

struct TensorInfo {
  std::string dtype;  // PopART's name: "FLOAT", "INT64", ...
  Shape shape;
};

struct InputShapeInfo {
  std::map<std::string, TensorInfo> inputs;
  // PopART's InputSettings of inputs by name (addInputTensor's argument).
  std::map<std::string, InputSettings, std::less<>> settings;
};

}  // namespace tessera::python
