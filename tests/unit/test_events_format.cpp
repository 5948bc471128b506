// The event-log format: round trip, generator determinism, partitioning without
// duplicates, and errors in lockstep::data::DataError's style for corrupt/truncated
// shards: the file, the record, its byte offset, and what was expected there.
#include <ctsm/events_generator.h>
#include <ctsm/events_shard_reader.h>
#include <ctsm/events_stream.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace fs = std::filesystem;
using namespace ctsm;

namespace {

std::string temp_dir(const std::string& name) {
  const std::string d =
      (fs::temp_directory_path() / ("lockstep_events_" + name + "_" + std::to_string(::getpid())))
          .string();
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

EventGeneratorOptions small(uint32_t shards) {
  EventGeneratorOptions o;
  o.num_clients = 57;  // not divisible by the shard counts used
  o.num_items = 50;
  o.num_shards = shards;
  return o;
}

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(EventsFormat, RoundTripAndDeterminism) {
  const std::string d1 = temp_dir("rt1"), d2 = temp_dir("rt2");
  EventGenerator gen(small(3));
  gen.write_shards(d1);
  // Generating shard by shard "on different ranks" gives identical bytes.
  gen.write_shards(d2, 1, 2);
  gen.write_shards(d2, 0, 2);
  const auto shards = EventStream::list_shards(d1);
  ASSERT_EQ(shards.size(), 3u);
  for (size_t i = 0; i < shards.size(); ++i)
    EXPECT_EQ(read_all(shards[i]), read_all(d2 + "/" + fs::path(shards[i]).filename().string()));
  uint64_t id = 0;
  for (const auto& s : shards) {
    EventShardReader r(s);
    while (auto c = r.next()) {
      const ClientHistory want = gen.client(id++);
      ASSERT_EQ(c->client_id, want.client_id);
      ASSERT_EQ(c->events.size(), want.events.size());
      for (size_t k = 0; k < want.events.size(); ++k) {
        EXPECT_EQ(c->events[k].time_s, want.events[k].time_s);
        EXPECT_EQ(c->events[k].item_id, want.events[k].item_id);
        EXPECT_EQ(c->events[k].type, want.events[k].type);
        EXPECT_EQ(c->events[k].p_true, want.events[k].p_true);
        if (k) {
          EXPECT_LE(c->events[k - 1].time_s, c->events[k].time_s);
        }
      }
    }
  }
  EXPECT_EQ(id, 57u);
}

TEST(EventsFormat, PartsCoverEveryRecordOnce) {
  for (uint32_t S : {1u, 3u, 4u}) {
    const std::string d = temp_dir("part" + std::to_string(S));
    EventGenerator(small(S)).write_shards(d);
    const auto shards = EventStream::list_shards(d);
    for (int parts = 1; parts <= 7; ++parts) {
      std::multiset<uint64_t> seen;
      for (int q = 0; q < parts; ++q) {
        EventStream s(shards, {q, parts});
        uint64_t n = 0;
        while (auto c = s.next()) {
          seen.insert(c->client_id);
          ++n;
        }
        EXPECT_EQ(n, s.size()) << "S=" << S << " parts=" << parts << " q=" << q;
      }
      ASSERT_EQ(seen.size(), 57u) << "S=" << S << " parts=" << parts;
      EXPECT_EQ(std::set<uint64_t>(seen.begin(), seen.end()).size(), 57u) << "duplicates";
    }
  }
}

TEST(EventsFormat, CorruptRecordNamesFileAndRecord) {
  const std::string d = temp_dir("corrupt");
  EventGenerator(small(1)).write_shards(d);
  const std::string path = EventStream::list_shards(d)[0];
  // Find record 5's offset by walking the reader, then flip a byte inside its payload.
  uint64_t offset = kEventsHeaderBytes;
  {
    std::ifstream in(path, std::ios::binary);
    for (int r = 0; r < 5; ++r) {
      in.seekg(std::streamoff(offset));
      uint8_t len[4];
      in.read(reinterpret_cast<char*>(len), 4);
      offset += 8 + (uint32_t(len[0]) | uint32_t(len[1]) << 8 | uint32_t(len[2]) << 16 |
                     uint32_t(len[3]) << 24);
    }
  }
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(offset + 8 + 3));
    f.put('\x5a');
  }
  EventShardReader r(path);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(r.next());
  try {
    r.next();
    FAIL() << "no error";
  } catch (const EventsFormatError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind(path + ": ", 0), 0u) << m;
    EXPECT_NE(m.find("record 5 of 57 at byte offset " + std::to_string(offset)), std::string::npos)
        << m;
    EXPECT_NE(m.find("CRC32 mismatch: stored 0x"), std::string::npos) << m;
    EXPECT_NE(m.find(", computed 0x"), std::string::npos) << m;
    EXPECT_EQ(e.kind(), lockstep::data::DataError::Kind::Mismatch);
    EXPECT_EQ(e.path(), path);
    EXPECT_EQ(e.offset(), int64_t(offset));
  }
}

TEST(EventsFormat, TruncatedShardNamesFileAndRecord) {
  const std::string d = temp_dir("trunc");
  EventGenerator(small(1)).write_shards(d);
  const std::string path = EventStream::list_shards(d)[0];
  fs::resize_file(path, fs::file_size(path) - 30);
  EventShardReader r(path);
  uint64_t n = 0;
  try {
    while (r.next()) ++n;
    FAIL() << "no error";
  } catch (const EventsFormatError& e) {
    const std::string m = e.what();
    EXPECT_EQ(n, 56u);
    EXPECT_EQ(m.rfind(path + ": ", 0), 0u) << m;
    EXPECT_NE(m.find("record 56 of 57 at byte offset "), std::string::npos) << m;
    // The file ends 30 bytes early, inside the last record's payload: says where, and
    // where the payload should have ended.
    const uint64_t size = fs::file_size(path);
    EXPECT_NE(m.find("truncated at byte " + std::to_string(size)), std::string::npos) << m;
    EXPECT_NE(m.find("to end at byte " + std::to_string(size + 30)), std::string::npos) << m;
    EXPECT_EQ(e.kind(), lockstep::data::DataError::Kind::Truncated);
    EXPECT_EQ(e.path(), path);
    EXPECT_GT(e.offset(), int64_t(kEventsHeaderBytes));
  }
}

TEST(EventsFormat, BadMagicAndMissingShard) {
  const std::string d = temp_dir("magic");
  const std::string bad = d + "/events-00000-of-00002.lse";
  { std::ofstream(bad) << std::string(64, 'x'); }
  EXPECT_THROW(EventShardReader{bad}, EventsFormatError);
  try {
    EventShardReader r(bad);
  } catch (const EventsFormatError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.kind(), lockstep::data::DataError::Kind::BadMagic);
    EXPECT_NE(m.find(bad + ": bad magic \"xxxxxxxx\" at byte offset 0, expected \"LSEVENTS\""),
              std::string::npos)
        << m;
  }
  { std::ofstream(d + "/short.lse") << std::string(10, 'x'); }
  try {
    EventShardReader r(d + "/short.lse");
    ADD_FAILURE() << "no error";
  } catch (const EventsFormatError& e) {
    EXPECT_EQ(e.kind(), lockstep::data::DataError::Kind::Truncated);
    EXPECT_NE(std::string(e.what()).find("truncated at byte 10 of the 64-byte shard header"),
              std::string::npos)
        << e.what();
  }
  // A DataError like any other reader's: a program can catch the base class.
  EXPECT_THROW(EventShardReader{d + "/missing.lse"}, lockstep::data::DataError);
  try {
    EventStream::list_shards(d + "/nothing");
    ADD_FAILURE() << "no error";
  } catch (const EventsFormatError& e) {
    EXPECT_EQ(e.kind(), lockstep::data::DataError::Kind::NotFound);
    EXPECT_EQ(e.path(), d + "/nothing");
  }
  { std::ofstream(d + "/events-00002-of-00003.lse") << "x"; }
  EXPECT_THROW(EventStream::list_shards(d), EventsFormatError);
}

}  // namespace
