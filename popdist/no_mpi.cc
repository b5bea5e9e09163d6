// A build without MPI runs one instance: there is nothing to connect to.
#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::dist {

bool mpiAvailable() noexcept { return false; }

std::shared_ptr<Communicator> instanceCommunicator() {
  throw DistError(
      ErrorCode::MpiUnavailable, "instanceCommunicator",
      "this build of tessera has no MPI support (Meson option mpi was disabled or Open MPI was not "
      "found), so it runs one instance only; install libopenmpi-dev and rebuild, or run on one "
      "instance");
}

void abortInstances(int) noexcept {}

}  // namespace tessera::dist
