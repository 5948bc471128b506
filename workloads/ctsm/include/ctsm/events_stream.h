// ctsm/events_stream.h: the records of a sharded event log that belong to one
// reader (one rank, or one loader worker of one rank), streamed without duplication.
//
// The data set's shards are split among `parts = world_size * workers` readers, part
// q = rank * workers + worker:
//   - shards >= parts: part q reads whole shards s with s % parts == q;
//   - shards <  parts: shard s is read by the parts q with q % shards == s, each taking
//     every n-th record (n = number of such parts), skipping the others unread.
// Every record goes to exactly one part. The plan uses only shard headers, so every rank
// can compute every part's record count (e.g. to agree on steps per epoch) cheaply.
#pragma once

#include <ctsm/events_shard_reader.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ctsm {

struct EventPart {
  int part = 0;  // 0..parts-1
  int parts = 1;
};

// One shard's share for a part: records k with k % stride == offset.
struct ShardSlice {
  std::string path;
  uint64_t offset = 0;
  uint64_t stride = 1;
  uint64_t records = 0;  // how many records this slice yields
};

class EventStream {
 public:
  // `shards`: the shard file paths in index order (list_shards()).
  EventStream(std::vector<std::string> shards, EventPart part);

  // The slices of `part` (headers are read; payloads are not).
  static std::vector<ShardSlice> plan(const std::vector<std::string>& shards, EventPart part);
  // Sorted `events-*.lse` paths in `dir`; throws EventsFormatError if none, or if the
  // set is incomplete (a shard missing from events-*-of-N).
  static std::vector<std::string> list_shards(const std::string& dir);

  uint64_t size() const { return total_; }  // records this part yields per pass
  // Next record of this part, or nullopt at the end of the pass.
  std::optional<ClientHistory> next();
  // Restart from the first record.
  void rewind();

 private:
  std::vector<ShardSlice> slices_;
  uint64_t total_ = 0;
  size_t slice_ = 0;
  std::unique_ptr<EventShardReader> reader_;
};

}  // namespace ctsm
