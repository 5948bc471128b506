#include <ctsm/workload.h>

#include <ctsm/backtest_metrics.h>
#include <ctsm/events_stream.h>
#include <ctsm/loader.h>
#include <ctsm/model_export.h>

#include <lockstep/error.h>
#include <lockstep/train/atomic_file.h>
#include <lockstep/train/config.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <sstream>

namespace fs = std::filesystem;
using json = nlohmann::json;
using lockstep::train::RunContext;

namespace ctsm {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A training micro-batch as the trainer passes it around.
struct TrainBatch : lockstep::train::Batch {
  explicit TrainBatch(CtsmBatch b) : batch(std::move(b)) {}
  CtsmBatch batch;
};

class Batches : public lockstep::train::BatchStream {
 public:
  Batches(std::vector<std::string> shards, EventPart part, CtsmLoaderOptions o)
      : loader_(std::move(shards), part, o) {}
  void begin_epoch(int64_t epoch, int64_t skip_examples) override {
    loader_.begin_epoch(epoch, skip_examples);
  }
  std::unique_ptr<lockstep::train::Batch> next(int64_t n) override {
    return std::make_unique<TrainBatch>(loader_.next_batch(n));
  }

 private:
  CtsmLoader loader_;
};

// "backtest (days 300-365, 400 clients, 3000 items): auc ... (oracle ...), recall@5 ..."
std::string report_line(const CtsmConfig& c, const BacktestResult& r) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(4);
  os << "backtest (days " << c.data.cutoff_day << "-" << c.data.cutoff_day + c.data.horizon_days
     << ", " << r.clients << " clients, " << r.positives + r.negatives << " items): auc " << r.auc
     << " (oracle " << r.oracle_auc << "), recall@" << c.eval.k << " " << r.recall_at_k
     << " (oracle " << r.oracle_recall_at_k << "), logloss " << r.logloss;
  return os.str();
}

}  // namespace

void CtsmWorkload::validate_config(const std::string& source) {
  source_ = source;
  cfg_.validate(source);
}

void CtsmWorkload::prepare_data(const RunContext& ctx) {
  const DataConfig& d = cfg_.data;
  const auto gen_opt = cfg_.generator_options();
  const std::string stamp_path = d.dir + "/GENERATOR.txt";
  const std::string stamp = gen_opt.fingerprint() + "\n";
  int64_t need = 0;
  if (ctx.rank == 0) {  // one rank decides, so all agree even while files change
    need = !(fs::exists(stamp_path) && lockstep::train::read_file(stamp_path) == stamp);
    if (need && !d.generate)
      throw lockstep::ConfigError(source_ + ": data.dir " + d.dir +
                                  " has no event log matching [data] and data.generate = false");
    if (need && fs::exists(d.dir))
      for (const auto& e : fs::directory_iterator(d.dir))
        if (e.path().extension() == ".lse" || e.path().filename() == "GENERATOR.txt")
          fs::remove(e.path());
  }
  if (ctx.group) {
    auto t = torch::tensor({need}, torch::kInt64);
    ctx.group->broadcast(t)->wait();
    need = t.item<int64_t>();
  }
  if (need) {
    const double t0 = now_s();
    ctx.say("generating " + std::to_string(d.clients) + " clients x " + std::to_string(d.days) +
            " days into " + std::to_string(d.shards) + " shards in " + d.dir);
    EventGenerator(gen_opt).write_shards(d.dir, uint32_t(ctx.rank), uint32_t(ctx.world));
    ctx.barrier();
    if (ctx.rank == 0) lockstep::train::write_file_atomic(stamp_path, stamp);
    ctx.say("generated in " + std::to_string(now_s() - t0).substr(0, 5) + " s");
  }
  ctx.barrier();
  shards_ = EventStream::list_shards(d.dir);
}

// From the shard headers alone: every rank computes every part's size.
std::vector<int64_t> CtsmWorkload::examples_per_rank(const RunContext& ctx) {
  std::vector<int64_t> out;
  for (int r = 0; r < ctx.world; ++r) {
    int64_t n = 0;
    for (const auto& s : EventStream::plan(shards_, {r, ctx.world})) n += int64_t(s.records);
    out.push_back(n);
  }
  return out;
}

std::shared_ptr<torch::nn::Module> CtsmWorkload::build_model(const RunContext& ctx) {
  auto o = cfg_.model_options();
  o.checkpoint_layers = ctx.config != nullptr && ctx.config->memory.activation_checkpointing;
  model_ = Ctsm(o);
  return model_.ptr();
}

std::unique_ptr<lockstep::train::BatchStream> CtsmWorkload::train_batches(const RunContext& ctx) {
  CtsmLoaderOptions lo;
  lo.cutoff_s = cfg_.data.cutoff_day * 86400;
  lo.max_len = int(cfg_.data.max_len);
  lo.shuffle_buffer = cfg_.data.shuffle_buffer;
  lo.seed = uint64_t(ctx.config ? ctx.config->run.seed : 0);
  return std::make_unique<Batches>(shards_, EventPart{ctx.rank, ctx.world}, lo);
}

torch::Tensor CtsmWorkload::loss(const lockstep::train::Batch& batch) {
  const auto* b = dynamic_cast<const TrainBatch*>(&batch);
  LOCKSTEP_CHECK(b, "ctsm: loss() of a batch that is not the ctsm workload's");
  return CtsmImpl::loss(model_->forward(b->batch), b->batch);
}

lockstep::train::EvalResult CtsmWorkload::evaluate(const RunContext& ctx) {
  const DataConfig& d = cfg_.data;
  BacktestMetrics metrics(cfg_.eval.bins, cfg_.eval.k);
  EventStream stream(shards_, {ctx.rank, ctx.world});
  const int64_t cutoff = d.cutoff_day * 86400, horizon = (d.cutoff_day + d.horizon_days) * 86400;
  std::vector<CtsmExample> batch;
  auto flush = [&] {
    if (batch.empty()) return;
    auto b = collate(batch);
    metrics.add(model_->forward(b), b);  // the bare module: scoring needs no collectives
    batch.clear();
  };
  while (auto c = stream.next()) {
    auto ex = make_eval_example(*c, cutoff, horizon, int(d.max_len), int(d.max_candidates));
    bool any = false;
    for (const auto& p : ex.positions) any |= p.is_target;
    if (!any) continue;
    batch.push_back(std::move(ex));
    if (int64_t(batch.size()) == cfg_.eval.batch_size) flush();
  }
  flush();
  const BacktestResult r = metrics.reduce(ctx.group);
  lockstep::train::EvalResult out;
  out.scalars = {{"auc", r.auc}, {"recall_at_k", r.recall_at_k}, {"logloss", r.logloss}};
  out.metrics_json = json{
      {"auc", r.auc},
      {"recall_at_k", r.recall_at_k},
      {"k", cfg_.eval.k},
      {"logloss", r.logloss},
      {"oracle_auc", r.oracle_auc},
      {"oracle_recall_at_k", r.oracle_recall_at_k},
      {"positives", r.positives},
      {"negatives", r.negatives},
      {"clients",
       r.clients}}.dump();
  out.report = report_line(cfg_, r);
  return out;
}

lockstep::train::ExportResult CtsmWorkload::export_model(const lockstep::train::ExportInfo& info) {
  const DataConfig& d = cfg_.data;
  const json data_info = {{"dir", d.dir},
                          {"generator", cfg_.generator_options().fingerprint()},
                          {"train_days", {0, d.cutoff_day}},
                          {"eval_days", {d.cutoff_day, d.cutoff_day + d.horizon_days}}};
  ModelCard card;
  card.run_name = info.run_name;
  card.config_json = info.config_json;
  card.metrics_json = info.metrics_json;
  card.data_json = data_info.dump();
  card.gate_json = info.gate_json;
  card.steps = info.steps;
  card.world_size = info.world_size;
  lockstep::train::ExportResult out;
  out.card_path = ctsm::export_model(model_, card, info.dir);
  out.model_path = info.dir + "/ctsm.pt";
  return out;
}

void register_workload(lockstep::train::WorkloadRegistry& registry) {
  registry.add("ctsm", [] { return std::make_unique<CtsmWorkload>(); });
}

}  // namespace ctsm
