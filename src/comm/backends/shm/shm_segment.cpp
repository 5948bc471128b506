// The shm segment: creation, mapping, unlinking, and where each region lives.
#include "comm/backends/shm/shm_segment.h"

#include <lockstep/error.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

namespace lockstep::comm::shm {
namespace {

constexpr uint64_t kMagic = 0x6c6f636b73746570ULL;  // "lockstep"
constexpr uint32_t kVersion = 4;                    // 3: Progress::sleepers; 4: Progress::cpu
constexpr size_t kPage = 4096;

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

std::string errno_text(int e) { return std::strerror(e); }

// Maps the whole object and closes `fd` (mapped or not); MAP_POPULATE pre-faults it so
// the first collective is not measured (or slowed) by page faults.
char* map_and_close(int fd, size_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    const int e = errno;
    throw ConfigError(lockstep::detail::concat("shm: mmap of ", name, " (", bytes,
                                               " bytes) failed: ", errno_text(e)));
  }
  return static_cast<char*>(p);
}

}  // namespace

Segment::Segment(const SegmentConfig& cfg) : cfg_(cfg) { compute_offsets(); }

size_t Segment::layout_bytes(const SegmentConfig& cfg) { return Segment(cfg).bytes_; }

void Segment::compute_offsets() {
  const size_t P = static_cast<size_t>(cfg_.world_size);
  const size_t pairs = P * (P > 0 ? P - 1 : 0);
  size_t off = round_up(sizeof(Header), kLine);
  off_progress_ = off;
  off += P * sizeof(Progress);
  off_info_ = off;
  off += P * sizeof(RankInfo);
  off_chanctl_ = off;
  off += pairs * sizeof(ChannelCtl);
  off_small_ = round_up(off, kPage);  // page aligned: memcpy/vector loops like it
  off = off_small_ + P * 2 * round_up(cfg_.small_bytes, kLine);
  off_staging_ = round_up(off, kPage);
  off = off_staging_ + P * 2 * round_up(cfg_.buffer_bytes, kPage);
  off_chan_ = off;
  off += pairs * round_up(cfg_.channel_bytes, kPage);
  bytes_ = round_up(off, kPage);
}

char* create_mapping(const std::string& name, size_t bytes, const char* hint) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    const int e = errno;
    throw ConfigError(lockstep::detail::concat("shm: cannot create ", name, ": ", errno_text(e)));
  }
  // posix_fallocate reserves tmpfs pages now: if /dev/shm is too small we fail
  // here with a message instead of dying of SIGBUS on first touch.
  int rc = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  if (rc == 0) rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    ::close(fd);
    Segment::unlink(name);
    throw ConfigError(lockstep::detail::concat("shm: cannot reserve ", bytes,
                                               " bytes in /dev/shm for ", name, ": ",
                                               errno_text(rc), " (", hint, ")"));
  }
  try {
    return map_and_close(fd, bytes, name);
  } catch (...) {
    Segment::unlink(name);
    throw;
  }
}

char* open_mapping(const std::string& name, size_t bytes, const char* hint) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    const int e = errno;
    throw ConfigError(lockstep::detail::concat("shm: cannot open ", name, ": ", errno_text(e)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    ::close(fd);
    throw ConfigError(lockstep::detail::concat("shm: ", name, " has ", st.st_size,
                                               " bytes, expected ", bytes, " (", hint, ")"));
  }
  return map_and_close(fd, bytes, name);
}

Segment Segment::create(const std::string& name, const SegmentConfig& cfg) {
  Segment s(cfg);
  s.base_ =
      create_mapping(name, s.bytes_, "free space in /dev/shm, or lower LOCKSTEP_SHM_BUFFER_BYTES");
  // Fresh tmpfs pages are zero, which is the initial state of every counter.
  Header& h = *new (s.base_) Header{};
  h.magic = kMagic;
  h.version = kVersion;
  h.world_size = static_cast<uint32_t>(cfg.world_size);
  h.buffer_bytes = cfg.buffer_bytes;
  h.channel_bytes = cfg.channel_bytes;
  h.small_bytes = cfg.small_bytes;
  h.abort_word.store(0, std::memory_order_release);
  return s;
}

Segment Segment::open(const std::string& name, const SegmentConfig& cfg) {
  Segment s(cfg);
  s.base_ = open_mapping(name, s.bytes_, "do all ranks use the same LOCKSTEP_SHM_* settings?");
  const Header& h = s.header();
  if (h.magic != kMagic || h.version != kVersion ||
      h.world_size != static_cast<uint32_t>(cfg.world_size) || h.buffer_bytes != cfg.buffer_bytes ||
      h.channel_bytes != cfg.channel_bytes || h.small_bytes != cfg.small_bytes)
    throw ConfigError(lockstep::detail::concat("shm: segment ", name, " has an unexpected header"));
  return s;
}

void Segment::unlink(const std::string& name) noexcept { ::shm_unlink(name.c_str()); }

Segment::~Segment() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

Segment::Segment(Segment&& o) noexcept { *this = std::move(o); }

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    cfg_ = o.cfg_;
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    off_progress_ = o.off_progress_;
    off_info_ = o.off_info_;
    off_chanctl_ = o.off_chanctl_;
    off_small_ = o.off_small_;
    off_staging_ = o.off_staging_;
    off_chan_ = o.off_chan_;
  }
  return *this;
}

Progress& Segment::progress(int rank) const {
  return reinterpret_cast<Progress*>(base_ + off_progress_)[rank];
}
RankInfo& Segment::info(int rank) const {
  return reinterpret_cast<RankInfo*>(base_ + off_info_)[rank];
}
int Segment::pair_index(int src, int dst) const {
  return src * (cfg_.world_size - 1) + (dst < src ? dst : dst - 1);
}
ChannelCtl& Segment::channel_ctl(int src, int dst) const {
  return reinterpret_cast<ChannelCtl*>(base_ + off_chanctl_)[pair_index(src, dst)];
}
char* Segment::channel_data(int src, int dst) const {
  return base_ + off_chan_ + pair_index(src, dst) * round_up(cfg_.channel_bytes, kPage);
}
char* Segment::small(int rank, int which) const {
  const size_t per = round_up(cfg_.small_bytes, kLine);
  return base_ + off_small_ + (static_cast<size_t>(rank) * 2 + which) * per;
}
char* Segment::staging(int rank, int which) const {
  const size_t per = round_up(cfg_.buffer_bytes, kPage);
  return base_ + off_staging_ + (static_cast<size_t>(rank) * 2 + which) * per;
}

}  // namespace lockstep::comm::shm
