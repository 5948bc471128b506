#include <lockstep/train/trainer.h>

#include <lockstep/comm/init.h>
#include <lockstep/compress/ddp_hook.h>
#include <lockstep/data/events_generator.h>
#include <lockstep/data/events_stream.h>
#include <lockstep/ddp/ddp.h>
#include <lockstep/models/ctsm.h>
#include <lockstep/train/atomic_file.h>
#include <lockstep/train/backtest_metrics.h>
#include <lockstep/train/checkpoint_store.h>
#include <lockstep/train/ctsm_loader.h>
#include <lockstep/train/loss_log.h>
#include <lockstep/train/loss_plot.h>
#include <lockstep/train/lr_schedule.h>
#include <lockstep/train/model_export.h>
#include <lockstep/train/progress_bar.h>
#include <lockstep/train/tensorboard_writer.h>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace lockstep::train {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class T>
std::string to_bytes(const T& obj) {
  std::ostringstream os;
  torch::save(obj, os);
  return os.str();
}
template <class T>
void from_file(T& obj, const std::string& path) {
  std::istringstream is(read_file(path));
  torch::load(obj, is);
}

data::EventGeneratorOptions generator_options(const DataConfig& d) {
  data::EventGeneratorOptions g;
  g.seed = uint64_t(d.seed);
  g.num_clients = uint64_t(d.clients);
  g.num_items = uint32_t(d.items);
  g.num_shards = uint32_t(d.shards);
  g.days = int(d.days);
  g.latent_dim = int(d.latent_dim);
  g.num_styles = int(d.styles);
  g.style_spread = d.style_spread;
  g.items_per_shipment = int(d.items_per_shipment);
  g.mean_gap_days = d.mean_gap_days;
  g.drift_halflife_days = d.drift_halflife_days;
  g.affinity = d.affinity;
  g.recency = d.recency;
  g.noise = d.noise;
  g.base_logit = d.base_logit;
  g.stylist_noise = d.stylist_noise;
  g.feedback_prob = d.feedback_prob;
  return g;
}

}  // namespace

struct Trainer::Impl {
  TrainConfig cfg;
  TrainerOptions opt;
  std::shared_ptr<comm::ProcessGroup> group;
  int rank = 0, world = 1;
  std::vector<std::string> shards;

  // batch geometry
  int64_t accum = 1, steps_per_epoch = 0, total_steps = 0;
  double lr_scale = 1.0;

  models::Ctsm model{nullptr};
  std::unique_ptr<ddp::DistributedDataParallel<models::CtsmImpl>> ddp;
  std::unique_ptr<torch::optim::Optimizer> optimizer;

  // run statistics
  std::vector<double> epoch_times;
  double train_time = 0, exposed_comm = 0;
  int64_t bytes_sent = 0, sync_steps = 0, start_step = 0;
  double last_loss = 0;

  bool log_rank0() const { return rank == 0; }
  void say(const std::string& s) const {
    if (rank == 0) std::cout << "[lockstep-train] " << s << std::endl;
  }
  comm::ProcessGroup* pg() const { return group && world > 1 ? group.get() : nullptr; }
  void barrier() const {
    if (pg()) group->barrier()->wait();
  }

  void join_group() {
    const auto env = comm::LaunchEnv::from_environment();
    if (cfg.strategy.kind == "single" && env.world_size > 1)
      throw ConfigError(cfg.source + ": strategy.kind = \"single\" but the job has " +
                        std::to_string(env.world_size) + " ranks; use \"ddp\"");
    if (cfg.strategy.kind == "ddp") {
      comm::InitOptions io;
      io.backend = cfg.strategy.backend;
      group = comm::init(io);
      rank = group->rank();
      world = group->size();
    }
  }

  void ensure_data() {
    const auto gen_opt = generator_options(cfg.data);
    const std::string stamp_path = cfg.data.dir + "/GENERATOR.txt";
    const std::string stamp = gen_opt.fingerprint() + "\n";
    int64_t need = 0;
    if (rank == 0) {
      need = !(fs::exists(stamp_path) && read_file(stamp_path) == stamp);
      if (need && !cfg.data.generate)
        throw ConfigError(cfg.source + ": data.dir " + cfg.data.dir +
                          " has no event log matching [data] and data.generate = false");
      if (need && fs::exists(cfg.data.dir))
        for (const auto& e : fs::directory_iterator(cfg.data.dir))
          if (e.path().extension() == ".lse" || e.path().filename() == "GENERATOR.txt") fs::remove(e.path());
    }
    if (pg()) {
      auto t = torch::tensor({need}, torch::kInt64);
      group->broadcast(t)->wait();
      need = t.item<int64_t>();
    }
    if (need) {
      const double t0 = now_s();
      say("generating " + std::to_string(cfg.data.clients) + " clients x " + std::to_string(cfg.data.days) +
          " days into " + std::to_string(cfg.data.shards) + " shards in " + cfg.data.dir);
      data::EventGenerator(gen_opt).write_shards(cfg.data.dir, uint32_t(rank), uint32_t(world));
      barrier();
      if (rank == 0) write_file_atomic(stamp_path, stamp);
      say("generated in " + std::to_string(now_s() - t0).substr(0, 5) + " s");
    }
    barrier();
    shards = data::EventStream::list_shards(cfg.data.dir);
  }

  // Accumulation, lr scaling and steps per epoch; prints the effective batch.
  void plan_batches() {
    const auto& t = cfg.train;
    const int64_t ref_global = t.batch_size * t.grad_accum * t.reference_world_size;
    accum = t.grad_accum;
    std::string rule;
    if (t.keep_global_batch) {
      if (ref_global % (t.batch_size * world) != 0)
        throw ConfigError(cfg.source + ": train.keep_global_batch: global batch " + std::to_string(ref_global) +
                          " is not divisible by batch_size x world size = " + std::to_string(t.batch_size * world));
      accum = ref_global / (t.batch_size * world);
      rule = "global batch kept: accumulation " + std::to_string(accum) + ", lr unchanged";
    } else {
      const double ratio = double(world) / double(t.reference_world_size);
      lr_scale = cfg.optim.lr_scaling == "linear" ? ratio : cfg.optim.lr_scaling == "sqrt" ? std::sqrt(ratio) : 1.0;
      rule = "lr scaling '" + cfg.optim.lr_scaling + "' vs reference world " +
             std::to_string(t.reference_world_size) + ": x" + std::to_string(lr_scale).substr(0, 6);
    }
    // Every rank computes every part's size from the shard headers, so all agree on the
    // number of steps without a collective; the remainder of each part is dropped.
    int64_t min_part = INT64_MAX;
    for (int r = 0; r < world; ++r) {
      int64_t n = 0;
      for (const auto& s : data::EventStream::plan(shards, {r, world})) n += int64_t(s.records);
      min_part = std::min(min_part, n);
    }
    steps_per_epoch = min_part / (t.batch_size * accum);
    if (steps_per_epoch < 1)
      throw ConfigError(cfg.source + ": each rank has only " + std::to_string(min_part) +
                        " clients, fewer than one step (batch_size x accumulation = " +
                        std::to_string(t.batch_size * accum) + ")");
    total_steps = t.max_steps > 0 ? t.max_steps : t.epochs * steps_per_epoch;
    say("effective batch: " + std::to_string(t.batch_size) + " per rank x " + std::to_string(world) +
        " ranks x " + std::to_string(accum) + " accumulation = " + std::to_string(t.batch_size * world * accum) +
        " clients/step (" + rule + "; peak lr " + std::to_string(cfg.optim.lr * lr_scale) + ")");
    say(std::to_string(steps_per_epoch) + " steps/epoch, " + std::to_string(total_steps) + " steps");
  }

  void build_model() {
    torch::manual_seed(uint64_t(cfg.run.seed));
    models::CtsmOptions mo;
    mo.num_items = cfg.data.items;
    mo.d_model = cfg.model.d_model;
    mo.heads = cfg.model.heads;
    mo.layers = cfg.model.layers;
    mo.d_ff = cfg.model.d_ff;
    mo.dropout = cfg.model.dropout;
    model = models::Ctsm(mo);
    say("model: CTSM " + std::to_string(models::count_parameters(*model)) + " parameters");
  }

  void build_optimizer() {
    auto params = model->parameters();
    const auto& o = cfg.optim;
    if (o.name == "sgd")
      optimizer = std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
    else
      optimizer = std::make_unique<torch::optim::AdamW>(
          params,
          torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).weight_decay(o.weight_decay));
  }

  void wrap_ddp() {
    if (cfg.strategy.kind != "ddp") return;
    DDPOptions d;
    d.broadcast_buffers = false;  // CTSM has no buffers; saves a collective per forward
    ddp = std::make_unique<ddp::DistributedDataParallel<models::CtsmImpl>>(model.ptr(), group, d);
    if (cfg.strategy.comm_hook == "bf16") ddp->register_comm_hook(ddp::hooks::bf16_compress_hook());
    if (cfg.strategy.comm_hook == "qsgd") {
      compress::QsgdOptions q;
      q.bits = int(cfg.strategy.qsgd_bits);
      q.bucket_size = cfg.strategy.qsgd_bucket_size;
      q.seed = uint64_t(cfg.run.seed);
      ddp->register_comm_hook(compress::qsgd(q));
    }
  }

  struct Position {
    int64_t step = 0;
  };

  // Loads the newest checkpoint into model/optimizer/RNG; returns the step to start at.
  int64_t resume(CheckpointStore& store) {
    auto dir = store.latest();
    if (!dir) {
      say("--resume: no checkpoint in " + store.dir() + "; starting from step 0");
      return 0;
    }
    const json meta = json::parse(read_file(*dir + "/meta.json"));
    if (meta.at("world_size").get<int>() != world)
      throw ConfigError(*dir + ": written by " + std::to_string(meta.at("world_size").get<int>()) +
                        " ranks; resuming on " + std::to_string(world) +
                        " is not supported (each rank's data position depends on the world size)");
    if (meta.at("total_steps").get<int64_t>() != total_steps)
      throw ConfigError(*dir + ": the run had " + std::to_string(meta.at("total_steps").get<int64_t>()) +
                        " total steps, this configuration has " + std::to_string(total_steps));
    from_file(model, *dir + "/model.pt");
    from_file(*optimizer, *dir + "/optimizer.pt");
    torch::Tensor rng;
    from_file(rng, *dir + "/rng-rank-" + std::to_string(rank) + ".pt");
    auto gen = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(rng);
    }
    const int64_t step = meta.at("step");
    say("resumed from " + *dir + " at step " + std::to_string(step));
    return step;
  }

  void save_checkpoint(CheckpointStore& store, int64_t step) {
    json meta = {{"format", "lockstep-checkpoint"},
                 {"version", 1},
                 {"step", step},
                 {"epoch", step / steps_per_epoch},
                 {"examples_in_epoch", (step % steps_per_epoch) * cfg.train.batch_size * accum},
                 {"total_steps", total_steps},
                 {"world_size", world},
                 {"loss", last_loss},
                 {"config", json::parse(cfg.json)}};
    auto gen = at::detail::getDefaultCPUGenerator();
    torch::Tensor rng;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      rng = gen.get_state();
    }
    std::map<std::string, std::string> shared;
    if (rank == 0)
      shared = {{"model.pt", to_bytes(model)}, {"optimizer.pt", to_bytes(*optimizer)}, {"meta.json", meta.dump(2)}};
    store.save(step, shared, {{"rng-rank-" + std::to_string(rank) + ".pt", to_bytes(rng)}});
  }

  torch::Tensor forward(const models::CtsmBatch& b) { return ddp ? ddp->forward(b) : model->forward(b); }

  // One optimizer step over `accum` micro-batches; returns the mean loss.
  double train_step(CtsmLoader& loader, double lr) {
    for (auto& g : optimizer->param_groups()) g.options().set_lr(lr);
    optimizer->zero_grad();
    double loss_sum = 0;
    for (int64_t m = 0; m < accum; ++m) {
      const auto batch = loader.next_batch(cfg.train.batch_size);
      auto run = [&] {
        auto loss = models::CtsmImpl::loss(forward(batch), batch) / double(accum);
        loss.backward();
        loss_sum += loss.item<double>();
      };
      if (ddp && m + 1 < accum) {
        auto guard = ddp->no_sync();  // gradients accumulate locally until the last micro-step
        run();
      } else {
        run();
      }
    }
    if (cfg.optim.grad_clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.optim.grad_clip);
    optimizer->step();
    if (ddp) {
      const auto& s = ddp->last_step_stats();
      exposed_comm += s.exposed_comm_s;
      bytes_sent += s.bytes_sent;
      ++sync_steps;
    }
    return loss_sum;
  }

  BacktestResult backtest() {
    torch::NoGradGuard ng;
    model->eval();
    BacktestMetrics metrics(cfg.eval.bins, cfg.eval.k);
    data::EventStream stream(shards, {rank, world});
    const int64_t cutoff = cfg.data.cutoff_day * 86400;
    const int64_t horizon = (cfg.data.cutoff_day + cfg.data.horizon_days) * 86400;
    std::vector<models::CtsmExample> batch;
    auto flush = [&] {
      if (batch.empty()) return;
      auto b = models::collate(batch);
      metrics.add(model->forward(b), b);  // the bare module: scoring needs no collectives
      batch.clear();
    };
    while (auto c = stream.next()) {
      auto ex = models::make_eval_example(*c, cutoff, horizon, int(cfg.data.max_len), int(cfg.data.max_candidates));
      bool any = false;
      for (const auto& p : ex.positions) any |= p.is_target;
      if (!any) continue;
      batch.push_back(std::move(ex));
      if (int64_t(batch.size()) == cfg.eval.batch_size) flush();
    }
    flush();
    model->train();
    return metrics.reduce(pg());
  }

  int run();
};

int Trainer::Impl::run() {
  const double t_start = now_s();
  torch::set_num_threads(int(cfg.train.threads));
  join_group();
  say("config " + cfg.source + ", " + std::to_string(world) + " rank(s), strategy " + cfg.strategy.kind +
      (group ? " (" + group->backend_name() + ")" : "") + ", comm hook " + cfg.strategy.comm_hook);
  ensure_data();
  if (opt.generate_only) return kExitOk;
  plan_batches();
  build_model();
  build_optimizer();
  CheckpointStore store(cfg.checkpoint.dir, pg(), cfg.checkpoint.keep);
  start_step = opt.resume ? resume(store) : 0;
  wrap_ddp();  // after loading: DDP broadcasts rank 0's (identical) parameters

  fs::create_directories(cfg.run.out_dir + "/metrics");
  LossLog loss_log(cfg.run.out_dir + "/metrics/loss-rank-" + std::to_string(rank) + ".csv", start_step);
  std::unique_ptr<TensorBoardWriter> tb;
  if (rank == 0 && cfg.log.tensorboard)
    tb = std::make_unique<TensorBoardWriter>(cfg.run.out_dir + "/tb", "rank0");

  CtsmLoaderOptions lo;
  lo.cutoff_s = cfg.data.cutoff_day * 86400;
  lo.max_len = int(cfg.data.max_len);
  lo.shuffle_buffer = cfg.data.shuffle_buffer;
  lo.seed = uint64_t(cfg.run.seed);
  CtsmLoader loader(shards, {rank, world}, lo);
  LrSchedule schedule(cfg.optim.lr * lr_scale, cfg.schedule.warmup_steps, total_steps, cfg.schedule.min_lr_ratio);
  ProgressBar bar(total_steps, start_step, rank == 0 && cfg.log.progress);
  const int64_t per_step = cfg.train.batch_size * accum;

  model->train();
  int64_t step = start_step, epoch = -1;
  double epoch_time = 0;
  bool stopped = false;
  while (step < total_steps) {
    const int64_t e = step / steps_per_epoch;
    if (e != epoch) {
      epoch = e;
      loader.begin_epoch(e, (step - e * steps_per_epoch) * per_step);
    }
    const double lr = schedule.lr(step);
    const double t0 = now_s();
    last_loss = train_step(loader, lr);
    const double dt = now_s() - t0;
    epoch_time += dt;
    train_time += dt;
    ++step;
    if (step % steps_per_epoch == 0) {  // an epoch ended; report it only if it ran whole here
      if (step - steps_per_epoch >= start_step) epoch_times.push_back(epoch_time);
      epoch_time = 0;
    }
    loss_log.append(step, epoch, last_loss, lr, dt);
    if (tb && (step % cfg.log.every_steps == 0 || step == total_steps)) {
      tb->add_scalar("train/loss", last_loss, step);
      tb->add_scalar("train/lr", lr, step);
      tb->add_scalar("train/samples_per_s", double(per_step * world) / dt, step);
    }
    char note[64];
    std::snprintf(note, sizeof note, "loss %.4f", last_loss);
    bar.update(step, note);
    const bool periodic = cfg.checkpoint.every_steps > 0 && step % cfg.checkpoint.every_steps == 0;
    const bool stop_now = cfg.train.stop_after_steps > 0 && step == cfg.train.stop_after_steps;
    if (periodic || stop_now || step == total_steps) save_checkpoint(store, step);
    if (stop_now && step < total_steps) {
      stopped = true;
      break;
    }
  }
  bar.finish();
  if (stopped) {
    say("stopped after step " + std::to_string(step) + " (train.stop_after_steps); continue with --resume");
    return kExitOk;
  }

  const double t_eval = now_s();
  const BacktestResult r = backtest();
  const double eval_s = now_s() - t_eval;
  const double value = r.value(cfg.eval.metric);
  const bool passed = value >= cfg.eval.threshold;

  int64_t param_crc = 0;
  {
    uint32_t c = 0;
    for (const auto& p : model->parameters()) {
      auto t = p.detach().contiguous();
      c = data::crc32(t.data_ptr(), size_t(t.numel() * t.element_size()), c);
    }
    param_crc = c;
  }
  // Exposed communication share, averaged over ranks (each rank waits differently).
  double comm_share = train_time > 0 ? exposed_comm / train_time : 0;
  if (pg()) {
    auto t = torch::tensor({comm_share}, torch::kFloat64);
    group->allreduce(t)->wait();
    comm_share = t.item<double>() / world;
  }
  const int64_t steps_run = step - start_step;
  const double samples_per_s = train_time > 0 ? double(steps_run * per_step * world) / train_time : 0;

  if (rank == 0) {
    json metrics = {{"auc", r.auc},
                    {"recall_at_k", r.recall_at_k},
                    {"k", cfg.eval.k},
                    {"logloss", r.logloss},
                    {"oracle_auc", r.oracle_auc},
                    {"oracle_recall_at_k", r.oracle_recall_at_k},
                    {"positives", r.positives},
                    {"negatives", r.negatives},
                    {"clients", r.clients}};
    json gate = {{"metric", cfg.eval.metric}, {"threshold", cfg.eval.threshold}, {"value", value}, {"passed", passed}};
    json data_info = {{"dir", cfg.data.dir},
                      {"generator", generator_options(cfg.data).fingerprint()},
                      {"train_days", {0, cfg.data.cutoff_day}},
                      {"eval_days", {cfg.data.cutoff_day, cfg.data.cutoff_day + cfg.data.horizon_days}}};
    write_file_atomic(cfg.run.out_dir + "/eval.json", json{{"metrics", metrics}, {"gate", gate}}.dump(2) + "\n");
    if (tb) {
      tb->add_scalar("eval/auc", r.auc, step);
      tb->add_scalar("eval/recall_at_k", r.recall_at_k, step);
      tb->add_scalar("eval/logloss", r.logloss, step);
    }
    std::string card_path;
    if (passed) {
      ModelCard card;
      card.run_name = cfg.run.name;
      card.config_json = cfg.json;
      card.metrics_json = metrics.dump();
      card.data_json = data_info.dump();
      card.gate_json = gate.dump();
      card.steps = step;
      card.world_size = world;
      card_path = export_model(model, card, cfg.run.out_dir + "/export");
    }
    const std::string png = cfg.run.out_dir + "/loss.png";
    const bool plotted = cfg.log.plot && plot_loss_curves(cfg.run.out_dir + "/metrics", world, png);
    double mean_epoch = 0;
    for (double t : epoch_times) mean_epoch += t / double(epoch_times.size());
    json summary = {{"run", cfg.run.name},
                    {"world_size", world},
                    {"backend", group ? group->backend_name() : "none"},
                    {"comm_hook", cfg.strategy.comm_hook},
                    {"steps", step},
                    {"steps_this_run", steps_run},
                    {"steps_per_epoch", steps_per_epoch},
                    {"global_batch", per_step * world},
                    {"epoch_times_s", epoch_times},
                    {"mean_epoch_time_s", mean_epoch},
                    {"train_time_s", train_time},
                    {"eval_time_s", eval_s},
                    {"wall_time_s", now_s() - t_start},
                    {"samples_per_s", samples_per_s},
                    {"comm_share", comm_share},
                    {"bytes_per_step", sync_steps ? bytes_sent / sync_steps : 0},
                    {"final_loss", last_loss},
                    {"param_crc32", param_crc},
                    {"metrics", metrics},
                    {"gate", gate},
                    {"paths",
                     {{"model", passed ? cfg.run.out_dir + "/export/ctsm.pt" : ""},
                      {"model_card", card_path},
                      {"loss_csv", cfg.run.out_dir + "/metrics"},
                      {"tensorboard", tb ? tb->path() : ""},
                      {"loss_png", plotted ? png : ""}}}};
    write_file_atomic(cfg.run.out_dir + "/summary.json", summary.dump(2) + "\n");
    std::ostringstream os;
    os.setf(std::ios::fixed);
    os.precision(4);
    os << "summary: " << step << " steps, " << epoch_times.size() << " full epochs, mean " << mean_epoch
       << " s/epoch, " << samples_per_s << " samples/s, exposed comm " << 100 * comm_share << "% of step time\n"
       << "  backtest (days " << cfg.data.cutoff_day << "-" << cfg.data.cutoff_day + cfg.data.horizon_days
       << ", " << r.clients << " clients, " << r.positives + r.negatives << " items): auc " << r.auc
       << " (oracle " << r.oracle_auc << "), recall@" << cfg.eval.k << " " << r.recall_at_k << " (oracle "
       << r.oracle_recall_at_k << "), logloss " << r.logloss << "\n"
       << "  metrics: " << cfg.run.out_dir << "/summary.json, eval.json, metrics/loss-rank-*.csv"
       << (tb ? ", " + tb->path() : "") << (plotted ? "\n  loss curve: " + png : "");
    say(os.str());
    if (passed) {
      say("quality gate passed: " + cfg.eval.metric + " " + std::to_string(value) + " >= " +
          std::to_string(cfg.eval.threshold) + "\n  model: " + cfg.run.out_dir + "/export/ctsm.pt\n  card:  " +
          card_path);
    } else {
      std::cerr << "[lockstep-train] quality gate FAILED: " << cfg.eval.metric << " " << value << " < threshold "
                << cfg.eval.threshold << " (missed by " << cfg.eval.threshold - value << "); model not exported"
                << std::endl;
    }
  }
  barrier();
  return passed ? kExitOk : kExitGateFailed;
}

Trainer::Trainer(TrainConfig config, TrainerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = std::move(config);
  impl_->opt = options;
}
Trainer::~Trainer() = default;
int Trainer::run() { return impl_->run(); }

}  // namespace lockstep::train
