#include <ctsm/events_stream.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace ctsm {

std::vector<std::string> EventStream::list_shards(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("events-", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".lse")
      out.push_back(e.path().string());
  }
  using Kind = EventsFormatError::Kind;
  if (ec)
    throw EventsFormatError(ec == std::errc::no_such_file_or_directory ? Kind::NotFound : Kind::Io,
                            dir, dir + ": cannot list event shards: " + ec.message());
  if (out.empty())
    throw EventsFormatError(Kind::NotFound, dir, dir + ": no event shards, expected events-*.lse");
  std::sort(out.begin(), out.end());
  // The set's size from a name ("events-00001-of-00004.lse"), so a missing shard is named.
  unsigned index = 0, total = 0;
  const std::string first = std::filesystem::path(out.front()).filename().string();
  if (std::sscanf(first.c_str(), "events-%5u-of-%5u.lse", &index, &total) != 2 || total == 0)
    total = uint32_t(out.size());
  for (uint32_t i = 0; i < total; ++i) {
    const std::string want = shard_file_name(i, total);
    const std::string path = (std::filesystem::path(dir) / want).string();
    if (i >= out.size() || std::filesystem::path(out[i]).filename() != want) {
      if (!std::filesystem::exists(path))
        throw EventsFormatError(Kind::NotFound, path,
                                path + ": missing shard " + std::to_string(i) + " of " +
                                    std::to_string(total) +
                                    "; generate the event log again (lockstep-train CONFIG "
                                    "--generate-only, with data.dir = " +
                                    dir + ")");
      throw EventsFormatError(Kind::Mismatch, dir,
                              dir + ": shard set mixed: expected " + want + ", found " +
                                  std::filesystem::path(out[i]).filename().string());
    }
  }
  if (out.size() != total)
    throw EventsFormatError(Kind::Mismatch, dir,
                            dir + ": shard set mixed: " + std::to_string(out.size()) +
                                " files for a set of " + std::to_string(total) + " shards");
  return out;
}

std::vector<ShardSlice> EventStream::plan(const std::vector<std::string>& shards, EventPart part) {
  LOCKSTEP_CHECK(part.parts >= 1 && part.part >= 0 && part.part < part.parts, "part ", part.part,
                 " of ", part.parts);
  const int S = int(shards.size());
  const int Q = part.parts, q = part.part;
  std::vector<ShardSlice> out;
  auto add = [&](int s, uint64_t offset, uint64_t stride) {
    const ShardHeader h = EventShardReader::read_header(shards[s]);
    const uint64_t n = h.num_records > offset ? (h.num_records - offset + stride - 1) / stride : 0;
    out.push_back({shards[s], offset, stride, n});
  };
  if (S >= Q) {
    for (int s = q; s < S; s += Q) add(s, 0, 1);
  } else {
    const int s = q % S;
    const int n = (Q - 1 - s) / S + 1;  // parts sharing shard s
    add(s, uint64_t(q / S), uint64_t(n));
  }
  return out;
}

EventStream::EventStream(std::vector<std::string> shards, EventPart part)
    : slices_(plan(shards, part)) {
  for (const auto& s : slices_) total_ += s.records;
}

void EventStream::rewind() {
  slice_ = 0;
  reader_.reset();
}

std::optional<ClientHistory> EventStream::next() {
  while (slice_ < slices_.size()) {
    const ShardSlice& sl = slices_[slice_];
    if (!reader_) {
      reader_ = std::make_unique<EventShardReader>(sl.path);
      for (uint64_t k = 0; k < sl.offset; ++k)
        if (!reader_->skip()) break;
    } else {
      // Skip the other parts' records between two of ours.
      for (uint64_t k = 1; k < sl.stride; ++k)
        if (!reader_->skip()) break;
    }
    if (auto c = reader_->next()) return c;
    reader_.reset();
    ++slice_;
  }
  return std::nullopt;
}

}  // namespace ctsm
