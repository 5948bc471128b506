// ctsm/events_format.h: the on-disk client event log (workloads/ctsm/event-format.md).
//
// A data set is a directory of shard files `events-SSSSS-of-NNNNN.lse`. Each shard is a
// fixed 64-byte header followed by records; one record holds one client's whole event
// history in time order, so a reader can stream a shard client by client and never
// holds more than one client in memory. Every record is length-prefixed and carries a
// CRC32 of its payload; the header carries the record count, so truncation is detected
// at the exact record where the data stops.
#pragma once

#include <lockstep/data/data_error.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ctsm {

inline constexpr char kEventsMagic[8] = {'L', 'S', 'E', 'V', 'E', 'N', 'T', 'S'};
inline constexpr uint32_t kEventsVersion = 1;
inline constexpr size_t kEventsHeaderBytes = 64;
inline constexpr size_t kEventBytes = 18;               // packed size of one Event on disk
inline constexpr uint32_t kMaxRecordBytes = 64u << 20;  // a sanity bound: one client < 64 MiB

enum class EventType : uint8_t {
  Keep = 1,      // an item shipped to the client and kept (a purchase)
  Return = 2,    // an item shipped and sent back
  Feedback = 3,  // the client's rating of a shipment (item_id = 0, feedback = 1..5)
};

struct Event {
  int64_t time_s = 0;    // seconds since the data set's epoch (day 0, 00:00)
  uint32_t item_id = 0;  // 1..num_items; 0 for events without an item
  EventType type = EventType::Keep;
  uint8_t feedback = 0;  // 1..5 for Feedback events, else 0
  // The generator's true keep probability of this shipped item. Ground truth for
  // measuring achievable quality (oracle AUC); never a model feature. 0 for feedback.
  float p_true = 0;
};

struct ClientHistory {
  uint64_t client_id = 0;
  std::vector<Event> events;  // sorted by time_s; items of one shipment share a time
};

struct ShardHeader {
  uint32_t version = kEventsVersion;
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  uint32_t num_items = 0;    // catalog size: item ids are 1..num_items
  uint64_t num_records = 0;  // clients in this shard
  uint64_t num_events = 0;   // events in this shard
  int64_t t_begin_s = 0;     // every event time is in [t_begin_s, t_end_s)
  int64_t t_end_s = 0;
};

// A malformed, corrupt, truncated or missing shard: a lockstep::data::DataError (kind(),
// path()), so a program reports it like any other data-reader error, plus the byte offset
// in the file where the reader found the problem. what() reads
//   "PATH: record 7 of 400 at byte offset 5120: CRC32 mismatch: stored 0x..., computed 0x..."
// i.e. the file, where in it (record index and byte offset, or byte offset for the
// header), what was found, and what was expected.
class EventsFormatError : public lockstep::data::DataError {
 public:
  // For errors about a whole file or directory (not found, I/O, incomplete shard set).
  EventsFormatError(Kind kind, std::string path, const std::string& what_happened)
      : DataError(kind, std::move(path), what_happened) {}
  EventsFormatError(Kind kind, std::string path, uint64_t offset, const std::string& what_happened)
      : DataError(kind, std::move(path), what_happened), offset_(offset) {}
  // Byte offset in path() of the header field or record the error is about; -1 when the
  // error concerns the file as a whole.
  int64_t offset() const { return offset_; }

 private:
  int64_t offset_ = -1;
};

// CRC-32 (IEEE 802.3, the zlib/PNG polynomial) of `n` bytes, continuing from `crc`.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

// Header <-> its 64 on-disk bytes (little endian; the last 4 bytes are a CRC32 of the first 60).
void encode_header(const ShardHeader& h, uint8_t out[kEventsHeaderBytes]);
// Throws EventsFormatError naming `file`, the field's byte offset, the value found and the
// one expected, for a bad magic, version or header CRC.
ShardHeader decode_header(const uint8_t in[kEventsHeaderBytes], const std::string& file);

// Record payload (client id, event count, packed events) <-> bytes.
void encode_record(const ClientHistory& c, std::vector<uint8_t>& out);
// Where a record lies, for errors: the shard file, the byte offset of the record (its
// length prefix; the payload follows 8 bytes later), and a
// context such as "record 5 of 57".
struct RecordSource {
  std::string file;
  uint64_t offset = 0;
  std::string context;
};
// Throws EventsFormatError (naming `src`) if the payload is inconsistent.
ClientHistory decode_record(const uint8_t* p, size_t n, const RecordSource& src);

// "events-00003-of-00016.lse"
std::string shard_file_name(uint32_t index, uint32_t num_shards);

}  // namespace ctsm
