#include <lockstep/train/atomic_file.h>

#include <lockstep/error.h>

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace lockstep::train {
namespace {

// Pieces smaller than this are gathered; larger ones (tensor data) go straight to write().
constexpr size_t kBuffer = size_t(1) << 20;

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

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), crc_(uint32_t(::crc32(0L, Z_NULL, 0))) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_ < 0) throw Error(tmp_ + ": cannot create: " + std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFileWriter::append(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  crc_ = uint32_t(::crc32_z(crc_, reinterpret_cast<const Bytef*>(p), n));
  bytes_ += int64_t(n);
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

void AtomicFileWriter::write_all(const char* p, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t k = ::write(fd_, p + done, n - done);
    if (k < 0) {
      if (errno == EINTR) continue;
      throw Error(
          lockstep::detail::concat(tmp_, ": write failed: ", std::strerror(errno),
                                   " (disk full? free space or set checkpoint.dir elsewhere)"));
    }
    done += size_t(k);
  }
}

void AtomicFileWriter::commit() {
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
