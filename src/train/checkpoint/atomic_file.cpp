#include <lockstep/train/atomic_file.h>

#include <lockstep/error.h>

#include "train/checkpoint/crc32.h"

#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <new>
#include <sstream>
#include <vector>

namespace lockstep::train {
namespace {

// Pieces smaller than this are gathered; larger ones (tensor data) go straight to write().
constexpr size_t kBuffer = size_t(1) << 20;
// O_DIRECT: offsets, sizes and the buffer aligned to the page (every logical block size up
// to 4 KiB); the bounce buffer's size sets the size of each write.
constexpr size_t kDirectAlign = 4096;
constexpr size_t kDirectBuffer = size_t(8) << 20;

// O_DIRECT accepted at open but a write refused (a file system with other alignment
// rules): the rest of the file goes buffered.
bool clear_direct(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_DIRECT) && ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) == 0;
}

int open_tmp(const std::string& tmp, bool* direct) {
  const int flags = O_WRONLY | O_CREAT | O_TRUNC;
  if (*direct) {
    const int fd = ::open(tmp.c_str(), flags | O_DIRECT, 0644);
    if (fd >= 0 || errno != EINVAL) return fd;
    *direct = false;  // the file system has no O_DIRECT: buffered
  }
  return ::open(tmp.c_str(), flags, 0644);
}

// Bounce buffers outlive their writers: a checkpoint writes several files per save, and a
// fresh 8 MiB buffer would fault its pages in again each time.
std::mutex bounce_mu;
std::vector<char*> bounce_free;  // NOLINT: process-wide pool, guarded by bounce_mu

char* take_bounce_buffer() {
  {
    std::lock_guard<std::mutex> lock(bounce_mu);
    if (!bounce_free.empty()) {
      char* p = bounce_free.back();
      bounce_free.pop_back();
      return p;
    }
  }
  void* p = std::aligned_alloc(kDirectAlign, kDirectBuffer);
  if (!p) throw std::bad_alloc();
  return static_cast<char*>(p);
}

void give_back_bounce_buffer(char* p) {
  std::lock_guard<std::mutex> lock(bounce_mu);
  bounce_free.push_back(p);
}

}  // namespace

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw Error(dir + ": cannot open directory: " + std::strerror(errno));
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFileWriter w(path);
  w.append(bytes.data(), bytes.size());
  w.commit();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void AtomicFileWriter::GiveBack::operator()(char* p) const { give_back_bounce_buffer(p); }

AtomicFileWriter::AtomicFileWriter(std::string path, bool direct)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), crc_(0) {
  fd_ = open_tmp(tmp_, &direct);
  if (fd_ < 0) throw Error(tmp_ + ": cannot create: " + std::strerror(errno));
  if (!direct) return;
  direct_buf_.reset(take_bounce_buffer());
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFileWriter::append(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  crc_ = crc32_update(crc_, p, n);
  bytes_ += int64_t(n);
  if (direct_buf_) {
    append_direct(p, n);
    return;
  }
  if (buf_.size() + n <= kBuffer) {
    buf_.append(p, n);
    return;
  }
  flush();
  write_all(p, n);
}

void AtomicFileWriter::flush() {
  write_all(buf_.data(), buf_.size());
  buf_.clear();
}

void AtomicFileWriter::append_direct(const char* p, size_t n) {
  while (n > 0) {
    const size_t k = std::min(n, kDirectBuffer - direct_used_);
    std::memcpy(direct_buf_.get() + direct_used_, p, k);
    direct_used_ += k, p += k, n -= k;
    if (direct_used_ == kDirectBuffer) flush_direct(false);
  }
}

// Writes the bounce buffer; the last one padded to the alignment, the file then cut to the
// bytes appended.
void AtomicFileWriter::flush_direct(bool last) {
  size_t n = direct_used_;
  if (last) {
    n = (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    std::memset(direct_buf_.get() + direct_used_, 0, n - direct_used_);
  }
  write_all(direct_buf_.get(), n);
  direct_used_ = 0;
  if (last && ::ftruncate(fd_, off_t(bytes_)) != 0)
    throw Error(tmp_ + ": truncate failed: " + std::strerror(errno));
}

void AtomicFileWriter::write_all(const char* p, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t k = ::write(fd_, p + done, n - done);
    if (k < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EINVAL && clear_direct(fd_)) continue;  // refused here after all: buffered
      throw Error(
          lockstep::detail::concat(tmp_, ": write failed: ", std::strerror(err),
                                   " (disk full? free space or set checkpoint.dir elsewhere)"));
    }
    done += size_t(k);
  }
}

void AtomicFileWriter::commit() {
  if (direct_buf_)
    flush_direct(true);
  else
    flush();
  const int fd = fd_;
  fd_ = -1;
  const bool synced = ::fsync(fd) == 0;
  const std::string err = synced ? std::string() : std::strerror(errno);
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    const std::string why = synced ? std::strerror(errno) : err;
    ::unlink(tmp_.c_str());
    throw Error(tmp_ + ": fsync/close failed: " + why);
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw Error(path_ + ": rename failed: " + std::strerror(errno));
  fsync_dir(std::filesystem::path(path_).parent_path().string());
}

}  // namespace lockstep::train
