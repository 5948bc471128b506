// A user's own workload plugs into the generic trainer: a tiny line fit, registered
// under its own name, trains, evaluates, passes its gate, exports, writes every output,
// and a run stopped and resumed follows the uninterrupted one bit for bit.
#include <lockstep/train/config.h>
#include <lockstep/train/config_schema.h>
#include <lockstep/train/trainer.h>
#include <lockstep/train/workload.h>

#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

namespace fs = std::filesystem;
using namespace lockstep::train;

namespace {

struct XYBatch : Batch {
  torch::Tensor x, y;
};

// Every rank holds the examples i with i % world == rank, visited in an order that is a
// pure function of the epoch.
class XYStream : public BatchStream {
 public:
  XYStream(torch::Tensor x, torch::Tensor y) : x_(std::move(x)), y_(std::move(y)) {}
  void begin_epoch(int64_t epoch, int64_t skip) override {
    order_.resize(size_t(x_.size(0)));
    std::iota(order_.begin(), order_.end(), 0);
    std::mt19937_64 rng(uint64_t(epoch) + 11);
    for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng() % i]);
    pos_ = size_t(skip);
  }
  std::unique_ptr<Batch> next(int64_t n) override {
    std::vector<int64_t> idx;
    for (; int64_t(idx.size()) < n && pos_ < order_.size(); ++pos_) idx.push_back(order_[pos_]);
    auto b = std::make_unique<XYBatch>();
    const auto i = torch::tensor(idx, torch::kInt64);
    b->x = x_.index_select(0, i);
    b->y = y_.index_select(0, i);
    return b;
  }

 private:
  torch::Tensor x_, y_;
  std::vector<int64_t> order_;
  size_t pos_ = 0;
};

// y = 3x - 1 + noise, fitted by one linear layer; gate metric r2.
class LineWorkload : public Workload {
 public:
  void declare_config(ConfigSchema& s) override {
    s.i64("line.examples", examples_, 8);
    s.f64("line.noise", noise_, 0);
  }
  std::vector<std::string> gate_metrics() const override { return {"r2"}; }
  void prepare_data(const RunContext& ctx) override {
    std::mt19937 rng(5);
    std::normal_distribution<float> n(0, 1);
    std::vector<float> xs, ys;
    for (int64_t i = 0; i < examples_; ++i) {
      const float x = n(rng), e = n(rng);
      if (i % ctx.world != ctx.rank) continue;
      xs.push_back(x);
      ys.push_back(3 * x - 1 + float(noise_) * e);
    }
    x_ = torch::tensor(xs).unsqueeze(1);
    y_ = torch::tensor(ys).unsqueeze(1);
  }
  std::vector<int64_t> examples_per_rank(const RunContext& ctx) override {
    std::vector<int64_t> out;
    out.reserve(size_t(ctx.world));
    for (int r = 0; r < ctx.world; ++r) out.push_back((examples_ - r + ctx.world - 1) / ctx.world);
    return out;
  }
  std::shared_ptr<torch::nn::Module> build_model(const RunContext&) override {
    model_ = torch::nn::Linear(1, 1);
    return model_.ptr();
  }
  std::string model_name() const override { return "line"; }
  std::unique_ptr<BatchStream> train_batches(const RunContext&) override {
    return std::make_unique<XYStream>(x_, y_);
  }
  torch::Tensor loss(const Batch& batch) override {
    const auto& b = dynamic_cast<const XYBatch&>(batch);
    return torch::mse_loss(model_->forward(b.x), b.y);
  }
  EvalResult evaluate(const RunContext&) override {
    const double mse = torch::mse_loss(model_->forward(x_), y_).item<double>();
    const double r2 = 1 - mse / y_.var(/*unbiased=*/false).item<double>();
    EvalResult r;
    r.scalars = {{"r2", r2}, {"mse", mse}};
    r.metrics_json = "{\"r2\": " + std::to_string(r2) + ", \"mse\": " + std::to_string(mse) + "}";
    r.report = "line fit: r2 " + std::to_string(r2);
    return r;
  }
  ExportResult export_model(const ExportInfo& info) override {
    fs::create_directories(info.dir);
    torch::save(model_, info.dir + "/line.pt");
    std::ofstream(info.dir + "/card.json")
        << "{\"metrics\": " << info.metrics_json << ", \"gate\": " << info.gate_json
        << ", \"steps\": " << info.steps << "}\n";
    return {info.dir + "/line.pt", info.dir + "/card.json"};
  }

 private:
  int64_t examples_ = 200;
  double noise_ = 0.1;
  torch::Tensor x_, y_;
  torch::nn::Linear model_{nullptr};
};

const char* kConfig = R"([run]
workload = "line"
seed = 3

[line]
examples = 200

[optim]
name = "sgd"
lr = 0.05
momentum = 0.9

[schedule]
warmup_steps = 2

[train]
epochs = 4
batch_size = 16

[strategy]
kind = "single"

[eval]
threshold = 0.9

[checkpoint]
every_steps = 5

[log]
progress = false
every_steps = 2
)";

int run(const std::string& out, std::vector<std::string> extra, bool resume = false) {
  WorkloadRegistry registry;
  registry.add("line", [] { return std::make_unique<LineWorkload>(); });
  extra.push_back("run.out_dir=" + out);
  TrainerOptions opt;
  opt.resume = resume;
  return Trainer(parse_config(kConfig, "line.toml", registry, extra), opt).run();
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// step,epoch,loss,lr of every row (the step time differs between runs).
std::string losses(const fs::path& csv) {
  std::istringstream in(read(csv));
  std::string out, line;
  while (std::getline(in, line)) out += line.substr(0, line.rfind(',')) + "\n";
  return out;
}

TEST(TrainWorkload, OwnWorkloadTrainsGatesAndExports) {
  const fs::path d = fs::temp_directory_path() / ("lockstep_line_" + std::to_string(::getpid()));
  fs::remove_all(d);
  ASSERT_EQ(run((d / "full").string(), {}), kExitOk);
  for (const char* f : {"eval.json", "summary.json", "loss.png", "metrics/loss-rank-0.csv",
                        "export/line.pt", "export/card.json", "checkpoints/LATEST"})
    EXPECT_TRUE(fs::exists(d / "full" / f)) << f;
  EXPECT_FALSE(fs::is_empty(d / "full" / "tb"));
  const std::string summary = read(d / "full" / "summary.json");
  EXPECT_NE(summary.find("\"steps\": 48"), std::string::npos) << summary;  // 4 epochs x 200/16
  EXPECT_NE(read(d / "full" / "eval.json").find("\"metric\": \"r2\""), std::string::npos);

  // Stopped after step 7 (last checkpoint: step 7) and resumed: the same curve.
  ASSERT_EQ(run((d / "part").string(), {"train.stop_after_steps=7"}), kExitOk);
  EXPECT_FALSE(fs::exists(d / "part" / "summary.json"));
  ASSERT_EQ(run((d / "part").string(), {}, /*resume=*/true), kExitOk);
  EXPECT_EQ(losses(d / "full" / "metrics/loss-rank-0.csv"),
            losses(d / "part" / "metrics/loss-rank-0.csv"));

  // A gate the model cannot clear: exit code 3 and nothing exported.
  EXPECT_EQ(run((d / "miss").string(), {"eval.threshold=1.0", "train.max_steps=2"}),
            kExitGateFailed);
  EXPECT_FALSE(fs::exists(d / "miss" / "export"));
  fs::remove_all(d);
}

// strategy.kind = "fsdp" on one rank: the model without fsdp::wrap()ed layers is one root
// unit; evaluation and export read its parameters directly (gathered for them), the
// checkpoints are sharded and resume bit for bit, and a checkpoint of another kind is
// refused by name.
TEST(TrainWorkload, FsdpTrainsExportsAndResumes) {
  const fs::path d =
      fs::temp_directory_path() / ("lockstep_line_fsdp_" + std::to_string(::getpid()));
  fs::remove_all(d);
  const std::vector<std::string> fsdp = {"strategy.kind=fsdp"};
  ASSERT_EQ(run((d / "full").string(), fsdp), kExitOk);
  EXPECT_TRUE(fs::exists(d / "full/checkpoints/step-00000048/fsdp-shard-00000.pt"));
  EXPECT_FALSE(fs::exists(d / "full/checkpoints/step-00000048/model.pt"));
  // The export loads into a plain module and holds what a single process trains.
  ASSERT_EQ(run((d / "single").string(), {}), kExitOk);
  torch::nn::Linear plain(1, 1), single(1, 1);
  torch::load(plain, (d / "full/export/line.pt").string());
  torch::load(single, (d / "single/export/line.pt").string());
  EXPECT_NEAR(plain->weight.item<double>(), single->weight.item<double>(), 1e-5);
  EXPECT_NEAR(plain->bias.item<double>(), single->bias.item<double>(), 1e-5);

  std::vector<std::string> stop = fsdp;
  stop.emplace_back("train.stop_after_steps=7");
  ASSERT_EQ(run((d / "part").string(), stop), kExitOk);
  ASSERT_EQ(run((d / "part").string(), fsdp, /*resume=*/true), kExitOk);
  EXPECT_EQ(losses(d / "full/metrics/loss-rank-0.csv"), losses(d / "part/metrics/loss-rank-0.csv"));
  const auto crc = [](const fs::path& summary) {
    const std::string s = read(summary);
    return s.substr(s.find("\"param_crc32\""), 30);
  };
  EXPECT_EQ(crc(d / "full/summary.json"), crc(d / "part/summary.json"));

  try {
    run((d / "part").string(), {"strategy.kind=single"}, /*resume=*/true);
    ADD_FAILURE() << "resumed an FSDP checkpoint without FSDP";
  } catch (const lockstep::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("written with strategy.kind = \"fsdp\""),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(d);
}

}  // namespace
