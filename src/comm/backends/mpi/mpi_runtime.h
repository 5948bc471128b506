// Internal: the process-wide side of MPI that every MPI backend shares.
//
// MPI is one library per process, so this is the one place in lockstep with
// process-wide state: initialization (once), finalization (once, at exit, and
// only if lockstep initialized MPI), the datatypes and reduction ops lockstep
// defines (once), and the lock that serializes MPI calls.
//
// Why a lock: we ask for MPI_THREAD_SERIALIZED (no two threads inside MPI at
// once). One process group calls MPI only from its comm thread, but two groups
// have two comm threads, and init/teardown run on the caller's thread. Every MPI
// call lockstep makes holds call_lock() for the duration of that one
// (nonblocking) call, never while waiting, so groups progress independently.
#pragma once

#include <lockstep/comm/types.h>

// The C API only: OpenMPI's deprecated C++ bindings would need libmpi_cxx at link
// time, and the project links MPI::MPI_C.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <mutex>
#include <string>

namespace lockstep::comm::mpi {

// Serializes every MPI call lockstep makes (see above). Never held across a wait.
std::mutex& call_lock();

// MPI_Init_thread(MPI_THREAD_SERIALIZED) unless MPI is already initialized; if
// lockstep initialized it, MPI_Finalize runs once at process exit (MPI_Abort after a
// failure, see note_broken). Throws
// ConfigError if MPI was finalized already or provides less than SERIALIZED.
// Also creates the 16-bit datatype and its reduction ops. Call with call_lock() held.
void ensure_initialized_locked();

// True once MPI is finalized (by our exit hook or by the program). Any thread.
bool is_finalized();

// Records that a group of this process failed (any thread, never throws); `peer_gone`:
// a peer was seen dead or stopped (it will never reach MPI_Finalize). At exit, such a
// process calls MPI_Abort(MPI_COMM_WORLD, its exit status or 1) instead of MPI_Finalize
// when a peer was gone, or when any group failed and the program exits non-zero:
// MPI_Finalize synchronizes with every rank and would wait forever for a dead or stopped
// one; MPI_Abort ends the job on every rank (mpirun kills the others, the stopped one
// included) and frees MPI's shared-memory segments. A program that handled a failure and
// exits 0 (its peers alive, e.g. after a mismatch) still finalizes normally.
void note_broken(bool peer_gone) noexcept;

// Records that MPI bootstrapped a store (mpi_bootstrap_store) for groups on other
// transports, whose failures MPI never sees: at exit, a non-zero status then also ends the
// job with MPI_Abort (a peer may be stopped or dead; MPI_Finalize would wait for it), and
// status 0 finalizes normally.
void note_bootstrap() noexcept;

// The MPI datatype of one element of `t` (a 2-byte contiguous type for
// bfloat16/float16). Throws InvalidArgument for dtypes MPI cannot carry.
MPI_Datatype datatype_for(at::ScalarType t);

// MPI_SUM/MAX/MIN for dtypes MPI knows; lockstep's own commutative MPI_Ops
// (reduce_inplace) for bfloat16/float16. Throws InvalidArgument for Avg.
MPI_Op op_for(at::ScalarType t, ReduceOp op);

// "MPI_ERR_TRUNCATE: message truncated" for an MPI error code.
std::string error_string(int code);
// The error class of a code (MPI_ERR_TRUNCATE, ...).
int error_class(int code);

}  // namespace lockstep::comm::mpi
