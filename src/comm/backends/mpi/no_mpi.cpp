// The MPI backend's stand-ins when lockstep is built without MPI (LOCKSTEP_WITH_MPI=OFF).
#include "comm/backend_factories.h"

#include <lockstep/error.h>

namespace lockstep::comm {

std::unique_ptr<Backend> make_mpi_backend(const LaunchEnv&, Millis, std::optional<int>) {
  throw ConfigError(
      "lockstep was built without MPI (LOCKSTEP_WITH_MPI=OFF or no OpenMPI found): the mpi backend "
      "is not "
      "available; rebuild with -DLOCKSTEP_WITH_MPI=ON (needs libopenmpi-dev), or choose "
      "LOCKSTEP_BACKEND=shm or gloo");
}

StorePtr mpi_bootstrap_store(LaunchEnv&, Millis) {
  throw ConfigError(
      "lockstep was built without MPI (LOCKSTEP_WITH_MPI=OFF or no OpenMPI found): it cannot "
      "bootstrap the rendezvous through MPI; rebuild with -DLOCKSTEP_WITH_MPI=ON, or set "
      "MASTER_ADDR and MASTER_PORT");
}

bool mpi_available() { return false; }

}  // namespace lockstep::comm
