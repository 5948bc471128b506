#include <ctsm/events_shard_reader.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ctsm {
namespace {
std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}
}  // namespace

EventShardReader::EventShardReader(std::string path) : path_(std::move(path)) {
  f_ = std::fopen(path_.c_str(), "rb");
  if (!f_) {
    const int err = errno;
    throw EventsFormatError(err == ENOENT ? Kind::NotFound : Kind::Io, path_,
                            path_ + ": cannot open: " + std::strerror(err));
  }
  uint8_t h[kEventsHeaderBytes];
  const size_t got = std::fread(h, 1, kEventsHeaderBytes, f_);
  if (got != kEventsHeaderBytes) {
    std::fclose(f_);
    f_ = nullptr;
    throw EventsFormatError(Kind::Truncated, path_, got,
                            path_ + ": truncated at byte " + std::to_string(got) + " of the " +
                                std::to_string(kEventsHeaderBytes) + "-byte shard header");
  }
  try {
    header_ = decode_header(h, path_);
  } catch (...) {
    std::fclose(f_);
    f_ = nullptr;
    throw;
  }
}

EventShardReader::~EventShardReader() {
  if (f_) std::fclose(f_);
}

ShardHeader EventShardReader::read_header(const std::string& path) {
  EventShardReader r(path);
  return r.header();
}

RecordSource EventShardReader::source() const {
  return {path_, offset_,
          "record " + std::to_string(index_) + " of " + std::to_string(header_.num_records)};
}

std::string EventShardReader::where() const {
  return path_ + ": record " + std::to_string(index_) + " of " +
         std::to_string(header_.num_records) + " at byte offset " + std::to_string(offset_);
}

void EventShardReader::fail(Kind kind, const std::string& what) const {
  throw EventsFormatError(kind, path_, offset_, where() + ": " + what);
}

bool EventShardReader::read_prefix(uint32_t& len, uint32_t& crc) {
  if (index_ >= header_.num_records) return false;
  uint8_t p[8];
  const size_t got = std::fread(p, 1, 8, f_);
  if (got != 8)
    fail(Kind::Truncated, "truncated at byte " + std::to_string(offset_ + got) +
                              ", expected the record's 8-byte length prefix (the header promises " +
                              std::to_string(header_.num_records) + " records)");
  len = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  crc = uint32_t(p[4]) | uint32_t(p[5]) << 8 | uint32_t(p[6]) << 16 | uint32_t(p[7]) << 24;
  if (len > kMaxRecordBytes || len < 12)
    fail(Kind::BadShape, "corrupt length prefix: " + std::to_string(len) +
                             " bytes, expected 12 to " + std::to_string(kMaxRecordBytes) +
                             " (record corrupt)");
  return true;
}

std::optional<ClientHistory> EventShardReader::next() {
  uint32_t len, crc;
  if (!read_prefix(len, crc)) return std::nullopt;
  buf_.resize(len);
  const size_t got = std::fread(buf_.data(), 1, len, f_);
  if (got != len)
    fail(Kind::Truncated, "truncated at byte " + std::to_string(offset_ + 8 + got) +
                              ", expected the record's " + std::to_string(len) +
                              "-byte payload to end at byte " + std::to_string(offset_ + 8 + len));
  const uint32_t computed = crc32(buf_.data(), len);
  if (computed != crc)
    fail(Kind::Mismatch, "CRC32 mismatch: stored " + hex(crc) + ", computed " + hex(computed) +
                             " over the " + std::to_string(len) + "-byte payload (record corrupt)");
  ClientHistory c = decode_record(buf_.data(), len, source());
  ++index_;
  offset_ += 8 + len;
  return c;
}

bool EventShardReader::skip() {
  uint32_t len, crc;
  if (!read_prefix(len, crc)) return false;
  if (std::fseek(f_, long(len), SEEK_CUR) != 0)
    fail(Kind::Io, std::string("seek failed: ") + std::strerror(errno));
  ++index_;
  offset_ += 8 + len;
  return true;
}

}  // namespace ctsm
