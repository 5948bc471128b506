// Process-wide MPI state: init once, finalize once at exit, 16-bit types and ops.
#include "comm/backends/mpi/mpi_runtime.h"

#include "comm/backends/mpi/mpi_departure.h"

#include "comm/reduce_kernels.h"

#include <lockstep/error.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace lockstep::comm::mpi {
namespace {

// All of it guarded by call_lock().
bool g_we_initialized = false;
std::atomic<bool> g_finalized{false};
std::atomic<bool> g_broken{false};             // a group of this process failed (note_broken)
std::atomic<bool> g_peer_gone{false};          // ... because a peer died or stopped
std::atomic<bool> g_bootstrap{false};          // MPI carried a store's address (note_bootstrap)
MPI_Datatype g_half_type = MPI_DATATYPE_NULL;  // 2 contiguous bytes: bfloat16 and float16
MPI_Op g_ops[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                      {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};  // [bf16, f16][sum, max, min]

// MPI calls this with inout <- in op inout. The datatype handle tells nothing we
// need: one op exists per (dtype, op) pair.
template <at::ScalarType T, ReduceOp O>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_inplace(inout, in, *len, T, O);
}

int op_index(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return 0;
    case ReduceOp::Max:
      return 1;
    case ReduceOp::Min:
      return 2;
    default:
      break;
  }
  throw InvalidArgument(lockstep::detail::concat(
      "mpi: reduce op ", reduce_op_name(op), " cannot reach the backend (Avg is Sum then divide)"));
}

void check_init(int rc, const char* call) {
  if (rc != MPI_SUCCESS)
    throw ConfigError(lockstep::detail::concat("mpi: ", call, " failed: ", error_string(rc)));
}

void create_types_and_ops() {
  if (g_half_type != MPI_DATATYPE_NULL) return;
  check_init(MPI_Type_contiguous(2, MPI_BYTE, &g_half_type), "MPI_Type_contiguous");
  check_init(MPI_Type_commit(&g_half_type), "MPI_Type_commit");
  MPI_User_function* fns[2][3] = {
      {half_op<at::kBFloat16, ReduceOp::Sum>, half_op<at::kBFloat16, ReduceOp::Max>,
       half_op<at::kBFloat16, ReduceOp::Min>},
      {half_op<at::kHalf, ReduceOp::Sum>, half_op<at::kHalf, ReduceOp::Max>,
       half_op<at::kHalf, ReduceOp::Min>}};
  for (int d = 0; d < 2; ++d)
    for (int o = 0; o < 3; ++o)
      check_init(MPI_Op_create(fns[d][o], /*commute=*/1, &g_ops[d][o]), "MPI_Op_create");
}

// Runs once at exit if lockstep initialized MPI. A group still alive at this
// point (a static, or exit() from a thread) sees is_finalized() and fails its op.
// After a failure, MPI_Abort instead (note_broken): MPI_Finalize would wait for the
// failed rank.
void finalize_at_exit(int status, void*) {
  std::lock_guard<std::mutex> g(call_lock());
  int done = 0;
  MPI_Finalized(&done);
  if (!done && (g_peer_gone || ((g_broken || g_bootstrap) && status != 0))) {
    const int code = status != 0 ? status : 1;
    std::fprintf(
        stderr,
        "lockstep: mpi: %s; ending the job with MPI_Abort(MPI_COMM_WORLD, %d) instead "
        "of MPI_Finalize, which would wait for the failed rank\n",
        g_broken ? "a communication group of this rank failed" : "this rank exits with an error",
        code);
    std::fflush(stderr);
    // MPI_Abort ends every rank at once: the ranks that saw the same failure a moment
    // later get half a second to report it too (their messages name the failed rank).
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; if it did, finalizing could still hang
  }
  if (!done) {
    announce_departure_locked(status);  // peers waiting for this rank learn it will not come
    for (auto& row : g_ops)
      for (auto& op : row)
        if (op != MPI_OP_NULL) MPI_Op_free(&op);
    if (g_half_type != MPI_DATATYPE_NULL) MPI_Type_free(&g_half_type);
    MPI_Finalize();
  }
  g_finalized = true;
}

}  // namespace

std::mutex& call_lock() {
  static std::mutex* m = new std::mutex;  // leaked on purpose: used from the exit hook
  return *m;
}

void ensure_initialized_locked() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || g_finalized)
    throw ConfigError(
        "mpi: MPI has already been finalized in this process; create lockstep "
        "groups before MPI_Finalize");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    check_init(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided),
               "MPI_Init_thread");
    g_we_initialized = true;
    on_exit(finalize_at_exit, nullptr);  // glibc: like atexit, with the exit status
    start_departures_locked();
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED)
    throw ConfigError(
        lockstep::detail::concat("mpi: MPI provides thread level ", provided,
                                 " but lockstep calls MPI from its "
                                 "communication thread and needs MPI_THREAD_SERIALIZED (",
                                 MPI_THREAD_SERIALIZED, ") or better",
                                 initialized ? "; initialize MPI in the program with "
                                               "MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...)"
                                             : ""));
  create_types_and_ops();
}

void note_bootstrap() noexcept { g_bootstrap = true; }

void note_broken(bool peer_gone) noexcept {
  g_broken = true;
  if (peer_gone) g_peer_gone = true;
}

bool is_finalized() {
  if (g_finalized) return true;
  int done = 0;
  MPI_Finalized(&done);  // callable at any time, from any thread
  return done != 0;
}

MPI_Datatype datatype_for(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kInt:
      return MPI_INT32_T;
    case at::kLong:
      return MPI_INT64_T;
    case at::kByte:
      return MPI_UINT8_T;
    case at::kChar:
      return MPI_INT8_T;
    case at::kShort:
      return MPI_INT16_T;
    case at::kBFloat16:
    case at::kHalf:
      return g_half_type;
    default:
      break;
  }
  throw InvalidArgument(
      lockstep::detail::concat("mpi: dtype ", dtype_name(t), " is not supported"));
}

MPI_Op op_for(at::ScalarType t, ReduceOp op) {
  const int o = op_index(op);
  if (t == at::kBFloat16) return g_ops[0][o];
  if (t == at::kHalf) return g_ops[1][o];
  static const MPI_Op builtin[3] = {MPI_SUM, MPI_MAX, MPI_MIN};
  return builtin[o];
}

std::string error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS)
    return lockstep::detail::concat("MPI error ", code);
  return lockstep::detail::concat(std::string(buf, len), " (MPI error ", code, ")");
}

int error_class(int code) {
  int cls = code;
  MPI_Error_class(code, &cls);
  return cls;
}

}  // namespace lockstep::comm::mpi
