// Internal: the factories of the built-in backends. Each rendezvous through `store`
// (keys under `prefix`) where it needs to; the MPI backend uses MPI's own wire-up.
#pragma once

#include <lockstep/comm/backend.h>
#include <lockstep/comm/launch_env.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>

namespace lockstep::comm {

using StorePtr = c10::intrusive_ptr<c10d::Store>;

// Single-node shared memory. Requires env.single_node().
std::unique_ptr<Backend> make_shm_backend(const StorePtr& store, const std::string& prefix,
                                          const LaunchEnv& env, Millis timeout);
// c10d's ProcessGroupGloo over TCP.
std::unique_ptr<Backend> make_gloo_backend(const StorePtr& store, const std::string& prefix,
                                           const LaunchEnv& env, Millis timeout);
// OpenMPI's MPI_COMM_WORLD (the job must have been started by mpirun / srun --mpi).
// Throws ConfigError when lockstep was built without MPI.
std::unique_ptr<Backend> make_mpi_backend(const LaunchEnv& env, Millis timeout);
bool mpi_available();
// NCCL over the GPU of this rank's local_rank (docs/gpu.md); the unique id travels through
// `store`. Throws ConfigError when lockstep was built without CUDA.
std::unique_ptr<Backend> make_nccl_backend(const StorePtr& store, const std::string& prefix,
                                           const LaunchEnv& env, Millis timeout);
bool nccl_available();

}  // namespace lockstep::comm
