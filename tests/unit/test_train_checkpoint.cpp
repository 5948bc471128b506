// Checkpoint integrity (CheckpointStore, CheckpointReader): every file's CRC-32 and size in
// meta.json, meta.json's own checksum, the one-line errors for a flipped byte or a
// truncated file, legacy checkpoints without checksums, the order resume tries
// checkpoints in, rotation, and the restart count the launcher exports.
#include "train/checkpoint/checkpointer.h"
#include "train/checkpoint/crc32.h"
#include "train/loop/precision_support.h"

#include <lockstep/env_contract.h>
#include <lockstep/launch/options.h>
#include <lockstep/launch/rank_env.h>
#include <lockstep/train/atomic_file.h>
#include <lockstep/train/checkpoint_store.h>

#include <gtest/gtest.h>
#include <zlib.h>

#include <unistd.h>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>

using namespace lockstep::train;
namespace fs = std::filesystem;

namespace {

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("lockstep_ckpt_integrity_" + std::to_string(::getpid())))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A checkpoint of `step` with a model, an optimizer and one rank's RNG file.
  void save(CheckpointStore& store, int64_t step) {
    const std::string model(1000 + step, 'm'), opt(500, 'o');
    store.save(step, R"({"format": "lockstep-checkpoint", "step": )" + std::to_string(step) + "}",
               {{"model.pt", model}, {"optimizer.pt", opt}}, {{"rng-rank-0.pt", "rng"}});
  }
  std::string step_dir(int64_t step) const { return dir_ + "/" + CheckpointStore::step_name(step); }

  static void flip_byte(const std::string& path, size_t at) {
    std::string b = read_file(path);
    ASSERT_LT(at, b.size());
    b[at] = char(b[at] ^ 0x5a);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
  }
  static void truncate(const std::string& path) { fs::resize_file(path, fs::file_size(path) / 2); }
  // The message of the CheckpointError that reading every file of `dir` raises.
  static std::string error_of(const std::string& dir) {
    try {
      CheckpointReader ck(dir);
      for (const char* f : {"model.pt", "optimizer.pt", "rng-rank-0.pt"}) ck.read(f);
    } catch (const CheckpointError& e) {
      return e.what();
    }
    return "";
  }

  std::string dir_;
};

TEST_F(CheckpointTest, IntactCheckpointReadsBack) {
  CheckpointStore store(dir_, nullptr, 2);
  save(store, 10);
  CheckpointReader ck(step_dir(10));
  EXPECT_TRUE(ck.verified());
  EXPECT_EQ(ck.read("model.pt"), std::string(1010, 'm'));
  EXPECT_EQ(ck.read("rng-rank-0.pt"), "rng");
  EXPECT_NE(ck.meta_json().find("\"meta_crc32\""), std::string::npos);
  EXPECT_EQ(error_of(step_dir(10)), "");
}

TEST_F(CheckpointTest, FlippedByteInEachFileIsNamed) {
  CheckpointStore store(dir_, nullptr, 2);
  save(store, 10);
  for (const char* f : {"model.pt", "optimizer.pt", "rng-rank-0.pt"}) {
    const std::string path = step_dir(10) + "/" + f;
    const std::string before = read_file(path);
    flip_byte(path, before.size() / 2);
    const std::string e = error_of(step_dir(10));
    SCOPED_TRACE(e);
    EXPECT_NE(e.find(path + ": damaged: expected crc32 "), std::string::npos);
    EXPECT_NE(e.find(", found "), std::string::npos);
    EXPECT_EQ(e.find('\n'), std::string::npos);  // one line
    std::ofstream(path, std::ios::binary | std::ios::trunc) << before;
  }
  EXPECT_EQ(error_of(step_dir(10)), "");
}

TEST_F(CheckpointTest, TruncatedFileIsNamedWithBothSizes) {
  CheckpointStore store(dir_, nullptr, 2);
  save(store, 10);
  const std::string path = step_dir(10) + "/optimizer.pt";
  truncate(path);
  const std::string e = error_of(step_dir(10));
  EXPECT_NE(e.find(path + ": truncated or damaged: expected 500 bytes with crc32 "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("found 250 bytes with crc32 "), std::string::npos) << e;
  fs::remove(path);
  EXPECT_NE(error_of(step_dir(10)).find(path + ": missing (meta.json records 500 bytes"),
            std::string::npos)
      << error_of(step_dir(10));
}

TEST_F(CheckpointTest, DamagedMetaJsonIsNamed) {
  CheckpointStore store(dir_, nullptr, 2);
  save(store, 10);
  const std::string meta = step_dir(10) + "/meta.json";
  const std::string text = read_file(meta);
  // A digit of a recorded size: still JSON, but not what was written.
  const size_t at = text.find("\"bytes\": ") + 9;
  std::string changed = text;
  changed[at] = changed[at] == '1' ? '2' : '1';
  std::ofstream(meta, std::ios::binary | std::ios::trunc) << changed;
  EXPECT_NE(error_of(step_dir(10)).find(meta + ": damaged: expected crc32 \""), std::string::npos)
      << error_of(step_dir(10));
  // Not JSON at all.
  std::ofstream(meta, std::ios::binary | std::ios::trunc) << text.substr(0, text.size() / 2);
  EXPECT_NE(error_of(step_dir(10)).find(meta + ": damaged: not valid JSON"), std::string::npos)
      << error_of(step_dir(10));
}

// Checkpoints of format version 1 (no "files", no "meta_crc32") load unverified.
TEST_F(CheckpointTest, LegacyCheckpointLoadsUnverified) {
  fs::create_directories(step_dir(5));
  write_file_atomic(step_dir(5) + "/meta.json",
                    R"({"format": "lockstep-checkpoint", "version": 1, "step": 5})");
  write_file_atomic(step_dir(5) + "/model.pt", "old bytes");
  CheckpointReader ck(step_dir(5));
  EXPECT_FALSE(ck.verified());
  EXPECT_EQ(ck.read("model.pt"), "old bytes");
  EXPECT_THROW(ck.read("optimizer.pt"), CheckpointError);
}

TEST_F(CheckpointTest, CandidatesStartAtLatestThenOlder) {
  CheckpointStore store(dir_, nullptr, 3);
  for (int64_t s : {10, 20, 30}) save(store, s);
  EXPECT_EQ(store.candidates(),
            (std::vector<std::string>{step_dir(30), step_dir(20), step_dir(10)}));
  // A later step LATEST does not name (another run's, or a crash before LATEST moved) is
  // not tried; LATEST naming nothing valid falls back to every checkpoint, with a note.
  write_file_atomic(dir_ + "/LATEST", "step-00000020\n");
  EXPECT_EQ(store.candidates(), (std::vector<std::string>{step_dir(20), step_dir(10)}));
  write_file_atomic(dir_ + "/LATEST", "step-0000002\x01\n");
  std::string note;
  EXPECT_EQ(store.candidates(&note),
            (std::vector<std::string>{step_dir(30), step_dir(20), step_dir(10)}));
  EXPECT_NE(note.find("LATEST names"), std::string::npos) << note;
  fs::create_directories(dir_ + "/step-00000040.tmp");
  EXPECT_EQ(store.candidates().size(), 3u);
}

// Rotation keeps the checkpoint just saved and keep-1 older ones, never a later one.
TEST_F(CheckpointTest, RotationKeepsTheOneJustSaved) {
  CheckpointStore store(dir_, nullptr, 1);
  save(store, 30);
  CheckpointStore again(dir_, nullptr, 1);  // a run that resumed from an earlier step
  save(again, 21);
  EXPECT_TRUE(fs::exists(step_dir(21)));
  EXPECT_TRUE(fs::exists(step_dir(30)));
  CheckpointStore two(dir_, nullptr, 2);
  for (int64_t s : {40, 50}) save(two, s);
  EXPECT_FALSE(fs::exists(step_dir(21)));
  EXPECT_FALSE(fs::exists(step_dir(30)));
  EXPECT_TRUE(fs::exists(step_dir(40)));
  EXPECT_TRUE(fs::exists(step_dir(50)));
}

TEST(CheckpointCrc, KnownVector) { EXPECT_EQ(checkpoint_crc32("123456789"), 0xCBF43926u); }

// The folded CRC-32 equals zlib's for every length 0..4096 at every start offset mod 16,
// continued from a nonzero CRC, and over 20 MiB.
TEST(CheckpointCrc, FoldedEqualsZlib) {
  std::string bytes(size_t(20) << 20, '\0');
  uint64_t r = 88172645463325252ull;
  for (auto& b : bytes) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    b = char(r);
  }
  auto zlib = [](uint32_t c, const char* p, size_t n) {
    return uint32_t(::crc32_z(c, reinterpret_cast<const Bytef*>(p), n));
  };
  int checked = 0;
  for (size_t n = 0; n <= 4096; ++n)
    for (size_t at : {size_t(0), size_t(3), size_t(16) + n % 16}) {
      ASSERT_EQ(crc32_update(0, bytes.data() + at, n), zlib(0, bytes.data() + at, n))
          << n << " bytes at offset " << at;
      ASSERT_EQ(crc32_update(0x12345678u, bytes.data() + at, n),
                zlib(0x12345678u, bytes.data() + at, n))
          << n << " bytes at offset " << at << ", continued";
      ++checked;
    }
  EXPECT_EQ(crc32_update(0, bytes.data(), bytes.size()), zlib(0, bytes.data(), bytes.size()));
  std::cout << "  " << checked << " lengths and offsets and 20 MiB equal zlib's crc32_z\n";
}

// AtomicFileWriter with O_DIRECT: sizes around the bounce buffer's 8 MiB and the 4 KiB
// alignment, appended in uneven pieces, read back byte for byte with the exact size and
// CRC-32; on tmpfs (no O_DIRECT) the same through the buffered fallback.
TEST_F(CheckpointTest, DirectWritesReadBackExactly) {
  const std::vector<std::string> dirs = {dir_,
                                         "/dev/shm/lockstep_direct_" + std::to_string(::getpid())};
  const int64_t mib = int64_t(1) << 20;
  for (const auto& dir : dirs) {
    if (!fs::exists(fs::path(dir).parent_path())) continue;
    fs::create_directories(dir);
    for (const int64_t n :
         {int64_t(0), int64_t(1), int64_t(4096), 8 * mib, 8 * mib + 1, 20 * mib + 77}) {
      std::string bytes(size_t(n), '\0');
      for (int64_t i = 0; i < n; ++i) bytes[size_t(i)] = char((i * 131 + i / 4099) & 0xff);
      const std::string path = dir + "/f.bin";
      AtomicFileWriter w(path, /*direct=*/true);
      for (int64_t at = 0, piece = 1; at < n; at += piece, piece = piece * 7 % 3000011 + 13)
        w.append(bytes.data() + at, size_t(std::min(piece, n - at)));
      w.commit();
      EXPECT_EQ(w.bytes(), n);
      EXPECT_EQ(w.crc32(), checkpoint_crc32(bytes)) << dir << ", " << n << " bytes";
      EXPECT_EQ(int64_t(fs::file_size(path)), n) << dir;
      EXPECT_TRUE(read_file(path) == bytes) << dir << ", " << n << " bytes differ";
      EXPECT_FALSE(fs::exists(path + ".tmp"));
    }
    std::cout << "  " << dir << ": 6 sizes read back exactly\n";
    if (dir != dir_) fs::remove_all(dir);
  }
}

// The launcher writes the restart count (rank_env) and the trainer reads it back.
TEST(RestartCount, LauncherEnvironmentReadsBack) {
  namespace launch = lockstep::launch;
  const launch::LaunchOptions o =
      launch::parse_args({"--nproc-per-node", "2", "--max-restarts", "3", "prog"});
  for (int restart : {0, 1, 3}) {
    launch::GroupContext group;
    group.job_id = "job";
    group.master_port = 29500;
    group.restart_count = restart;
    const launch::EnvMap env = launch::rank_env(o, 1, group, {});
    for (const char* name :
         {lockstep::env::kRestartCount, lockstep::env::kTorchelasticRestartCount}) {
      unsetenv(lockstep::env::kRestartCount);
      unsetenv(lockstep::env::kTorchelasticRestartCount);
      setenv(name, env.at(name).c_str(), 1);  // as lockstep-run (both) or torchrun (one) sets
      EXPECT_EQ(restart_count_from_env(), restart) << name;
    }
  }
  unsetenv(lockstep::env::kTorchelasticRestartCount);
  EXPECT_EQ(restart_count_from_env(), 0);
  setenv(lockstep::env::kRestartCount, "x1", 1);
  try {
    restart_count_from_env();
    ADD_FAILURE() << "expected ConfigError";
  } catch (const lockstep::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("LOCKSTEP_RESTART_COUNT='x1'"), std::string::npos);
  }
  unsetenv(lockstep::env::kRestartCount);
}

// ---------------------------------------------------------------------------------------
// Asynchronous saves (Checkpointer, checkpoint.mode): the files equal the synchronous
// save's byte for byte, the staging buffers are reused, a second save waits for the first,
// resume is bit-exact, a failed background write is reported.

// A small model with parameters, buffers (BatchNorm) and a child tree, its optimizer and
// the trainer's context for one process.
struct Rig {
  TrainConfig cfg;
  RunContext ctx;
  BatchPlan plan;
  torch::nn::Sequential net;
  std::unique_ptr<torch::optim::Optimizer> opt;

  Rig(const std::string& dir, const std::string& mode, const std::string& optimizer) {
    cfg.json = R"({"test": true})";
    cfg.checkpoint.dir = dir;
    cfg.checkpoint.mode = mode;
    cfg.checkpoint.keep = 3;
    cfg.optim.name = optimizer;
    cfg.optim.kahan_summation = true;
    cfg.optim.compensation_dtype = "bfloat16";
    ctx.config = &cfg;
    plan.steps_per_epoch = 10;
    plan.total_steps = 100;
    plan.per_step = 4;
    torch::manual_seed(3);
    net = torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16),
                                torch::nn::ReLU(), torch::nn::Linear(16, 4));
    opt = make_optimizer(cfg.optim, net->parameters());
  }
  // One optimizer step on inputs that depend on the step only; `before_update` runs
  // between backward and the update (the trainer's Checkpointer::before_update).
  void train(int64_t step, const std::function<void()>& before_update = {}) {
    torch::manual_seed(uint64_t(100 + step));
    const auto x = torch::randn({6, 8});
    opt->zero_grad();
    net->forward(x).pow(2).mean().backward();
    if (before_update) before_update();
    opt->step();
  }
  std::unique_ptr<Checkpointer> checkpointer() {
    return std::make_unique<Checkpointer>(cfg, ctx, plan, net.ptr(), *opt, nullptr);
  }
};

std::vector<std::string> files_of(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The largest absolute difference over the model's parameters and buffers.
double max_diff(torch::nn::Module& a, torch::nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  const auto ba = a.named_buffers(), bb = b.named_buffers();
  double d = 0;
  for (const auto& p : pa) d = std::max(d, (p.value() - pb[p.key()]).abs().max().item<double>());
  for (const auto& p : ba)
    d = std::max(d, (p.value().to(torch::kFloat64) - bb[p.key()].to(torch::kFloat64))
                        .abs()
                        .max()
                        .item<double>());
  return d;
}

class AsyncCheckpointTest : public CheckpointTest,
                            public ::testing::WithParamInterface<std::string> {};

// Every file of the async save equals the sync save's, meta.json included, for every
// optimizer the trainer has (AnyPrecisionAdamW with its Kahan compensation buffer).
TEST_P(AsyncCheckpointTest, FilesEqualTheSynchronousSave) {
  Rig rig(dir_ + "/sync", "sync", GetParam());
  for (int64_t s = 1; s <= 3; ++s) rig.train(s);
  rig.checkpointer()->save(3, 0.5);  // sync: committed on return
  rig.cfg.checkpoint.dir = dir_ + "/async";
  rig.cfg.checkpoint.mode = "async";
  {
    auto ck = rig.checkpointer();
    ck->save(3, 0.5);
    ck->finish();
  }
  const std::string a = dir_ + "/sync/step-00000003", b = dir_ + "/async/step-00000003";
  ASSERT_EQ(files_of(a), files_of(b));
  for (const auto& f : files_of(a)) {
    const std::string x = read_file((fs::path(a) / f).string()),
                      y = read_file((fs::path(b) / f).string());
    EXPECT_EQ(x.size(), y.size()) << f;
    EXPECT_TRUE(x == y) << f << " differs between the sync and the async save";
    std::cout << "  " << f << ": " << x.size() << " bytes, identical: " << (x == y) << "\n";
  }
  EXPECT_EQ(read_file(dir_ + "/async/LATEST"), "step-00000003\n");
}

// The staging copy beside the next step (set_copy_beside_step, as the trainer runs it):
// the next step's forward changes BatchNorm's running statistics and its update changes
// everything else, and the files still equal the synchronous save's of the state at save().
TEST_P(AsyncCheckpointTest, CopyBesideTheNextStepSavesTheStateAtSave) {
  Rig rig(dir_ + "/sync", "sync", GetParam());
  for (int64_t s = 1; s <= 3; ++s) rig.train(s);
  rig.checkpointer()->save(3, 0.5);
  rig.cfg.checkpoint.dir = dir_ + "/async";
  rig.cfg.checkpoint.mode = "async";
  rig.cfg.checkpoint.keep = 3;
  // The copy and the writer start 100 ms late: after the next step's forward.
  setenv(kTestCheckpointPauseMs, "100", 1);
  {
    auto ck = rig.checkpointer();
    ck->set_copy_beside_step(true);
    ck->save(3, 0.5);
    rig.train(4, [&] { ck->before_update(); });
    ck->finish();
  }
  unsetenv(kTestCheckpointPauseMs);
  const std::string a = dir_ + "/sync/step-00000003", b = dir_ + "/async/step-00000003";
  ASSERT_EQ(files_of(a), files_of(b));
  for (const auto& f : files_of(a))
    EXPECT_TRUE(read_file((fs::path(a) / f).string()) == read_file((fs::path(b) / f).string()))
        << f << " differs: the step after the save leaked into it";
}

// The second save copies into the buffers the first allocated (same addresses, same bytes).
TEST_P(AsyncCheckpointTest, StagingBuffersAreReused) {
  Rig rig(dir_, "async", GetParam());
  rig.train(1);
  auto ck = rig.checkpointer();
  ck->save(1, 0.5);
  const auto first = ck->staging().buffers();
  const int64_t bytes = ck->staging().bytes();
  rig.train(2);
  ck->save(2, 0.5);
  EXPECT_EQ(ck->staging().buffers(), first);
  EXPECT_EQ(ck->staging().bytes(), bytes);
  EXPECT_GT(bytes, 0);
  std::cout << "  " << first.size() << " staging buffers, " << bytes << " bytes, reused\n";
  ck->finish();
}

// Resuming from an async checkpoint restores the model and the optimizer exactly: the
// resumed run's next steps equal the uninterrupted run's (max difference 0).
TEST_P(AsyncCheckpointTest, ResumeIsBitExact) {
  Rig a(dir_, "async", GetParam());
  {
    auto ck = a.checkpointer();
    for (int64_t s = 1; s <= 3; ++s) {
      a.train(s);
      ck->after_step(s, 0.5);  // every_steps = 100: saves nothing
    }
    ck->save(3, 0.5);
    a.train(4);  // changes the live state while the save may still be in flight
    ck->finish();
  }
  a.train(5);
  Rig b(dir_, "async", GetParam());
  EXPECT_GT(max_diff(*a.net, *b.net), 0);
  EXPECT_EQ(b.checkpointer()->resume(), 3);
  for (int64_t s = 4; s <= 5; ++s) b.train(s);
  const double d = max_diff(*a.net, *b.net);
  std::cout << "  resumed at step 3, after 2 more steps: max |difference| " << d << "\n";
  EXPECT_EQ(d, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, AsyncCheckpointTest,
                         ::testing::Values("sgd", "adamw", "anyprecision_adamw"));

// A save while one is in flight waits for it and commits it first: with the writer held
// back (test-only pause), save(2) returns with step 1 committed; finish() commits step 2.
TEST_F(CheckpointTest, SecondSaveWaitsForTheFirst) {
  setenv(kTestCheckpointPauseMs, "200", 1);
  Rig rig(dir_, "async", "adamw");
  auto ck = rig.checkpointer();
  unsetenv(kTestCheckpointPauseMs);
  rig.train(1);
  ck->save(1, 0.5);
  rig.train(2);
  ck->save(2, 0.5);
  EXPECT_EQ(read_file(dir_ + "/LATEST"), "step-00000001\n");
  EXPECT_NO_THROW(CheckpointReader(step_dir(1)).read("model.pt"));
  EXPECT_FALSE(fs::exists(step_dir(2)));
  ck->finish();
  EXPECT_EQ(read_file(dir_ + "/LATEST"), "step-00000002\n");
  for (int64_t s : {1, 2})
    for (const char* f : {"model.pt", "optimizer.pt", "rng-rank-0.pt"})
      EXPECT_NO_THROW(CheckpointReader(step_dir(s)).read(f)) << s << " " << f;
}

// A background write that fails (a file where its directory belongs) is raised by
// finish(), naming the rank and the cause; the previous checkpoint stays the one LATEST
// names.
TEST_F(CheckpointTest, FailedBackgroundWriteIsReported) {
  Rig rig(dir_, "async", "adamw");
  auto ck = rig.checkpointer();
  rig.train(1);
  ck->save(1, 0.5);
  ck->finish();
  std::ofstream(dir_ + "/step-00000002.tmp") << "in the way";
  ck->save(2, 0.5);
  try {
    ck->finish();
    ADD_FAILURE() << "expected an Error";
  } catch (const lockstep::Error& e) {
    const std::string m = e.what();
    std::cout << "  " << m << "\n";
    EXPECT_NE(m.find("checkpoint of step 2: writing it failed on rank 0"), std::string::npos);
    EXPECT_NE(m.find("cannot create the checkpoint directory"), std::string::npos);
  }
  EXPECT_EQ(read_file(dir_ + "/LATEST"), "step-00000001\n");
  ck->finish();  // nothing in flight any more
}

}  // namespace
