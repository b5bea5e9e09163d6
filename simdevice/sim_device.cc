#include <memory>

#include "executor.hpp"
#include "tessera/popdist/communicator.hpp"
#include "tessera/simdevice/device.hpp"
#include "worker_pool.hpp"

namespace tessera {
namespace {

class SimDevice final : public Device {
 public:
  SimDevice(DeviceSpec spec, ExecutionMode mode, std::shared_ptr<Communicator> communicator)
      : spec_(spec), mode_(mode), communicator_(std::move(communicator)), threads_(sim::deviceThreads(spec)) {
  }

  const DeviceSpec& spec() const override { return spec_; }
  ExecutionMode mode() const override { return mode_; }
  // Every program runs on the threads resolved when the device was made
  // (the environment is read once).
  std::unique_ptr<Executable> load(Program program) override {
    DeviceSpec resolved = spec_;
    resolved.numThreads = threads_;
    return std::make_unique<sim::SimExecutable>(std::move(program), resolved, mode_, communicator_);
  }
  Communicator* communicator() const override { return communicator_.get(); }
  int hostThreads() const override { return threads_; }

 private:
  DeviceSpec spec_;
  ExecutionMode mode_;
  std::shared_ptr<Communicator> communicator_;
  int threads_;
};

}  // namespace

std::unique_ptr<Device> makeSimDevice(DeviceSpec spec, ExecutionMode mode) {
  return std::make_unique<SimDevice>(spec, mode, nullptr);
}

std::unique_ptr<Device> makeSimDevice(DeviceSpec spec, ExecutionMode mode,
                                      std::shared_ptr<Communicator> communicator) {
  return std::make_unique<SimDevice>(spec, mode, std::move(communicator));
}

}  // namespace tessera
