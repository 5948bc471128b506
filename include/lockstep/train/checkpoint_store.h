// lockstep/train/checkpoint_store.h: atomic, verified, resumable training checkpoints
// (docs/checkpoints.md, docs/checkpoint-format.md).
//
// A checkpoint is a directory `step-NNNNNNNN/` holding model.pt, optimizer.pt (rank 0:
// identical on every rank under DDP; under FSDP every rank's fsdp-shard-RRRRR.pt instead),
// rng-rank-R.pt (every rank) and meta.json (rank 0: step, epoch, position in the epoch,
// world size, strategy, ...). It is assembled in `step-NNNNNNNN.tmp/`, every file fsync'd,
// then (after a barrier, so all ranks' files are in) renamed into place by rank 0, and only
// then is `LATEST` replaced (atomically) to name it. A crash at any point leaves LATEST
// naming a complete one.
//
// Integrity: meta.json's "files" table records the CRC-32 (zlib's polynomial) and size of
// every other file, every rank's included, and "meta_crc32" covers meta.json itself.
// CheckpointReader::read checks them, so a flipped byte or a truncated file is a
// CheckpointError naming the file, the expected and the found checksum, before libtorch
// ever parses it.
#pragma once

#include <lockstep/comm/process_group.h>
#include <lockstep/error.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::train {

// A checkpoint file that is missing, damaged (checksum or size mismatch), truncated, or
// that libtorch cannot parse. what() is one line that names the file. Resuming skips a
// checkpoint that raises it and falls back to the previous one.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// CRC-32 (zlib's crc32, the ISO-HDLC polynomial) of `bytes`.
uint32_t checkpoint_crc32(const std::string& bytes);

// One checkpoint directory, opened for reading. Not collective.
class CheckpointReader {
 public:
  // Reads and checks meta.json (throws CheckpointError naming it when it is missing, is
  // no JSON, or fails its own checksum).
  explicit CheckpointReader(std::string dir);

  const std::string& dir() const { return dir_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // meta.json's text as written.
  const std::string& meta_json() const { return meta_text_; }
  // False for checkpoints written before lockstep recorded checksums (format version 1):
  // their files are read unchecked (a warning is the caller's).
  bool verified() const { return verified_; }
  // The bytes of `name`, checked against meta.json's record of it. Throws CheckpointError
  // "DIR/NAME: ..." when it is missing, not recorded (verified checkpoints only), of the
  // wrong size, or of the wrong checksum.
  std::string read(const std::string& name) const;

 private:
  struct Digest {
    uint32_t crc32 = 0;
    int64_t bytes = 0;
  };
  std::string dir_;
  std::string meta_text_;
  bool verified_ = false;
  std::map<std::string, Digest> files_;
};

class CheckpointStore {
 public:
  // `group` may be null (single process). Keeps the newest `keep` checkpoints.
  CheckpointStore(std::string dir, comm::ProcessGroup* group, int64_t keep);

  // Collective. `meta_json` is a JSON object; the store adds the "files" table (the CRC-32
  // and size of every shared and per-rank file of every rank) and "meta_crc32", and writes
  // it as meta.json. `shared` files are written by rank 0 only (the other ranks' are
  // ignored), `per_rank` files by every rank (their names must contain the rank). Values
  // are the files' bytes. Rotation then keeps this checkpoint and the newest keep-1 older
  // ones; it never deletes this one, nor ones of a later step (left by another run).
  void save(int64_t step, const std::string& meta_json,
            const std::map<std::string, std::string>& shared,
            const std::map<std::string, std::string>& per_rank);

  // save() in phases, for writers that produce the files elsewhere (Checkpointer's
  // background writer, docs/checkpoints.md "Asynchronous saves"):
  // Collective: rank 0 empties and creates tmp_dir(step) (leftovers of a crash), then a
  // barrier, so every rank may write into it.
  void prepare(int64_t step) const;
  std::string tmp_dir(int64_t step) const { return dir_ + "/" + step_name(step) + ".tmp"; }
  // Not collective (rank 0, before any rank writes): removes every step-N.tmp/ that a crash
  // left behind, so that writers may create tmp_dir(step) themselves without a barrier.
  void remove_leftovers() const;
  // Collective: every rank's manifest lines (manifest_line) concatenated in rank order, on
  // every rank. Called once every rank's files are durable, it is also the barrier before
  // the commit.
  std::string gather_manifest(const std::string& mine) const;
  // "name<TAB>crc32<TAB>bytes<LF>": one file's line of a rank's manifest.
  static std::string manifest_line(const std::string& name, uint32_t crc32, int64_t bytes);
  // Rank 0, not collective: writes meta.json (`meta_json` plus the files table of
  // `manifest`, every rank's) into tmp_dir(step), renames it into place, replaces LATEST
  // and rotates. Every rank's files must be durable in tmp_dir(step) already. `at`, if
  // set, is called at "commit-rename" (meta.json written) and "commit-latest" (renamed,
  // LATEST not yet replaced): the crash tests' hook.
  void commit(int64_t step, const std::string& meta_json, const std::string& manifest,
              const std::function<void(const char*)>& at = nullptr) const;

  // The directory LATEST names, if any (not checked further).
  std::optional<std::string> latest() const;
  // Checkpoint directories to try when resuming, best first: the one LATEST names, then
  // the older complete ones, newest first. Without a readable LATEST (or when it names a
  // missing directory; a warning is returned in `note`), every complete one, newest first.
  std::vector<std::string> candidates(std::string* note = nullptr) const;
  const std::string& dir() const { return dir_; }

  static std::string step_name(int64_t step);
  // The step of a directory name "step-NNNNNNNN" (exactly), else nullopt.
  static std::optional<int64_t> parse_step_name(const std::string& name);

 private:
  void prune(int64_t saved_step) const;
  void barrier() const;
  std::vector<int64_t> complete_steps() const;
  std::string dir_;
  comm::ProcessGroup* group_;
  int64_t keep_;
  int rank_ = 0;
};

}  // namespace lockstep::train
