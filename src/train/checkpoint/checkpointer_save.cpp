// Checkpointer's saving side: what goes into a checkpoint, the host snapshot of
// asynchronous saves, the background write, and the commit that makes it visible
// (docs/checkpoints.md, "Asynchronous saves"). Loading is in checkpointer.cpp.
//
// A save's life on every rank, the collectives in the step:
//   save(N)        settle() the previous save; the files: staged copies (async) or the live
//                  objects (sync); the writer creates step-N.tmp/ (every rank: no barrier;
//                  crash leftovers were removed when the Checkpointer was built), serializes
//                  and writes the files into it, each fsync'd.
//   after_step(k)  while files are being written: allreduce [done, ok, failed rank]; when
//                  every rank is done, gather the manifests (every rank's CRC-32s and
//                  sizes) and rank 0's writer commits (meta.json, rename, LATEST, rotate).
//   settle()       (next save, finish) wait for this rank's job; commit if not yet
//                  committed; wait for rank 0's commit; allreduce its outcome.
#include "train/checkpoint/checkpointer.h"

#include "train/loop/diloco_support.h"

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <future>
#include <iostream>
#include <mutex>
#include <thread>

using json = nlohmann::json;

namespace lockstep::train {
namespace {

using torch::serialize::OutputArchive;

// Streams a torch archive built by `fill` into `w` (torch::save, without the string).
void save_archive(AtomicFileWriter& w, const std::function<void(OutputArchive&)>& fill) {
  OutputArchive ar(std::make_shared<torch::jit::CompilationUnit>());
  fill(ar);
  ar.save_to([&w](const void* data, size_t n) {
    w.append(data, n);
    return n;
  });
}

std::string rng_name(int rank) { return "rng-rank-" + std::to_string(rank) + ".pt"; }

torch::Tensor rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();  // a copy
}

}  // namespace

std::string Checkpointer::meta_json(int64_t step, double last_loss) const {
  json meta = {{"format", "lockstep-checkpoint"},
               {"step", step},
               {"epoch", step / plan_.steps_per_epoch},
               {"examples_in_epoch", (step % plan_.steps_per_epoch) * plan_.per_step},
               {"total_steps", plan_.total_steps},
               {"world_size", ctx_.world},
               {"strategy", cfg_.strategy.kind},
               {"loss", last_loss},
               {"config", json::parse(cfg_.json)}};
  if (scaler_ != nullptr)  // the same on every rank: the scaler's decisions are the group's
    meta["loss_scaler"] = {{"scale", scaler_->get_scale()},
                           {"growth_tracker", scaler_->growth_tracker()}};
  return meta.dump();
}

// Under hybrid_shard every replica holds the same shards: the first one's ranks write them,
// named by their rank in the FSDP (shard) group; every replica reads them on resume.
bool Checkpointer::writes_fsdp_shard() const {
  const auto& rep = fsdp_->options().replicate_group;
  return !rep || rep->rank() == 0;
}

std::string Checkpointer::fsdp_shard_file() const {
  return fsdp::FSDPCore::sharded_file_name(fsdp_->group().rank());
}

// Sync: the writer reads the model and optimizer themselves (the step waits for it).
std::vector<Checkpointer::PendingFile> Checkpointer::live_files() {
  std::vector<PendingFile> files;
  if (diloco_) return replica_files(false);
  if (fsdp_) {
    if (!writes_fsdp_shard()) return files;
    files.push_back({fsdp_shard_file(), [this](AtomicFileWriter& w) {
                       const std::string b = fsdp_->sharded_state(&optimizer_);
                       w.append(b.data(), b.size());
                     }});
  } else {
    files = full_files(ddp_file("model.pt", 0), ddp_file("optimizer.pt", 1), false);
  }
  return files;
}

// Async: copies into the staging buffers now, or records the copies for the copy thread
// (set_copy_beside_step); the writer reads only the copies.
std::vector<Checkpointer::PendingFile> Checkpointer::staged_files() {
  std::vector<PendingFile> files;
  staging_.begin(copies_beside_step());
  if (diloco_) {
    files = replica_files(true);
  } else if (fsdp_ && writes_fsdp_shard()) {
    std::shared_ptr<FsdpShardSnapshot> s =
        snapshot_fsdp(*fsdp_, *fsdp_layout_, optimizer_, staging_);
    files.push_back({fsdp_shard_file(), [s](AtomicFileWriter& w) {
                       save_archive(w, [&s](OutputArchive& ar) { s->write(ar); });
                     }});
  } else if (!fsdp_) {
    files = full_files(ddp_file("model.pt", 0), ddp_file("optimizer.pt", 1), true);
  }
  staging_.end();
  return files;
}

// DDP's replicas hold the same state: rank 0 writes model.pt and rank 1 optimizer.pt (the
// larger: AdamW's two moments), so two ranks share the work. `name` when `writer` (modulo
// the world size) is this rank, else "" (not this rank's file).
std::string Checkpointer::ddp_file(const std::string& name, int writer) const {
  return writer % ctx_.world == ctx_.rank ? name : std::string();
}

// The whole model under `model` and the optimizer under `optimizer` (either "": not
// written here): staged copies (async) or the live objects, read by the writer while the
// step waits (sync).
std::vector<Checkpointer::PendingFile> Checkpointer::full_files(const std::string& model,
                                                                const std::string& optimizer,
                                                                bool staged) {
  std::vector<PendingFile> files;
  if (!model.empty()) {
    std::shared_ptr<ModuleSnapshot> m = staged ? snapshot_module(*model_, staging_) : nullptr;
    files.push_back({model, [this, m](AtomicFileWriter& w) {
                       save_archive(w, [&](OutputArchive& ar) {
                         if (m)
                           m->write(ar);
                         else
                           model_->save(ar);
                       });
                     }});
  }
  if (!optimizer.empty()) {
    std::shared_ptr<OptimizerSnapshot> o =
        staged ? snapshot_optimizer(optimizer_, staging_) : nullptr;
    files.push_back({optimizer, [this, o](AtomicFileWriter& w) {
                       save_archive(w, [&](OutputArchive& ar) {
                         if (o)
                           o->write(ar);
                         else
                           optimizer_.save(ar);
                       });
                     }});
  }
  return files;
}

// DiLoCo: this rank's replica (model, inner optimizer) and the outer loop's state, staged
// or live. DiLoCo::state() waits for an exchange in flight (its result is part of it).
std::vector<Checkpointer::PendingFile> Checkpointer::replica_files(bool staged) {
  std::map<std::string, at::Tensor> st = diloco_->state();
  if (staged)
    for (auto& [k, v] : st) v = staging_.stage(v);
  const int r = ctx_.rank;
  std::vector<PendingFile> files =
      full_files(rank_file_name("model", r), rank_file_name("optimizer", r), staged);
  files.push_back({diloco_file_name(r), [st](AtomicFileWriter& w) {
                     save_archive(w, [&st](OutputArchive& ar) { write_named(ar, st); });
                   }});
  return files;
}

// The writer's job: every file into step-N.tmp/, durable, and this rank's manifest.
void Checkpointer::write_files(int64_t step, const std::vector<PendingFile>& files) {
  const int rank = ctx_.rank;
  const std::string tmp = store_.tmp_dir(step);
  checkpoint_test_point("write-start", step, rank);
  std::error_code ec;  // another rank may create it at the same moment: EEXIST is fine
  std::filesystem::create_directories(tmp, ec);
  if (!std::filesystem::is_directory(tmp))
    throw Error(tmp + ": cannot create the checkpoint directory: " + ec.message());
  std::string manifest;
  for (size_t i = 0; i < files.size(); ++i) {
    AtomicFileWriter w(tmp + "/" + files[i].name, /*direct=*/true);
    files[i].write(w);
    w.commit();
    manifest += CheckpointStore::manifest_line(files[i].name, w.crc32(), w.bytes());
    if (i == 0) checkpoint_test_point("write-mid", step, rank);
  }
  checkpoint_test_point("write-end", step, rank);
  manifest_ = manifest;
}

void Checkpointer::save(int64_t step, double last_loss) {
  settle();
  const std::string meta = ctx_.rank == 0 ? meta_json(step, last_loss) : std::string();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<PendingFile> files = async() ? staged_files() : live_files();
  const torch::Tensor rng = rng_state();
  last_snapshot_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  files.push_back({rng_name(ctx_.rank), [rng](AtomicFileWriter& w) {
                     save_archive(w, [&rng](OutputArchive& ar) { ar.write("0", rng); });
                   }});
  manifest_.clear();
  copy_ = {};
  last_copy_wait_s_ = 0;
  if (copies_beside_step())
    copy_ = std::async(std::launch::async, [this, pause = writer_->test_pause_ms()] {
              run_on_idle_cycles();
              if (pause > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause));
              staging_.copy_pending();
            }).share();
  writer_->run([this, step, copy = copy_, files = std::move(files)] {
    if (copy.valid()) copy.get();  // a failed copy fails this save, on every rank (agree_ok)
    write_files(step, files);
  });
  in_flight_ = InFlight{step, meta, false};
  if (!async()) settle();
}

void Checkpointer::before_update() {
  if (!copy_.valid()) return;
  const auto t0 = std::chrono::steady_clock::now();
  copy_.wait();  // its error, if any, is the writer's to report
  copy_ = {};
  last_copy_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Checkpointer::after_step(int64_t step, double last_loss) {
  poll();
  if (due(step)) save(step, last_loss);
}

void Checkpointer::finish() { settle(); }

// Collective: [every rank done, every rank ok, the lowest failed rank] by one allreduce;
// throws on every rank when one failed. `done_everywhere`: the caller waited already.
void Checkpointer::agree_ok(bool done_everywhere) {
  const auto st = done_everywhere ? writer_->wait() : writer_->state();
  int64_t done = st != CheckpointWriter::State::kBusy, ok = st != CheckpointWriter::State::kFailed;
  int64_t failed = ok ? ctx_.world : ctx_.rank;
  if (ctx_.group) {
    auto t = torch::tensor({done, ok, failed}, torch::kInt64);
    ctx_.group->allreduce(t, {comm::ReduceOp::Min})->wait();
    done = t[0].item<int64_t>(), ok = t[1].item<int64_t>(), failed = t[2].item<int64_t>();
  }
  if (!ok) {
    const int64_t step = in_flight_->step;
    in_flight_.reset();
    const std::string why = failed == ctx_.rank ? writer_->error() : "see its error";
    writer_->clear_error();
    throw Error(lockstep::detail::concat("checkpoint of step ", step,
                                         ": writing it failed on rank ", failed, " (", why,
                                         "); the previous checkpoint is intact"));
  }
  if (done && !in_flight_->committing) commit_in_flight();
}

// Every rank's files are durable: gather the manifests, rank 0's writer commits.
void Checkpointer::commit_in_flight() {
  const std::string manifest = store_.gather_manifest(manifest_);
  in_flight_->committing = true;
  if (ctx_.rank != 0) return;
  const int64_t step = in_flight_->step;
  writer_->run([this, step, meta = in_flight_->meta, manifest] {
    store_.commit(step, meta, manifest,
                  [step](const char* point) { checkpoint_test_point(point, step, 0); });
  });
}

void Checkpointer::poll() {
  if (in_flight_ && !in_flight_->committing) agree_ok(false);
}

void Checkpointer::settle() {
  if (!in_flight_) return;
  if (!in_flight_->committing) agree_ok(true);  // commits: every rank is done
  agree_ok(true);                               // rank 0's commit
  in_flight_.reset();
}

}  // namespace lockstep::train
