// ctsm/events_shard_reader.h: streams the records of one event-log shard.
#pragma once

#include <ctsm/events_format.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace ctsm {

// Opens a shard, validates its header, and yields client records in file order, one at a
// time (memory: one record). Every record's length and CRC32 are checked; a corrupt or
// truncated shard raises EventsFormatError naming the file, the record index, its byte
// offset, and what was expected there. skip() moves past a record without reading its payload, so a
// reader assigned every k-th record of a shard does not pay for the others' CRCs. Not thread-safe;
// one reader per thread.
class EventShardReader {
 public:
  explicit EventShardReader(std::string path);
  ~EventShardReader();
  EventShardReader(const EventShardReader&) = delete;
  EventShardReader& operator=(const EventShardReader&) = delete;

  const ShardHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  uint64_t next_index() const { return index_; }  // index of the record next() would return

  // The next record, or nullopt after the last one.
  std::optional<ClientHistory> next();
  // Skips the next record; false after the last one.
  bool skip();

  // Only the header (for planning: counts per shard) without keeping the file open.
  static ShardHeader read_header(const std::string& path);

 private:
  using Kind = EventsFormatError::Kind;
  bool read_prefix(uint32_t& len, uint32_t& crc);
  RecordSource source() const;  // the next record's file, offset and index
  std::string where() const;    // "PATH: record I of N at byte offset B"
  [[noreturn]] void fail(Kind kind, const std::string& what) const;

  std::string path_;
  std::FILE* f_ = nullptr;
  ShardHeader header_;
  uint64_t index_ = 0;
  uint64_t offset_ = kEventsHeaderBytes;
  std::vector<uint8_t> buf_;
};

}  // namespace ctsm
