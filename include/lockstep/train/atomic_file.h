// lockstep/train/atomic_file.h: crash-safe file replacement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace lockstep::train {

// Writes `bytes` to `path` so that a crash at any moment leaves either the old file or the
// complete new one: write `path.tmp`, fsync it, rename over `path`, fsync the directory.
// Throws lockstep::Error naming the path on failure.
void write_file_atomic(const std::string& path, const std::string& bytes);
// fsync a directory (makes renames inside it durable).
void fsync_dir(const std::string& dir);
std::string read_file(const std::string& path);

// write_file_atomic for bytes produced piece by piece (a torch archive streamed by
// OutputArchive::save_to): append() buffers and writes `path.tmp` while it keeps the
// CRC-32 (zlib's) and the size of what was appended; commit() fsyncs, renames over `path`
// and fsyncs the directory. Destroyed without commit() (an exception, a crash), `path` is
// untouched and `path.tmp` is removed. Not thread-safe; one writer per file. Errors are
// lockstep::Error naming the file and the system's reason.
//
// `direct`: write through O_DIRECT from an aligned bounce buffer (the tail padded, then
// truncated to the size appended), for large files written once (checkpoints): the bytes go
// to the disk without a copy into the page cache, whose fresh pages cost far more CPU than
// the copy into the buffer (docs/checkpoints.md, "Cost"). Where the file system refuses
// O_DIRECT (tmpfs, some network and FUSE file systems) the file is written buffered.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path, bool direct = false);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void append(const void* data, size_t n);
  void commit();
  uint32_t crc32() const { return crc_; }
  int64_t bytes() const { return bytes_; }

 private:
  void flush();
  void append_direct(const char* p, size_t n);
  void flush_direct(bool last);
  void write_all(const char* p, size_t n);
  std::string path_, tmp_;
  int fd_ = -1;
  std::string buf_;  // buffered: small pieces (archive headers) gathered into large writes
  struct GiveBack {
    void operator()(char* p) const;
  };
  std::unique_ptr<char[], GiveBack> direct_buf_;  // direct: the aligned bounce buffer
  size_t direct_used_ = 0;
  uint32_t crc_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace lockstep::train
