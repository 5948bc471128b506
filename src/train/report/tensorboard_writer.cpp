#include "train/report/tensorboard_writer.h"

#include <lockstep/error.h>

#include <unistd.h>
#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace lockstep::train {
namespace {

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(v | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void fixed(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char(v >> (8 * i)));
}
void tag(std::string& out, int field, int wire) {
  varint(out, uint64_t(field) << 3 | uint64_t(wire));
}
void bytes_field(std::string& out, int field, const std::string& b) {
  tag(out, field, 2);
  varint(out, b.size());
  out += b;
}
double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
std::string event_header(double wt, int64_t step) {
  std::string e;
  uint64_t bits;
  std::memcpy(&bits, &wt, 8);
  tag(e, 1, 1);
  fixed(e, bits, 8);
  tag(e, 2, 0);
  varint(e, uint64_t(step));
  return e;
}

}  // namespace

uint32_t TensorBoardWriter::crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;  // Castagnoli
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t TensorBoardWriter::masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, const std::string& suffix) {
  std::filesystem::create_directories(dir);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  path_ = dir + "/events.out.tfevents." + std::to_string(int64_t(wall_time())) + "." + host + "." +
          suffix;
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) throw Error(path_ + ": cannot create TensorBoard event file");
  std::string e = event_header(wall_time(), 0);
  bytes_field(e, 3, "brain.Event:2");
  write_record(e);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::add_scalar(const std::string& name, double value, int64_t step) {
  std::string v;
  bytes_field(v, 1, name);
  const float f = float(value);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  tag(v, 2, 5);
  fixed(v, bits, 4);
  std::string summary;
  bytes_field(summary, 1, v);
  std::string e = event_header(wall_time(), step);
  bytes_field(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& event) {
  std::string rec;
  fixed(rec, event.size(), 8);
  const uint32_t len_crc = masked_crc32c(rec.data(), 8);
  fixed(rec, len_crc, 4);
  rec += event;
  fixed(rec, masked_crc32c(event.data(), event.size()), 4);
  std::fwrite(rec.data(), 1, rec.size(), f_);
  std::fflush(f_);
}

}  // namespace lockstep::train
