// Internal: the shared-memory segment of one shm process group, and its layout.
//
// One POSIX shm object per group, created by rank 0 with O_EXCL and mode 0600
// under a name nobody can predict ("/lockstep-<uid>-<nonce>-<prefix hash>"),
// mapped by every rank and unlinked as soon as all ranks have mapped it, so no
// segment outlives the job even when every rank is SIGKILLed.
//
// Layout (every region cache-line aligned so no two writers share a line):
//   Header | Progress[P] | RankInfo[P] | ChannelCtl[P*(P-1)] | small | staging | channels
// small: per rank, two slots of `small_bytes` for one-handshake small collectives
// (collective n uses slot n % 2, written before that collective's descriptor round).
// staging: per rank, two buffers of `buffer_bytes` (chunk c of a collective uses
// buffer c % 2, so a rank can fill the next chunk while peers read this one).
// channels: one single-producer/single-consumer byte ring per ordered pair.
#pragma once

#include <lockstep/comm/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace lockstep::comm::shm {

// 128 bytes: adjacent-line prefetchers pull lines in pairs, so 64 would still share.
constexpr size_t kLine = 128;

// An OpDesc in a fixed, process-independent form.
struct WireDesc {
  int32_t kind = 0;
  int32_t dtype = 0;
  int32_t op = 0;
  int32_t root = -1;
  int32_t tag = 0;
  int32_t variant = 0;  // collectives: the algorithm variant rank 0 chose (all follow it)
  uint64_t seq = 0;
  // allreduce: where the tensor lies in a shared region (SharedRegions::locate), 0 if
  // it does not; equal on every rank -> the zero-copy path.
  uint64_t shared_at = 0;
  int64_t numel = 0;
  uint64_t bytes = 0;  // send/recv: payload bytes that follow the header in the channel
};

struct alignas(kLine) Header {
  uint64_t magic;
  uint32_t world_size;
  uint32_t version;
  uint64_t buffer_bytes;
  uint64_t channel_bytes;
  uint64_t small_bytes;
  // 0 = healthy; else an encoded failure (see shm_sync.h) that every rank re-raises.
  std::atomic<uint64_t> abort_word;
};

// Written only by its rank: how many collective phases it has completed. Waiters that
// stop spinning sleep in futex_wait on the low 32 bits of `value` and count themselves
// in `sleepers`, so the owner makes the wake syscall only when someone sleeps (shm_sync.h).
// `cpu`: where the owner last posted; a waiter on the same CPU yields instead of spinning.
struct alignas(kLine) Progress {
  std::atomic<uint64_t> value;
  std::atomic<uint32_t> sleepers;
  std::atomic<int32_t> cpu;
};

struct alignas(kLine) RankInfo {
  std::atomic<int32_t> pid;
  WireDesc desc[2];  // posted descriptor of collective n lives in desc[n % 2]
};

// SPSC ring control: head written by the producer, tail by the consumer.
struct alignas(kLine) ChannelCtl {
  std::atomic<uint64_t> head;
  char pad_[kLine - sizeof(std::atomic<uint64_t>)];
  std::atomic<uint64_t> tail;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shm needs lock-free 64-bit atomics");
static_assert(std::atomic<int32_t>::is_always_lock_free, "shm needs lock-free 32-bit atomics");

// Creates POSIX shm object `name` exclusively (mode 0600), reserves `bytes` of /dev/shm
// for it (a full /dev/shm is a ConfigError ending in `hint`, not SIGBUS later) and
// maps it pre-faulted. Unlinks it again on failure.
char* create_mapping(const std::string& name, size_t bytes, const char* hint);
// Opens and maps `name`, which must have exactly `bytes` (else ConfigError ending in `hint`).
char* open_mapping(const std::string& name, size_t bytes, const char* hint);

struct SegmentConfig {
  int world_size = 1;
  uint64_t buffer_bytes = 0;   // per rank per staging buffer
  uint64_t channel_bytes = 0;  // per ordered pair
  uint64_t small_bytes = 0;    // per rank per small slot
};

// A mapped segment. Move-only; unmaps in the destructor (never throws).
class Segment {
 public:
  Segment() = default;
  ~Segment();
  Segment(Segment&& o) noexcept;
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Rank 0: creates `name` exclusively, reserves its memory (a full /dev/shm is a
  // clean error here, not SIGBUS later), maps it and initializes the header.
  static Segment create(const std::string& name, const SegmentConfig& cfg);
  // Other ranks: opens and maps `name`, validating size and header against cfg.
  static Segment open(const std::string& name, const SegmentConfig& cfg);
  // Removes the name; ENOENT (someone else already did) is fine. Never throws.
  static void unlink(const std::string& name) noexcept;
  // Total bytes the layout needs.
  static size_t layout_bytes(const SegmentConfig& cfg);

  const SegmentConfig& config() const { return cfg_; }
  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  Progress& progress(int rank) const;
  RankInfo& info(int rank) const;
  ChannelCtl& channel_ctl(int src, int dst) const;
  char* channel_data(int src, int dst) const;
  // Small slot `which` (0/1) of `rank`.
  char* small(int rank, int which) const;
  // Staging buffer `which` (0/1) of `rank`.
  char* staging(int rank, int which) const;

 private:
  explicit Segment(const SegmentConfig& cfg);  // the layout of cfg, not mapped yet
  void compute_offsets();
  int pair_index(int src, int dst) const;

  SegmentConfig cfg_;
  char* base_ = nullptr;
  size_t bytes_ = 0;
  size_t off_progress_ = 0, off_info_ = 0, off_chanctl_ = 0, off_small_ = 0, off_staging_ = 0,
         off_chan_ = 0;
};

}  // namespace lockstep::comm::shm
