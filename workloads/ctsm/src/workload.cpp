#include <ctsm/workload.h>

#include <ctsm/backtest_metrics.h>
#include <ctsm/events_stream.h>
#include <ctsm/loader.h>
#include <ctsm/model_export.h>

#include <lockstep/error.h>
#include <lockstep/train/atomic_file.h>
#include <lockstep/train/config.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
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

namespace {

// Above this estimated size, generating the event log needs lockstep-train --yes.
constexpr double kConfirmAboveBytes = 1e9;

// Rough size and single-rank time of the event log [data] describes: each client gets about
// days / mean_gap_days shipments of items_per_shipment item events (~20 bytes each with
// the feedback records) at ~1.2 us per item event (both measured on configs/ctsm-tiny.toml
// scaled to 20k clients: 31 MB in 1.8 s on one core).
struct GenerateEstimate {
  double bytes = 0;
  double seconds = 0;
};
GenerateEstimate estimate(const DataConfig& d, int world) {
  const double item_events =
      double(d.clients) * (double(d.days) / d.mean_gap_days) * double(d.items_per_shipment);
  const int writers = int(std::min<int64_t>(world, d.shards));  // ranks that write shards
  return {item_events * 20.0 + 64.0 * double(d.shards), item_events * 1.2e-6 / writers};
}

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.1f GB", b / 1e9);
  else
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  return buf;
}

std::string human_seconds(double s) {
  char buf[32];
  if (s >= 120)
    std::snprintf(buf, sizeof buf, "%.0f min", s / 60);
  else
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

}  // namespace

// The shard files [data] describes that are not in data.dir (in shard order).
std::vector<std::string> CtsmWorkload::missing_shards() const {
  const DataConfig& d = cfg_.data;
  std::vector<std::string> out;
  for (int64_t s = 0; s < d.shards; ++s) {
    const std::string p = d.dir + "/" + shard_file_name(uint32_t(s), uint32_t(d.shards));
    if (!fs::exists(p)) out.push_back(p);
  }
  return out;
}

// Whether the event log must be generated (rank 0 decides); throws when it may not be.
bool CtsmWorkload::need_generate(const RunContext& ctx) const {
  const DataConfig& d = cfg_.data;
  const std::string stamp_path = d.dir + "/GENERATOR.txt";
  const std::string stamp = cfg_.generator_options().fingerprint() + "\n";
  const bool stamped = fs::exists(stamp_path) && lockstep::train::read_file(stamp_path) == stamp;
  const std::vector<std::string> missing = stamped ? missing_shards() : std::vector<std::string>{};
  const std::string make = "lockstep-train " + source_ + " --generate-only" +
                           (d.generate ? "" : " --set data.generate=true") +
                           " (with this run's --set options)";
  if (!missing.empty() && !d.generate)
    throw lockstep::ConfigError(missing.front() + ": missing shard of the event log in data.dir (" +
                                std::to_string(missing.size()) + " of " + std::to_string(d.shards) +
                                " missing); create it with: " + make);
  if (!stamped && !d.generate)
    throw lockstep::ConfigError(source_ + ": data.dir " + d.dir +
                                " has no event log matching [data] and data.generate = false; "
                                "create it with: " +
                                make);
  if (!missing.empty())
    ctx.say("warning: " + missing.front() + " is missing (" + std::to_string(missing.size()) +
            " of " + std::to_string(d.shards) + " shards); generating the event log again");
  const bool need = !stamped || !missing.empty();
  if (!need) return false;
  const GenerateEstimate e = estimate(d, ctx.world);
  const bool yes = ctx.config && ctx.config->run.assume_yes;
  if (e.bytes > kConfirmAboveBytes && !yes)
    throw lockstep::ConfigError(
        source_ + ": [data] asks for an event log of about " + human_bytes(e.bytes) + " (" +
        std::to_string(d.clients) + " clients x " + std::to_string(d.days) + " days), about " +
        human_seconds(e.seconds) + " to generate; above " + human_bytes(kConfirmAboveBytes) +
        " lockstep-train wants --yes to go ahead (or lower data.clients)");
  return true;
}

void CtsmWorkload::prepare_data(const RunContext& ctx) {
  const DataConfig& d = cfg_.data;
  const std::string stamp_path = d.dir + "/GENERATOR.txt";
  int64_t need = 0;
  if (ctx.rank == 0) {  // one rank decides, so all agree even while files change
    need = need_generate(ctx);
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
    const GenerateEstimate e = estimate(d, ctx.world);
    ctx.say("generating " + std::to_string(d.clients) + " clients x " + std::to_string(d.days) +
            " days into " + std::to_string(d.shards) + " shards in " + d.dir + ": about " +
            human_bytes(e.bytes) + ", about " + human_seconds(e.seconds));
    EventGenerator(cfg_.generator_options())
        .write_shards(d.dir, uint32_t(ctx.rank), uint32_t(ctx.world));
    ctx.barrier();
    if (ctx.rank == 0)
      lockstep::train::write_file_atomic(stamp_path, cfg_.generator_options().fingerprint() + "\n");
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
  o.checkpoint = ctx.checkpoint_policy();  // [memory]
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
