// lockstep/train/ctsm_loader.h: this rank's training examples, streamed and shuffled.
//
// Reads only this rank's part of the shards (data/events_stream.h), turns each client
// into a training example (events before the cutoff), and shuffles through a bounded
// buffer (memory: `shuffle_buffer` examples, whatever the data set size). The order is a
// pure function of (seed, epoch, rank), so a resumed run replays the same sequence:
// begin_epoch(e, skip) fast-forwards past the examples already consumed.
#pragma once

#include <lockstep/data/events_stream.h>
#include <lockstep/models/ctsm_batch.h>

#include <cstdint>
#include <random>
#include <vector>

namespace lockstep::train {

struct CtsmLoaderOptions {
  int64_t cutoff_s = 0;
  int max_len = 64;
  int64_t shuffle_buffer = 2048;
  uint64_t seed = 0;
};

class CtsmLoader {
 public:
  CtsmLoader(std::vector<std::string> shards, data::EventPart part, CtsmLoaderOptions options);
  uint64_t size() const { return stream_.size(); }  // examples per epoch in this part

  void begin_epoch(int64_t epoch, int64_t skip_examples = 0);
  // The next `n` examples as a batch; fewer only at the end of the part.
  models::CtsmBatch next_batch(int64_t n);

 private:
  bool next_example(models::CtsmExample& out);
  data::EventStream stream_;
  data::EventPart part_;
  CtsmLoaderOptions opt_;
  std::mt19937_64 rng_;
  std::vector<models::CtsmExample> buffer_;
  bool stream_done_ = false;
};

}  // namespace lockstep::train
