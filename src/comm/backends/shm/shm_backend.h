// Internal: the single-node shared-memory backend.
//
// Ranks of one node share one segment (shm_segment.h). Collectives move data
// through per-rank staging buffers in chunks of at most `buffer_bytes` per rank,
// synchronized by per-rank progress counters: each chunk has two phases and after
// each phase a rank bumps its own counter (one writer per cache line, no atomic
// read-modify-write anywhere on the hot path). A rank that needs a peer's data
// waits until that peer's counter reaches the phase it needs. Chunk c uses
// staging buffer c % 2, so a rank may fill chunk c+1 while peers still read chunk c.
//
// Every collective starts with a descriptor round: each rank posts its OpDesc in
// its slot and bumps its counter; after seeing all peers' posts it compares them
// (-> CommError Mismatch on every rank). That round doubles as the barrier that
// makes the previous collective's staging buffers free again.
//
// Send/recv use per-pair SPSC byte rings and never touch the collective counters.
//
// Thread safety: one comm thread calls the collectives (Backend contract);
// abort() may be called from any thread.
#pragma once

#include "comm/backend_factories.h"
#include "comm/backends/shm/path_choice.h"
#include "comm/backends/shm/shared_region.h"
#include "comm/backends/shm/shm_segment.h"
#include "comm/backends/shm/shm_sync.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace lockstep::comm::shm {

struct ShmOptions {
  // Bytes per rank per staging buffer (two per rank). Large tensors stream through
  // in chunks of this size; smaller chunks stay in the shared L2/L3 between the
  // copy-in and the reduce. LOCKSTEP_SHM_BUFFER_BYTES overrides it.
  uint64_t buffer_bytes = 1 << 20;
  // Bytes per ordered pair for send/recv; larger messages stream through.
  // LOCKSTEP_SHM_CHANNEL_BYTES overrides it.
  uint64_t channel_bytes = 1 << 20;
  // Allreduces up to this many bytes take the one-handshake path: the data rides
  // along with the descriptor round and every rank reduces all P copies.
  uint64_t small_bytes = 64 << 10;
  // Allgather outputs of at least this many bytes per rank are written with
  // non-temporal stores: at that size they do not stay in the caches next to the inputs
  // anyway, and such a store skips reading each line before overwriting it (a third of
  // a copy's memory traffic). The price: a reader right after the collective gets the
  // output from memory, not from cache. (The allreduce's tensor was read just before it
  // is written, and reduce_scatter's reduction would need an extra pass through L1: for
  // both, non-temporal stores measured slower.) 0: never. LOCKSTEP_SHM_STREAM_BYTES.
  uint64_t stream_output_bytes = 8 << 20;
  // How large allreduces move their data (path_choice.h); LOCKSTEP_SHM_PATH.
  PathMode path = PathMode::Auto;
  static ShmOptions from_environment();
};

class ShmBackend final : public Backend {
 public:
  ShmBackend(const StorePtr& store, const std::string& prefix, const LaunchEnv& env, Millis timeout,
             const ShmOptions& options);
  ~ShmBackend() override;

  std::string name() const override { return "shm"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool checks_descriptors() const override { return true; }
  bool averages() const override { return true; }
  bool bounded_by_deadline() const override { return true; }  // every wait checks it
  bool shares_memory() const override { return true; }

  void allreduce(at::Tensor& t, ReduceOp op, const OpContext& ctx) override;
  void allreduce_coalesced(std::vector<at::Tensor>& ts, ReduceOp op, const OpContext& ctx) override;
  void broadcast(at::Tensor& t, int root, const OpContext& ctx) override;
  void allgather(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) override;
  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op,
                      const OpContext& ctx) override;
  void alltoall(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) override;
  void send(const at::Tensor& t, int dst, int tag, const OpContext& ctx) override;
  void recv(at::Tensor& t, int src, int tag, const OpContext& ctx) override;
  void barrier(const OpContext& ctx) override;
  at::Tensor alloc_shared(int64_t numel, at::ScalarType dtype, const OpContext& ctx) override;
  void abort() noexcept override;
  std::vector<OpDesc> last_entered() const override;

  // ---- used by the per-algorithm files (allreduce_shm.cpp, ...) ----
  // Starts a collective: builds the Waiter, posts and checks the descriptor. With a
  // payload (at most options().small_bytes), copies it into this rank's small slot
  // first, so the descriptor round also delivers it: read it with small_slot().
  // `variant` rides in the descriptor; rank 0's is the one every rank follows
  // (leader_variant()), so rank 0 alone may choose an algorithm variant.
  // `shared_at` says where the data lies in shared memory (SharedPlace::code()).
  Waiter begin(OpKind kind, int64_t numel, at::ScalarType dtype, ReduceOp op, int root,
               const OpContext& ctx, const void* payload = nullptr, size_t payload_bytes = 0,
               int32_t variant = 0, uint64_t shared_at = 0);
  // `rank`'s `variant` for the collective begun last; rank 0's is the one to follow.
  int32_t variant_of(int rank) const { return last_desc(rank).variant; }
  int32_t leader_variant() const { return variant_of(0); }
  // True if every rank's data of the collective begun last lies at the same nonzero
  // place of shared memory (so the peers' data can be used where it is).
  bool all_shared_at(uint64_t code) const;
  // True if the last large allreduce or reduce_scatter used the peers' shared memory
  // directly.
  bool last_zero_copy() const { return last_zero_copy_; }
  // The small slot of `rank` for the collective begun last.
  const char* small_slot(int rank) const { return seg_.small(rank, (collectives_ - 1) % 2); }
  // Bumps this rank's progress counter (publishing every write before it), waking
  // peers asleep on it, if any.
  void post() { publish(seg_.progress(rank_), ++step_); }
  uint64_t step() const { return step_; }
  // Waits until `peer`'s counter reaches `target`.
  void wait_peer(Waiter& w, int peer, uint64_t target) const;
  // Waits until every other rank's counter reaches `target`.
  void wait_all(Waiter& w, uint64_t target) const;
  const Segment& segment() const { return seg_; }
  uint64_t buffer_bytes() const { return seg_.config().buffer_bytes; }
  const ShmOptions& options() const { return options_; }
  // Whether an output of `bytes` per rank is written with non-temporal stores.
  bool streams_output(uint64_t bytes) const {
    return options_.stream_output_bytes > 0 && bytes >= options_.stream_output_bytes;
  }
  PathChooser& paths() { return paths_; }
  const SharedRegions& regions() const { return regions_; }
  // The segment's (unlinked) name, "/lockstep-..."; allocations append "-a<id>-r<rank>".
  const std::string& shm_name() const { return seg_name_; }
  // For ops that exchange one region per destination (alltoall, reduce_scatter): elements
  // (of `es` bytes) per region of the staging buffer, a multiple of 128 bytes where the
  // buffer allows.
  int64_t region_elems(int64_t es) const;
  // Copies [off, off+len) of every destination's part d (at d*n in `src`) except our own
  // into region d of our staging buffer `b` (regions of `m` elements of `es` bytes).
  void stage_others(int b, const char* src, int64_t n, int64_t off, int64_t len, int64_t m,
                    int64_t es);

 private:
  void rendezvous(const StorePtr& store, const std::string& prefix, Millis timeout);
  // The small-allreduce path: `data` (n elements, contiguous) rides along with the
  // descriptor round and is reduced from the P small slots in place.
  void allreduce_small(char* data, int64_t n, at::ScalarType dt, ReduceOp op, const OpContext& ctx);
  void check_descriptors(Waiter& w, uint64_t slot);
  Waiter make_waiter(const OpContext& ctx, const OpDesc& d);
  const WireDesc& last_desc(int rank) const { return seg_.info(rank).desc[(collectives_ - 1) % 2]; }

  const int rank_;
  const int size_;
  ShmOptions options_;
  WaitPolicy policy_;
  Segment seg_;
  std::string seg_name_;  // its (unlinked) name: the stem of shared allocations' names
  std::vector<pid_t> pids_;
  PeerPoller peers_;          // the peers' pids and states, checked by waits that outlast the spin
  uint64_t step_ = 0;         // mirror of our progress counter (same on every rank between ops)
  uint64_t collectives_ = 0;  // collectives begun; selects the descriptor slot
  PathChooser paths_;         // rank 0's choice of the allreduce path
  SharedRegions regions_;     // alloc_shared's live allocations
  uint64_t shared_allocs_ = 0;  // allocations made: the next one's id (same on every rank)
  bool last_zero_copy_ = false;
  std::atomic<bool> aborted_{false};
};

}  // namespace lockstep::comm::shm
