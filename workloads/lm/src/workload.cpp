#include <lm/workload.h>

#include <lm/batch_stream.h>
#include <lm/generate.h>
#include <lm/heldout.h>
#include <lm/model_export.h>
#include <lm/tokenizer.h>

#include <lockstep/data/data_error.h>
#include <lockstep/error.h>
#include <lockstep/train/config.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <exception>
#include <sstream>

using json = nlohmann::json;
using lockstep::train::RunContext;

namespace lm {
namespace {

// A training micro-batch as the trainer passes it around.
struct TrainBatch : lockstep::train::Batch {
  explicit TrainBatch(LmBatch b) : batch(std::move(b)) {}
  LmBatch batch;
};

class Batches : public lockstep::train::BatchStream {
 public:
  Batches(std::shared_ptr<const std::string> text, int64_t context, int rank, int world,
          uint64_t seed)
      : windows_(std::move(text), context, rank, world, seed) {}
  void begin_epoch(int64_t epoch, int64_t skip_examples) override {
    windows_.begin_epoch(epoch, skip_examples);
  }
  std::unique_ptr<lockstep::train::Batch> next(int64_t n) override {
    return std::make_unique<TrainBatch>(windows_.next(n));
  }

 private:
  WindowStream windows_;
};

// Sums `values` over the ranks (float64; in place).
void sum_over_ranks(const RunContext& ctx, std::vector<double>& values) {
  if (ctx.group == nullptr || ctx.world <= 1) return;
  auto t = torch::tensor(values, torch::kFloat64);
  ctx.group->allreduce(t)->wait();
  for (size_t i = 0; i < values.size(); ++i) values[i] = t[int64_t(i)].item<double>();
}

// Every rank learns whether all loaded the corpus; a rank that failed rethrows its own error,
// the others name how many failed (so no rank waits for one that has given up).
void agree_loaded(const RunContext& ctx, const std::exception_ptr& error) {
  std::vector<double> failed{error ? 1.0 : 0.0};
  sum_over_ranks(ctx, failed);
  if (error) std::rethrow_exception(error);
  if (failed[0] > 0)
    throw lockstep::Error(std::to_string(int(failed[0])) +
                          " rank(s) could not load the corpus; their errors are in their logs");
}

// All ranks must train on the same bytes: rank 0's fingerprint against everyone's.
void check_same_corpus(const RunContext& ctx, uint64_t fp, int64_t bytes) {
  if (ctx.group == nullptr || ctx.world <= 1) return;
  auto t = torch::tensor({int64_t(fp), bytes}, torch::kInt64);
  ctx.group->broadcast(t)->wait();
  std::vector<double> differ{
      (uint64_t(t[0].item<int64_t>()) != fp || t[1].item<int64_t>() != bytes) ? 1.0 : 0.0};
  sum_over_ranks(ctx, differ);
  if (differ[0] > 0)
    throw lockstep::data::DataError(lockstep::data::DataError::Kind::Mismatch, "",
                                    std::to_string(int(differ[0])) +
                                        " rank(s) loaded a corpus that differs from rank 0's (" +
                                        std::to_string(bytes) +
                                        " bytes here): every node needs the same data.corpus (or "
                                        "the same bible-kjv-text)");
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string kilobytes(int64_t n) { return fixed(double(n) / 1e3, 1) + " kB"; }

}  // namespace

void LmWorkload::validate_config(const std::string& source) {
  source_ = source;
  cfg_.validate(source);
}

lockstep::train::GateRule LmWorkload::gate_rule(const std::string& metric) const {
  lockstep::train::GateRule r;
  r.lower_is_better = true;
  // Perplexity over bytes lies in [1, 256] for any sensible model; bits per byte in [0, 8].
  r.min = metric == "perplexity" ? 1.0 : 0.0;
  r.max = metric == "perplexity" ? 256.0 : 8.0;
  return r;
}

void LmWorkload::prepare_data(const RunContext& ctx) {
  std::string text;
  std::exception_ptr error;
  try {
    text = load_corpus(cfg_.data.corpus);
  } catch (...) {
    error = std::current_exception();
  }
  agree_loaded(ctx, error);
  corpus_bytes_ = int64_t(text.size());
  corpus_fingerprint_ = fingerprint(text);
  check_same_corpus(ctx, corpus_fingerprint_, corpus_bytes_);
  CorpusSplit split;
  try {
    split = split_corpus(text, cfg_.split_options());
  } catch (const lockstep::InvalidArgument& e) {  // too few lines for data.block_lines
    throw lockstep::ConfigError(source_ + ": " + e.what());
  }
  blocks_ = int64_t(split.blocks.size());
  heldout_blocks_ = split.heldout_blocks;
  train_ = std::make_shared<const std::string>(std::move(split.train));
  heldout_ = std::make_shared<const std::string>(std::move(split.heldout));
  const std::string name = cfg_.data.corpus.empty() ? "the KJV (bible-kjv-text)" : cfg_.data.corpus;
  ctx.say("corpus: " + name + ", " + kilobytes(corpus_bytes_) + " in " + std::to_string(blocks_) +
          " blocks of " + std::to_string(cfg_.data.block_lines) +
          " lines: " + std::to_string(blocks_ - heldout_blocks_) + " train (" +
          kilobytes(int64_t(train_->size())) + "), " + std::to_string(heldout_blocks_) +
          " held out (" + kilobytes(int64_t(heldout_->size())) + ")");
  check_sizes(ctx);
}

// Enough text on each side for the model's context and the ranks.
void LmWorkload::check_sizes(const RunContext& ctx) const {
  const int64_t T = cfg_.model.context;
  if (int64_t(heldout_->size()) < T + 1)
    throw lockstep::ConfigError(
        source_ + ": the held-out text has " + std::to_string(heldout_->size()) +
        " bytes, fewer than one window (" + "model.context + 1 = " + std::to_string(T + 1) +
        "): raise data.heldout_fraction or data.block_lines, or lower "
        "model.context");
  if (WindowStream::windows_per_epoch(int64_t(train_->size()), T) < ctx.world)
    throw lockstep::ConfigError(source_ + ": the training text (" + std::to_string(train_->size()) +
                                " bytes) holds fewer windows of model.context + 1 bytes than the " +
                                std::to_string(ctx.world) + " ranks: use a longer corpus");
}

std::vector<int64_t> LmWorkload::examples_per_rank(const RunContext& ctx) {
  std::vector<int64_t> out;
  for (int r = 0; r < ctx.world; ++r)
    out.push_back(
        WindowStream::windows_of_rank(int64_t(train_->size()), cfg_.model.context, r, ctx.world));
  return out;
}

std::shared_ptr<torch::nn::Module> LmWorkload::build_model(const RunContext& ctx) {
  LmOptions o = cfg_.model_options();
  o.checkpoint = ctx.checkpoint_policy();  // [memory]
  model_ = Lm(o);
  return model_.ptr();
}

std::unique_ptr<lockstep::train::BatchStream> LmWorkload::train_batches(const RunContext& ctx) {
  const uint64_t seed = uint64_t(ctx.config ? ctx.config->run.seed : 0);
  return std::make_unique<Batches>(train_, cfg_.model.context, ctx.rank, ctx.world, seed);
}

torch::Tensor LmWorkload::loss(const lockstep::train::Batch& batch) {
  const auto* b = dynamic_cast<const TrainBatch*>(&batch);
  LOCKSTEP_CHECK(b, "lm: loss() of a batch that is not the lm workload's");
  return LmImpl::loss(model_->forward(b->batch.input), b->batch.target);
}

lockstep::train::EvalResult LmWorkload::evaluate(const RunContext& ctx) {
  HeldoutOptions ho;
  ho.batch_size = cfg_.eval.batch_size;
  ho.max_tokens = cfg_.eval.max_tokens;
  ho.rank = ctx.rank;
  ho.world = ctx.world;
  const HeldoutLoss mine = heldout_loss(*model_, *heldout_, ho);  // the bare module
  std::vector<double> sums{mine.nats, double(mine.tokens)};
  sum_over_ranks(ctx, sums);
  const double ce = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  const double ppl = std::exp(ce), bpb = ce / std::log(2.0);
  // Every rank generates the same sample (same parameters, same seed): the result stays
  // identical on all ranks, and none waits for rank 0's generation.
  const SampleOptions so = cfg_.sample_options();
  const std::string sample =
      so.tokens > 0 ? generate(*model_, cfg_.eval.sample_prompt, so) : std::string();
  lockstep::train::EvalResult out;
  out.scalars = {{"perplexity", ppl}, {"bits_per_byte", bpb}, {"cross_entropy", ce}};
  out.metrics_json = json{{"perplexity", ppl},
                          {"bits_per_byte", bpb},
                          {"cross_entropy", ce},
                          {"heldout_tokens", int64_t(sums[1])},
                          {"sample_prompt", printable(cfg_.eval.sample_prompt)},
                          {"sample_temperature", so.temperature},
                          {"sample_seed", so.seed},
                          {"sample", printable(sample)}}  // JSON holds UTF-8 only
                         .dump();
  out.report = "held-out (" + std::to_string(int64_t(sums[1])) + " bytes, " +
               std::to_string(heldout_blocks_) + " of " + std::to_string(blocks_) +
               " blocks): perplexity " + fixed(ppl, 4) + ", " + fixed(bpb, 4) + " bits/byte";
  if (so.tokens > 0)
    out.report += "\nsample (temperature " + fixed(so.temperature, 2) + ", seed " +
                  std::to_string(so.seed) + "):\n" + printable(cfg_.eval.sample_prompt + sample);
  return out;
}

std::string LmWorkload::data_json() const {
  char fp[24];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(corpus_fingerprint_));
  return json{
      {"corpus", cfg_.data.corpus.empty() ? std::string("kjv:") + kKjvDataFile : cfg_.data.corpus},
      {"bytes", corpus_bytes_},
      {"fnv1a64", fp},
      {"block_lines", cfg_.data.block_lines},
      {"heldout_fraction", cfg_.data.heldout_fraction},
      {"split_seed", cfg_.data.seed},
      {"blocks", blocks_},
      {"heldout_blocks", heldout_blocks_},
      {"train_bytes", int64_t(train_->size())},
      {"heldout_bytes", int64_t(heldout_->size())}}
      .dump();
}

lockstep::train::ExportResult LmWorkload::export_model(const lockstep::train::ExportInfo& info) {
  ModelCard card;
  card.run_name = info.run_name;
  card.config_json = info.config_json;
  card.metrics_json = info.metrics_json;
  card.data_json = data_json();
  card.gate_json = info.gate_json;
  card.steps = info.steps;
  card.world_size = info.world_size;
  lockstep::train::ExportResult out;
  out.card_path = lm::export_model(model_, card, info.dir);
  out.model_path = info.dir + "/lm.pt";
  return out;
}

void register_workload(lockstep::train::WorkloadRegistry& registry) {
  registry.add("lm", [] { return std::make_unique<LmWorkload>(); });
}

}  // namespace lm
