// Encoding of the event-log shard header and records (layout: docs/event-format.md).
// Explicit little-endian byte packing rather than memcpy of structs, so the format does
// not depend on the compiler's padding or the host's byte order.
#include <ctsm/events_format.h>

#include <zlib.h>

#include <cctype>
#include <cstdio>
#include <cstring>

namespace ctsm {
namespace {

template <typename T>
void put(uint8_t*& p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = uint8_t(uint64_t(v) >> (8 * i));
  p += sizeof(T);
}
template <typename T>
T get(const uint8_t*& p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t(p[i]) << (8 * i);
  p += sizeof(T);
  return T(v);
}
void put_f32(uint8_t*& p, float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  put<uint32_t>(p, u);
}
float get_f32(const uint8_t*& p) {
  uint32_t u = get<uint32_t>(p);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

using Kind = EventsFormatError::Kind;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}
// The 8 magic bytes as a quoted string, non-printable bytes as \xNN.
std::string quoted(const uint8_t* p, size_t n) {
  std::string s = "\"";
  for (size_t i = 0; i < n; ++i) {
    if (std::isprint(p[i]) && p[i] != '"' && p[i] != '\\') {
      s += char(p[i]);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", p[i]);
      s += buf;
    }
  }
  return s + "\"";
}
std::string record_where(const RecordSource& src) {
  return src.file + ": " + src.context + " at byte offset " + std::to_string(src.offset);
}

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  return static_cast<uint32_t>(::crc32_z(crc, static_cast<const Bytef*>(data), n));
}

void encode_header(const ShardHeader& h, uint8_t out[kEventsHeaderBytes]) {
  std::memset(out, 0, kEventsHeaderBytes);
  std::memcpy(out, kEventsMagic, 8);
  uint8_t* p = out + 8;
  put<uint32_t>(p, h.version);
  put<uint32_t>(p, h.shard_index);
  put<uint32_t>(p, h.num_shards);
  put<uint32_t>(p, h.num_items);
  put<uint64_t>(p, h.num_records);
  put<uint64_t>(p, h.num_events);
  put<int64_t>(p, h.t_begin_s);
  put<int64_t>(p, h.t_end_s);
  put<uint32_t>(p, 0);  // reserved
  put<uint32_t>(p, crc32(out, 60));
}

ShardHeader decode_header(const uint8_t in[kEventsHeaderBytes], const std::string& file) {
  if (std::memcmp(in, kEventsMagic, 8) != 0)
    throw EventsFormatError(Kind::BadMagic, file, 0,
                            file + ": bad magic " + quoted(in, 8) +
                                " at byte offset 0, expected \"LSEVENTS\" " +
                                "(not an event shard)");
  const uint8_t* p = in + 8;
  ShardHeader h;
  h.version = get<uint32_t>(p);
  if (h.version != kEventsVersion)
    throw EventsFormatError(Kind::BadMagic, file, 8,
                            file + ": unsupported event shard version " +
                                std::to_string(h.version) + " at byte offset 8, expected " +
                                std::to_string(kEventsVersion));
  h.shard_index = get<uint32_t>(p);
  h.num_shards = get<uint32_t>(p);
  h.num_items = get<uint32_t>(p);
  h.num_records = get<uint64_t>(p);
  h.num_events = get<uint64_t>(p);
  h.t_begin_s = get<int64_t>(p);
  h.t_end_s = get<int64_t>(p);
  get<uint32_t>(p);  // reserved
  const uint32_t stored = get<uint32_t>(p);
  const uint32_t computed = crc32(in, 60);
  if (stored != computed)
    throw EventsFormatError(Kind::Mismatch, file, 60,
                            file + ": header CRC32 mismatch at byte offset 60: stored " +
                                hex32(stored) + ", computed " + hex32(computed) +
                                " over bytes 0-59 (header corrupt)");
  return h;
}

void encode_record(const ClientHistory& c, std::vector<uint8_t>& out) {
  out.resize(12 + kEventBytes * c.events.size());
  uint8_t* p = out.data();
  put<uint64_t>(p, c.client_id);
  put<uint32_t>(p, uint32_t(c.events.size()));
  for (const Event& e : c.events) {
    put<int64_t>(p, e.time_s);
    put<uint32_t>(p, e.item_id);
    put<uint8_t>(p, uint8_t(e.type));
    put<uint8_t>(p, e.feedback);
    put_f32(p, e.p_true);
  }
}

ClientHistory decode_record(const uint8_t* p, size_t n, const RecordSource& src) {
  if (n < 12)
    throw EventsFormatError(Kind::BadShape, src.file, src.offset,
                            record_where(src) + ": payload of " + std::to_string(n) +
                                " bytes, expected at least 12 (client id and event count)");
  ClientHistory c;
  c.client_id = get<uint64_t>(p);
  const uint32_t count = get<uint32_t>(p);
  if (n != 12 + size_t(count) * kEventBytes)
    throw EventsFormatError(
        Kind::BadShape, src.file, src.offset,
        record_where(src) + ": payload of " + std::to_string(n) + " bytes, expected " +
            std::to_string(12 + size_t(count) * kEventBytes) + " for its " + std::to_string(count) +
            " events (12 + " + std::to_string(kEventBytes) + " per event)");
  c.events.resize(count);
  for (size_t k = 0; k < c.events.size(); ++k) {
    Event& e = c.events[k];
    e.time_s = get<int64_t>(p);
    e.item_id = get<uint32_t>(p);
    const uint8_t t = get<uint8_t>(p);
    if (t < 1 || t > 3)
      throw EventsFormatError(Kind::BadShape, src.file, src.offset + 8 + 12 + k * kEventBytes + 12,
                              record_where(src) + ": event " + std::to_string(k) + " has type " +
                                  std::to_string(t) +
                                  ", expected 1 (keep), 2 (return) or 3 (feedback)");
    e.type = EventType(t);
    e.feedback = get<uint8_t>(p);
    e.p_true = get_f32(p);
  }
  return c;
}

std::string shard_file_name(uint32_t index, uint32_t num_shards) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "events-%05u-of-%05u.lse", index, num_shards);
  return buf;
}

}  // namespace ctsm
