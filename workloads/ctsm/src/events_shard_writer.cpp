#include <ctsm/events_shard_writer.h>

#include <unistd.h>
#include <cerrno>
#include <cstring>

namespace ctsm {
namespace {
void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
}  // namespace

EventShardWriter::EventShardWriter(std::string path, ShardHeader header)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), header_(header) {
  header_.num_records = 0;
  header_.num_events = 0;
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_)
    throw EventsFormatError(EventsFormatError::Kind::Io, tmp_,
                            tmp_ + ": cannot create: " + std::strerror(errno));
  // Placeholder header; the real one is written by finish() once the counts are known.
  uint8_t zero[kEventsHeaderBytes] = {};
  std::fwrite(zero, 1, kEventsHeaderBytes, f_);
}

EventShardWriter::~EventShardWriter() {
  if (f_) {
    std::fclose(f_);
    std::remove(tmp_.c_str());
  }
}

void EventShardWriter::append(const ClientHistory& client) {
  encode_record(client, buf_);
  uint8_t prefix[8];
  put_u32(prefix, uint32_t(buf_.size()));
  put_u32(prefix + 4, crc32(buf_.data(), buf_.size()));
  if (std::fwrite(prefix, 1, 8, f_) != 8 ||
      std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size())
    throw EventsFormatError(EventsFormatError::Kind::Io, tmp_,
                            tmp_ + ": write failed: " + std::strerror(errno));
  header_.num_records += 1;
  header_.num_events += client.events.size();
}

void EventShardWriter::finish() {
  uint8_t h[kEventsHeaderBytes];
  encode_header(header_, h);
  if (std::fseek(f_, 0, SEEK_SET) != 0 ||
      std::fwrite(h, 1, kEventsHeaderBytes, f_) != kEventsHeaderBytes || std::fflush(f_) != 0 ||
      ::fsync(fileno(f_)) != 0)
    throw EventsFormatError(EventsFormatError::Kind::Io, tmp_,
                            tmp_ + ": write failed: " + std::strerror(errno));
  std::fclose(f_);
  f_ = nullptr;
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw EventsFormatError(EventsFormatError::Kind::Io, path_,
                            path_ + ": rename failed: " + std::strerror(errno));
}

}  // namespace ctsm
