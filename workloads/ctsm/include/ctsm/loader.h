// ctsm/loader.h: this rank's training examples, streamed and shuffled.
//
// Reads only this rank's part of the shards (data/events_stream.h), turns each client
// into a training example (events before the cutoff), and shuffles through a bounded
// buffer (memory: `shuffle_buffer` examples, whatever the data set size). The order is a
// pure function of (seed, epoch, rank), so a resumed run replays the same sequence:
// begin_epoch(e, skip) fast-forwards past the examples already consumed.
#pragma once

#include <ctsm/batch.h>
#include <ctsm/events_stream.h>

#include <cstdint>
#include <random>
#include <vector>

namespace ctsm {

struct CtsmLoaderOptions {
  int64_t cutoff_s = 0;
  int max_len = 64;
  int64_t shuffle_buffer = 2048;
  uint64_t seed = 0;
};

class CtsmLoader {
 public:
  CtsmLoader(std::vector<std::string> shards, EventPart part, CtsmLoaderOptions options);
  uint64_t size() const { return stream_.size(); }  // examples per epoch in this part

  void begin_epoch(int64_t epoch, int64_t skip_examples = 0);
  // The next `n` examples as a batch; fewer only at the end of the part.
  CtsmBatch next_batch(int64_t n);

 private:
  bool next_example(CtsmExample& out);
  EventStream stream_;
  EventPart part_;
  CtsmLoaderOptions opt_;
  std::mt19937_64 rng_;
  std::vector<CtsmExample> buffer_;
  bool stream_done_ = false;
};

}  // namespace ctsm
