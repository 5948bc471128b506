// Ring allreduce over MPI point-to-point messages, for large tensors.
//
// OpenMPI's nonblocking MPI_Iallreduce (libnbc) moves a 64 MiB buffer about 4x slower
// than its blocking MPI_Allreduce, and the backend cannot block (deadlines, abort). The
// ring runs on MPI_Isend/MPI_Irecv, which progress at full speed in every MPI:
//   reduce-scatter: the tensor is cut into P blocks; at step s (0..P-2) rank r sends
//                   block (r-s) mod P to rank r+1 and receives block (r-s-1) mod P from
//                   rank r-1, folding it into its own copy. Rank r then holds the total
//                   of block (r+1) mod P.
//   allgather:      at step s rank r sends block (r+1-s) mod P on and receives block
//                   (r-s) mod P straight into the tensor.
// Each rank sends and receives 2(P-1)/P of the tensor (the bandwidth optimum) in
// 2(P-1) latency steps. Blocks travel in 1 MiB segments; while reduce-scattering, a
// window of 4 is in flight into 4 slots, so a segment is folded while still in cache
// and the next ones transfer meanwhile (temporary memory: 4 MiB, not a block). Every block is
// totalled in one fixed order and then copied, so all ranks end with the same bits.
#include "comm/backends/mpi/mpi_backend.h"
#include "comm/reduce_kernels.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace lockstep::comm {
namespace {

constexpr int64_t kSegmentBytes = 1 << 20;  // per message
constexpr int64_t kWindow = 4;              // segments in flight per folding step

}  // namespace

void MpiBackend::allreduce_ring(at::Tensor& t, ReduceOp op, const Where& w) {
  const int P = size_;
  const int64_t n = t.numel();
  const int64_t es = static_cast<int64_t>(t.element_size());
  const int64_t q = (n + P - 1) / P;  // elements per block (the last ones may be shorter)
  auto block_begin = [&](int b) { return std::min(n, q * b); };
  auto block_len = [&](int b) { return std::min(n, q * (b + 1)) - block_begin(b); };
  const int right = (rank_ + 1) % P, left = (rank_ + P - 1) % P;
  char* const data = static_cast<char*>(t.data_ptr());
  const int64_t seg = kSegmentBytes / es;  // elements per message
  // Received segments to fold land in a ring of kWindow slots, still in cache when folded.
  const at::Tensor slots = at::empty({std::min(q, kWindow * seg)}, t.options());
  const std::vector<at::Tensor> keep{t, slots};

  // One step: send block `out` to the right and receive block `in` from the left. With
  // `fold`, segments arrive in the slots, kWindow at a time, and are folded into the
  // tensor; without, they go straight to their place in the tensor, all posted at once.
  auto step = [&](int out, int in, bool fold) {
    const int64_t out_len = block_len(out), in_len = block_len(in);
    const int64_t n_in = (in_len + seg - 1) / seg, n_out = (out_len + seg - 1) / seg;
    auto len_of = [&](int64_t total, int64_t k) { return std::min(seg, total - k * seg); };
    char* const in_at = data + block_begin(in) * es;
    auto recv_to = [&](int64_t k) {
      return fold ? static_cast<char*>(slots.data_ptr()) + (k % kWindow) * seg * es
                  : in_at + k * seg * es;
    };
    std::vector<MPI_Request> reqs(n_in + n_out, MPI_REQUEST_NULL);
    auto post_recv = [&](int64_t k) {
      check(MPI_Irecv(recv_to(k), static_cast<int>(len_of(in_len, k) * es), MPI_BYTE, left, 0,
                      ring_comm_, &reqs[k]),
            w, "MPI_Irecv");
    };
    const int64_t window = fold ? kWindow : n_in;
    {
      std::lock_guard<std::mutex> g(mpi::call_lock());
      if (mpi::is_finalized()) fail(CommError::Kind::Failed, w, "MPI has been finalized");
      if (!abandoned_.empty()) reap_abandoned_locked();
      for (int64_t k = 0; k < std::min(window, n_in); ++k) post_recv(k);
      const char* src = data + block_begin(out) * es;
      for (int64_t k = 0; k < n_out; ++k)
        check(MPI_Isend(src + k * seg * es, static_cast<int>(len_of(out_len, k) * es), MPI_BYTE,
                        right, 0, ring_comm_, &reqs[n_in + k]),
              w, "MPI_Isend");
    }
    for (int64_t k = 0; k < n_in; ++k) {
      await(w, "MPI_Irecv", reqs, k, keep);
      if (!fold) continue;
      reduce_inplace(in_at + k * seg * es, recv_to(k), len_of(in_len, k), t.scalar_type(), op);
      if (k + window < n_in) {  // the slot is free again
        std::lock_guard<std::mutex> g(mpi::call_lock());
        post_recv(k + window);
      }
    }
    for (int64_t k = 0; k < n_out; ++k) await(w, "MPI_Isend", reqs, n_in + k, keep);
  };

  if (aborted_) fail(CommError::Kind::Aborted, w, "the group is being torn down (abort())");
  for (int s = 0; s < P - 1; ++s) step((rank_ - s + 2 * P) % P, (rank_ - s - 1 + 2 * P) % P, true);
  for (int s = 0; s < P - 1; ++s) step((rank_ + 1 - s + 2 * P) % P, (rank_ - s + 2 * P) % P, false);
}

}  // namespace lockstep::comm
