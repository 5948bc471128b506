// Internal: the factories of the built-in backends. Each rendezvous through `store`
// (keys under `prefix`) where it needs to; the MPI backend uses MPI's own wire-up.
#pragma once

#include <lockstep/comm/backend.h>
#include <lockstep/comm/launch_env.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::comm {

using StorePtr = c10::intrusive_ptr<c10d::Store>;

// `n` elements of dtype `t` at the start of `bytes`, a byte buffer a backend keeps across
// calls and grows when too small. A fresh buffer per call would come from the thread's
// malloc arena, which glibc serves by a new mmap() above 64 MiB whatever MALLOC_MMAP_MAX_
// says: page-faulting through the whole buffer every step (50 ms for a 67 MB DDP bucket,
// against 6 ms for the copy).
at::Tensor kept_buffer(at::Tensor& bytes, int64_t n, at::ScalarType t);

// Single-node shared memory. Requires env.single_node().
std::unique_ptr<Backend> make_shm_backend(const StorePtr& store, const std::string& prefix,
                                          const LaunchEnv& env, Millis timeout);
// A failure notice a group heeds besides its own (hier: the one its two inner groups
// share): once `key` exists in `store`, the group has failed, for the reason
// describe(value) gives, and its blocked ops end at once.
struct ExternalNotice {
  StorePtr store;
  std::string key;
  std::function<std::string(const std::vector<uint8_t>&)> describe;
};
// c10d's ProcessGroupGloo over TCP.
std::unique_ptr<Backend> make_gloo_backend(const StorePtr& store, const std::string& prefix,
                                           const LaunchEnv& env, Millis timeout,
                                           ExternalNotice notice = {});
// OpenMPI's MPI_COMM_WORLD (the job must have been started by mpirun / srun --mpi), or with
// `color` the ranks of the world that pass the same color (>= 0), ordered by world rank
// (MPI_Comm_split, key = world rank): e.g. color = local_rank for one rank per node.
// Collective over MPI_COMM_WORLD: every rank calls it, in the same order as its other
// group creations. Throws ConfigError when lockstep was built without MPI.
std::unique_ptr<Backend> make_mpi_backend(const LaunchEnv& env, Millis timeout,
                                          std::optional<int> color = std::nullopt);
bool mpi_available();
// A c10d store for a job that mpirun started, bootstrapped through MPI (initialized here
// if need be, finalized at exit): rank 0 hosts a TCPStore on a free port and MPI_Bcast's
// its address (MASTER_ADDR if set, else 127.0.0.1 for a single-node job, else rank 0's
// host name) and port; every rank connects. Fills env.master_addr and env.master_port.
// Collective over MPI_COMM_WORLD; once per process (later calls return the same store and
// the same address). Throws ConfigError when lockstep was built without MPI, CommError
// (Rendezvous) when a rank does not come within `timeout`.
StorePtr mpi_bootstrap_store(LaunchEnv& env, Millis timeout);
// NCCL over the GPU of this rank's local_rank (docs/gpu.md); the unique id travels through
// `store`. Throws ConfigError when lockstep was built without CUDA.
std::unique_ptr<Backend> make_nccl_backend(const StorePtr& store, const std::string& prefix,
                                           const LaunchEnv& env, Millis timeout);
bool nccl_available();

// shm inside each node, `inter` ("gloo" or "mpi") between nodes, for a job laid out as `layout`
// (hier/hier_backend.h); the inner groups rendezvous under `prefix`.
struct HierLayout;
std::unique_ptr<Backend> make_hier_backend(const StorePtr& store, const std::string& prefix,
                                           const LaunchEnv& env, const HierLayout& layout,
                                           const std::string& inter, Millis timeout);

}  // namespace lockstep::comm
