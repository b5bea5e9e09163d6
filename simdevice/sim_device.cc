#include <memory>

#include "executor.hpp"
#include "tessera/device.hpp"

namespace tessera {
namespace {

class SimDevice final : public Device {
 public:
  SimDevice(DeviceSpec spec, ExecutionMode mode) : spec_(spec), mode_(mode) {}

  const DeviceSpec& spec() const override { return spec_; }
  ExecutionMode mode() const override { return mode_; }
  std::unique_ptr<Executable> load(Program program) override {
    return std::make_unique<sim::SimExecutable>(std::move(program), spec_, mode_);
  }

 private:
  DeviceSpec spec_;
  ExecutionMode mode_;
};

}  // namespace

std::unique_ptr<Device> makeSimDevice(DeviceSpec spec, ExecutionMode mode) {
  return std::make_unique<SimDevice>(spec, mode);
}

}  // namespace tessera
