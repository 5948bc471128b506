// lockstep/train/checkpoint_store.h: atomic, resumable training checkpoints
// (docs/checkpoint-format.md).
//
// A checkpoint is a directory `step-NNNNNNNN/` holding model.pt, optimizer.pt (rank 0:
// identical on every rank under DDP; under FSDP every rank's fsdp-shard-RRRRR.pt instead),
// rng-rank-R.pt (every rank) and meta.json (rank 0: step, epoch, position in the epoch,
// world size, strategy, ...). It is assembled in
// `step-NNNNNNNN.tmp/`, every file fsync'd, then (after a barrier, so all ranks'
// files are in) renamed into place by rank 0, and only then is `LATEST` replaced
// (atomically) to name it. A crash at any point leaves LATEST naming a complete one.
#pragma once

#include <lockstep/comm/process_group.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace lockstep::train {

class CheckpointStore {
 public:
  // `group` may be null (single process). Keeps the newest `keep` checkpoints.
  CheckpointStore(std::string dir, comm::ProcessGroup* group, int64_t keep);

  // Collective. `shared` files are written by rank 0 only, `per_rank` files by every
  // rank (their names should contain the rank). Values are the files' bytes.
  void save(int64_t step, const std::map<std::string, std::string>& shared,
            const std::map<std::string, std::string>& per_rank);
  // The directory of the newest complete checkpoint, if any.
  std::optional<std::string> latest() const;
  const std::string& dir() const { return dir_; }

  static std::string step_name(int64_t step);

 private:
  void prune() const;
  void barrier() const;
  std::string dir_;
  comm::ProcessGroup* group_;
  int64_t keep_;
  int rank_ = 0;
};

}  // namespace lockstep::train
