// train/report/tensorboard_writer.h: scalar summaries in TensorBoard's event-file format.
//
// No TensorFlow or protobuf dependency: the file is a sequence of TFRecords
//   uint64 length | uint32 masked_crc32c(length) | Event bytes | uint32 masked_crc32c(bytes)
// (little endian; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8), and each Event
// protobuf is hand-encoded: wall_time (field 1, double), step (2, int64), and either
// file_version (3, "brain.Event:2", the first record) or summary (5) holding one
// Summary.Value {tag (1), simple_value (2, float)}. TensorBoard reads these as scalars.
// Flushed after every write so a crashed run keeps its curves. Not thread-safe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace lockstep::train {

class TensorBoardWriter {
 public:
  // Creates `dir` and `dir/events.out.tfevents.<unix time>.<host>.<suffix>`.
  TensorBoardWriter(const std::string& dir, const std::string& suffix);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  const std::string& path() const { return path_; }

  static uint32_t crc32c(const void* data, size_t n);
  static uint32_t masked_crc32c(const void* data, size_t n);

 private:
  void write_record(const std::string& event);
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace lockstep::train
