// ctsm/events_shard_writer.h: writes one event-log shard, client by client.
#pragma once

#include <ctsm/events_format.h>

#include <cstdio>
#include <string>
#include <vector>

namespace ctsm {

// Streams records to `<path>.tmp` and, on finish(), writes the final header (counts are
// known only then), fsyncs and renames to `path`: a shard file either exists complete
// or not at all. Destroying an unfinished writer removes the temporary file.
// Not thread-safe; one writer per shard.
class EventShardWriter {
 public:
  EventShardWriter(std::string path, ShardHeader header);
  ~EventShardWriter();
  EventShardWriter(const EventShardWriter&) = delete;
  EventShardWriter& operator=(const EventShardWriter&) = delete;

  void append(const ClientHistory& client);
  void finish();

 private:
  std::string path_;
  std::string tmp_;
  ShardHeader header_;
  std::FILE* f_ = nullptr;
  std::vector<uint8_t> buf_;
};

}  // namespace ctsm
