#include <lockstep/data/events_shard_reader.h>

#include <cerrno>
#include <cstring>

namespace lockstep::data {

EventShardReader::EventShardReader(std::string path) : path_(std::move(path)) {
  f_ = std::fopen(path_.c_str(), "rb");
  if (!f_) throw EventsFormatError(path_ + ": cannot open: " + std::strerror(errno));
  uint8_t h[kEventsHeaderBytes];
  if (std::fread(h, 1, kEventsHeaderBytes, f_) != kEventsHeaderBytes) {
    std::fclose(f_);
    f_ = nullptr;
    throw EventsFormatError(path_ + ": truncated header (file shorter than 64 bytes)");
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

std::string EventShardReader::where() const {
  return path_ + ": record " + std::to_string(index_) + " of " + std::to_string(header_.num_records) +
         " (byte offset " + std::to_string(offset_) + ")";
}

bool EventShardReader::read_prefix(uint32_t& len, uint32_t& crc) {
  if (index_ >= header_.num_records) return false;
  uint8_t p[8];
  const size_t got = std::fread(p, 1, 8, f_);
  if (got != 8) throw EventsFormatError(where() + ": truncated (file ends inside the record's length prefix)");
  len = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  crc = uint32_t(p[4]) | uint32_t(p[5]) << 8 | uint32_t(p[6]) << 16 | uint32_t(p[7]) << 24;
  if (len > kMaxRecordBytes || len < 12)
    throw EventsFormatError(where() + ": corrupt length prefix (" + std::to_string(len) + " bytes)");
  return true;
}

std::optional<ClientHistory> EventShardReader::next() {
  uint32_t len, crc;
  if (!read_prefix(len, crc)) return std::nullopt;
  buf_.resize(len);
  if (std::fread(buf_.data(), 1, len, f_) != len)
    throw EventsFormatError(where() + ": truncated (file ends inside the record's " + std::to_string(len) +
                            "-byte payload)");
  if (crc32(buf_.data(), len) != crc) throw EventsFormatError(where() + ": CRC32 mismatch (record corrupt)");
  ClientHistory c = decode_record(buf_.data(), len, where());
  ++index_;
  offset_ += 8 + len;
  return c;
}

bool EventShardReader::skip() {
  uint32_t len, crc;
  if (!read_prefix(len, crc)) return false;
  if (std::fseek(f_, long(len), SEEK_CUR) != 0)
    throw EventsFormatError(where() + ": seek failed: " + std::strerror(errno));
  ++index_;
  offset_ += 8 + len;
  return true;
}

}  // namespace lockstep::data
