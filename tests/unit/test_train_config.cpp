// Schema errors name the key and the file line; overrides go through the same schema;
// a workload's own keys are checked by the same code and read the same way.
#include <lockstep/parallel/fsdp/options.h>
#include <lockstep/train/config.h>
#include <lockstep/train/config_schema.h>

#include <gtest/gtest.h>

using namespace lockstep::train;

namespace {

// A workload with one section of its own and one key in the shared [eval] section.
class ToyConfigWorkload : public Workload {
 public:
  int64_t size = 10;
  double scale = 1.0;
  int64_t eval_repeats = 1;
  std::string validated_source;

  void declare_config(ConfigSchema& s) override {
    s.i64("toy.size", size, 1, 1000);
    s.f64("toy.scale", scale, 0);
    s.i64("eval.repeats", eval_repeats, 1);
  }
  void validate_config(const std::string& source) override {
    validated_source = source;
    if (size == 13) throw lockstep::ConfigError(source + ": toy.size must not be 13");
  }
  std::vector<std::string> gate_metrics() const override { return {"accuracy", "f1"}; }
  void prepare_data(const RunContext&) override {}
  std::vector<int64_t> examples_per_rank(const RunContext& ctx) override {
    return std::vector<int64_t>(ctx.world, 1);
  }
  std::shared_ptr<torch::nn::Module> build_model(const RunContext&) override { return nullptr; }
  std::string model_name() const override { return "toy"; }
  std::unique_ptr<BatchStream> train_batches(const RunContext&) override { return nullptr; }
  torch::Tensor loss(const Batch&) override { return {}; }
  EvalResult evaluate(const RunContext&) override { return {}; }
  ExportResult export_model(const ExportInfo&) override { return {}; }
};

WorkloadRegistry registry() {
  WorkloadRegistry r;
  r.add("toy", [] { return std::make_unique<ToyConfigWorkload>(); });
  return r;
}

LoadedConfig parse(const std::string& text, const std::vector<std::string>& ov = {}) {
  return parse_config(text, "test.toml", registry(), ov);
}

std::string error_of(const std::string& text, const std::vector<std::string>& ov = {}) {
  try {
    parse(text, ov);
  } catch (const lockstep::ConfigError& e) {
    return e.what();
  }
  return "";
}

const ToyConfigWorkload& toy(const LoadedConfig& c) {
  return dynamic_cast<const ToyConfigWorkload&>(*c.workload);
}

TEST(TrainConfig, Defaults) {
  const LoadedConfig l = parse("[optim]\nlr = 0.01\n");
  const TrainConfig& c = l.config;
  EXPECT_EQ(c.optim.lr, 0.01);
  EXPECT_EQ(c.optim.name, "adamw");
  EXPECT_EQ(c.run.workload, "toy");  // the only registered workload
  EXPECT_EQ(c.run.name, "toy");
  EXPECT_EQ(c.run.out_dir, "out/toy");
  EXPECT_EQ(c.eval.metric, "accuracy");  // the workload's first gate metric
  EXPECT_EQ(c.checkpoint.dir, c.run.out_dir + "/checkpoints");
  EXPECT_EQ(toy(l).size, 10);
  EXPECT_EQ(toy(l).validated_source, "test.toml");
}

TEST(TrainConfig, GateThresholdInTheMetricsRange) {
  // The default gate rule (Workload::gate_rule): higher is better, thresholds in [0, 1].
  const std::string m = error_of("[eval]\nthreshold = 1.5\n");
  EXPECT_NE(m.find("test.toml:2:"), std::string::npos) << m;
  EXPECT_NE(m.find("key 'eval.threshold' = 1.5 is out of range [0, 1] for eval.metric "
                   "'accuracy' (higher is better)"),
            std::string::npos)
      << m;
  EXPECT_FALSE(parse("").config.eval.lower_is_better);
  EXPECT_EQ(parse("[eval]\nthreshold = 1\n").config.eval.threshold, 1.0);
}

TEST(TrainConfig, RegistryDefaultServesConfigsWithoutWorkload) {
  WorkloadRegistry r = registry();
  r.add("other", [] { return std::make_unique<ToyConfigWorkload>(); });
  try {
    parse_config("[optim]\nlr = 0.1\n", "test.toml", r);
    FAIL() << "two workloads and no run.workload: no error";
  } catch (const lockstep::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("[run] workload is not set (registered workloads: "
                                         "other, toy)"),
              std::string::npos)
        << e.what();
  }
  r.set_default("toy");
  EXPECT_EQ(parse_config("[optim]\nlr = 0.1\n", "test.toml", r).config.run.workload, "toy");
  EXPECT_EQ(parse_config("[run]\nworkload = \"other\"\n", "test.toml", r).config.run.workload,
            "other");
  EXPECT_THROW(r.set_default("nope"), lockstep::InvalidArgument);
}

TEST(TrainConfig, UnknownKeyNamesKeyAndLine) {
  const std::string m = error_of("[optim]\nlr = 0.01\nlearning_rate = 3\n");
  EXPECT_NE(m.find("test.toml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("'optim.learning_rate'"), std::string::npos) << m;
  EXPECT_NE(m.find("known keys in [optim]"), std::string::npos) << m;
}

TEST(TrainConfig, UnknownSection) {
  const std::string m = error_of("[run]\nname = \"x\"\n\n[optimizer]\nlr = 1.0\n");
  EXPECT_NE(m.find("test.toml:4:"), std::string::npos) << m;
  EXPECT_NE(m.find("'optimizer'"), std::string::npos) << m;
  EXPECT_NE(m.find("toy"), std::string::npos) << m;  // the workload's sections are listed too
}

TEST(TrainConfig, WrongTypeNamesKeyAndLine) {
  const std::string m = error_of("[train]\nepochs = 2\nbatch_size = \"64\"\n");
  EXPECT_NE(m.find("test.toml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("'train.batch_size' must be an integer, got a string"), std::string::npos) << m;
  const std::string f = error_of("[train]\nepochs = 2.5\n");
  EXPECT_NE(f.find("test.toml:2:"), std::string::npos) << f;
  EXPECT_NE(f.find("'train.epochs'"), std::string::npos) << f;
}

TEST(TrainConfig, BadEnumAndRange) {
  EXPECT_NE(error_of("[optim]\nname = \"adam\"\n").find("is not one of: sgd, adamw"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\n\nbatch_size = 0\n").find("test.toml:3:"), std::string::npos);
}

TEST(TrainConfig, Overrides) {
  const LoadedConfig l = parse("[optim]\nlr = 0.01\n",
                               {"optim.lr=0.5", "run.out_dir=/tmp/x", "strategy.comm_hook=bf16"});
  const TrainConfig& c = l.config;
  EXPECT_EQ(c.optim.lr, 0.5);
  EXPECT_EQ(c.run.out_dir, "/tmp/x");
  EXPECT_EQ(c.checkpoint.dir, "/tmp/x/checkpoints");
  EXPECT_EQ(c.strategy.comm_hook, "bf16");
  const std::string m = error_of("", {"optim.lrr=1"});
  EXPECT_NE(m.find("--set optim.lrr=1"), std::string::npos) << m;
  EXPECT_NE(error_of("", {"train.epochs=many"}).find("'train.epochs' must be an integer"),
            std::string::npos);
}

TEST(TrainConfig, SyntaxErrorHasLine) {
  const std::string m = error_of("[run]\nname = \n");
  EXPECT_NE(m.find("test.toml:2:"), std::string::npos) << m;
}

TEST(TrainConfig, WorkloadKeysAreCheckedLikeTheTrainers) {
  const LoadedConfig l =
      parse("[toy]\nsize = 20\nscale = 2\n\n[eval]\nmetric = \"f1\"\nrepeats = 3\n");
  EXPECT_EQ(toy(l).size, 20);
  EXPECT_EQ(toy(l).scale, 2.0);  // numbers accept integers
  EXPECT_EQ(toy(l).eval_repeats, 3);
  EXPECT_EQ(l.config.eval.metric, "f1");
  std::string m = error_of("[toy]\nsize = \"20\"\n");
  EXPECT_NE(m.find("test.toml:2:"), std::string::npos) << m;
  EXPECT_NE(m.find("key 'toy.size' must be an integer, got a string"), std::string::npos) << m;
  m = error_of("[toy]\n\nsize = 5000\n");
  EXPECT_NE(m.find("test.toml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("'toy.size' = 5000 is out of range [1, 1000]"), std::string::npos) << m;
  m = error_of("[toy]\nsise = 5\n");
  EXPECT_NE(m.find("unknown key 'toy.sise' (known keys in [toy]: scale, size)"), std::string::npos)
      << m;
  m = error_of("[eval]\nmetric = \"auc\"\n");
  EXPECT_NE(m.find("test.toml:2:"), std::string::npos) << m;
  EXPECT_NE(m.find("'eval.metric' = 'auc' is not one of: accuracy, f1"), std::string::npos) << m;
  m = error_of("[toy]\nsize = 13\n");
  EXPECT_EQ(m, "test.toml: toy.size must not be 13");
}

TEST(TrainConfig, WorkloadKeyOverrides) {
  const LoadedConfig l = parse("[toy]\nsize = 20\n", {"toy.size=30", "eval.repeats=2"});
  EXPECT_EQ(toy(l).size, 30);
  EXPECT_EQ(toy(l).eval_repeats, 2);
  const std::string m = error_of("", {"toy.scale=big"});
  EXPECT_NE(m.find("--set toy.scale=big"), std::string::npos) << m;
  EXPECT_NE(m.find("'toy.scale' must be a number, got a string"), std::string::npos) << m;
}

TEST(TrainConfig, ChoosingTheWorkload) {
  WorkloadRegistry two = registry();
  two.add("other", [] { return std::make_unique<ToyConfigWorkload>(); });
  EXPECT_EQ(parse_config("[run]\nworkload = \"other\"\n", "t.toml", two).config.run.workload,
            "other");
  EXPECT_EQ(parse_config("", "t.toml", two, {"run.workload=other"}).config.run.name, "other");
  try {
    parse_config("[optim]\nlr = 0.1\n", "t.toml", two);
    ADD_FAILURE() << "no error";
  } catch (const lockstep::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "t.toml: [run] workload is not set (registered workloads: other, toy)"),
              std::string::npos)
        << e.what();
  }
  const std::string m = error_of("[run]\n\nworkload = \"nope\"\n");
  EXPECT_NE(m.find("test.toml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("'run.workload' = 'nope' is not one of: toy"), std::string::npos) << m;
  EXPECT_THROW(two.add("toy", [] { return std::make_unique<ToyConfigWorkload>(); }),
               lockstep::InvalidArgument);
}

TEST(TrainConfig, FsdpKeysDefaults) {
  const StrategyConfig s = parse("[strategy]\nkind = \"fsdp\"\n").config.strategy;
  EXPECT_EQ(s.kind, "fsdp");
  EXPECT_EQ(s.sharding, "full_shard");
  EXPECT_EQ(s.wrap, "all");
  EXPECT_EQ(s.wrap_min_params, 100000);
  EXPECT_EQ(s.param_dtype, "");
  EXPECT_EQ(s.reduce_dtype, "");
  EXPECT_TRUE(s.backward_prefetch);
  EXPECT_FALSE(s.forward_prefetch);
  EXPECT_EQ(s.comm_hook, "none");
}

TEST(TrainConfig, FsdpKeysSet) {
  const StrategyConfig s = parse(R"([strategy]
kind = "fsdp"
sharding = "shard_grad_op"
wrap = "size"
wrap_min_params = 5000
param_dtype = "bfloat16"
reduce_dtype = "float32"
backward_prefetch = false
forward_prefetch = true
)")
                               .config.strategy;
  EXPECT_EQ(s.sharding, "shard_grad_op");
  EXPECT_EQ(s.wrap, "size");
  EXPECT_EQ(s.wrap_min_params, 5000);
  EXPECT_EQ(s.param_dtype, "bfloat16");
  EXPECT_EQ(s.reduce_dtype, "float32");
  EXPECT_FALSE(s.backward_prefetch);
  EXPECT_TRUE(s.forward_prefetch);
  // Every name the schema allows is one fsdp::parse_strategy knows.
  for (const char* name : {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"}) {
    const auto l = parse("", {"strategy.kind=fsdp", std::string("strategy.sharding=") + name});
    EXPECT_EQ(
        lockstep::fsdp::strategy_name(lockstep::fsdp::parse_strategy(l.config.strategy.sharding)),
        std::string(name));
  }
  // FSDP's keys are ignored by the other kinds (a config switches kind with one --set).
  EXPECT_EQ(parse("[strategy]\nkind = \"ddp\"\nsharding = \"no_shard\"\n").config.strategy.kind,
            "ddp");
}

TEST(TrainConfig, FsdpBadValuesNameKeyLineAndChoices) {
  auto expect = [](const std::string& toml, const std::string& line, const std::string& what) {
    const std::string m = error_of("[strategy]\nkind = \"fsdp\"\n" + toml);
    EXPECT_NE(m.find("test.toml:" + line + ":"), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  };
  expect("sharding = \"zero3\"\n", "3",
         "key 'strategy.sharding' = 'zero3' is not one of: full_shard, shard_grad_op, "
         "no_shard, hybrid_shard");
  expect("wrap = \"auto\"\n", "3", "key 'strategy.wrap' = 'auto' is not one of: all, size");
  expect("\nwrap_min_params = 0\n", "4",
         "key 'strategy.wrap_min_params' = 0 is out of range [1, inf]");
  expect("param_dtype = \"float16\"\n", "3",
         "key 'strategy.param_dtype' = 'float16' is not one of: \"\", float32, bfloat16");
  expect("reduce_dtype = \"bf16\"\n", "3",
         "key 'strategy.reduce_dtype' = 'bf16' is not one of: \"\", float32, bfloat16");
  expect("backward_prefetch = \"yes\"\n", "3",
         "key 'strategy.backward_prefetch' must be a boolean, got a string");
  expect("forward_prefetch = 1\n", "3", "key 'strategy.forward_prefetch' must be a boolean");
  expect("sharding_strategy = \"full_shard\"\n", "3",
         "unknown key 'strategy.sharding_strategy' (known keys in [strategy]: backend, "
         "backward_prefetch, comm_hook, diloco_compression, diloco_fragments, "
         "diloco_inner_steps, diloco_mixing, diloco_nesterov, diloco_outer_lr, "
         "diloco_outer_momentum, diloco_overlap_steps, forward_prefetch, gather_bits, kind, "
         "param_dtype, powersgd_error_feedback, powersgd_min_compression_rate, powersgd_rank, "
         "powersgd_start_iter, powersgd_warm_start, qsgd_bits, qsgd_bucket_size, reduce_bits, "
         "reduce_dtype, secondary_shards, sharding, wrap, wrap_min_params)");
  expect("gather_bits = 16\n", "3", "key 'strategy.gather_bits' = 16 is out of range [0, 8]");
}

TEST(TrainConfig, PowerSgdKeys) {
  const auto s = parse(R"([strategy]
comm_hook = "powersgd"
powersgd_rank = 4
powersgd_start_iter = 20
powersgd_min_compression_rate = 1.5
powersgd_error_feedback = false
powersgd_warm_start = false
)")
                     .config.strategy;
  EXPECT_EQ(s.comm_hook, "powersgd");
  EXPECT_EQ(s.powersgd_rank, 4);
  EXPECT_EQ(s.powersgd_start_iter, 20);
  EXPECT_EQ(s.powersgd_min_compression_rate, 1.5);
  EXPECT_FALSE(s.powersgd_error_feedback);
  EXPECT_FALSE(s.powersgd_warm_start);
  // PyTorch's defaults.
  const auto d = parse("[strategy]\ncomm_hook = \"powersgd\"\n").config.strategy;
  EXPECT_EQ(d.powersgd_rank, 1);
  EXPECT_EQ(d.powersgd_start_iter, 1000);
  EXPECT_EQ(d.powersgd_min_compression_rate, 2.0);
  EXPECT_TRUE(d.powersgd_error_feedback && d.powersgd_warm_start);
  // Without error feedback and warm start, compression may start at once.
  EXPECT_EQ(error_of("[strategy]\ncomm_hook = \"powersgd\"\npowersgd_start_iter = 0\n"
                     "powersgd_error_feedback = false\npowersgd_warm_start = false\n"),
            "");
}

TEST(TrainConfig, PowerSgdBadValuesNameKeyLineAndFix) {
  auto expect = [](const std::string& toml, const std::string& line, const std::string& what) {
    const std::string m = error_of("[strategy]\ncomm_hook = \"powersgd\"\n" + toml);
    EXPECT_NE(m.find("test.toml:" + line + ":"), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  };
  expect("powersgd_rank = 0\n", "3", "key 'strategy.powersgd_rank' = 0 is out of range [1, inf]");
  expect("powersgd_start_iter = -1\n", "3",
         "key 'strategy.powersgd_start_iter' = -1 is out of range");
  expect("powersgd_min_compression_rate = -2.0\n", "3",
         "key 'strategy.powersgd_min_compression_rate' = -2 is out of range");
  expect("powersgd_warm_start = 1\n", "3", "key 'strategy.powersgd_warm_start' must be a boolean");
  expect("powersgd_error_feedback = false\npowersgd_start_iter = 1\n", "4",
         "key 'strategy.powersgd_start_iter' = 1 must be >= 2 while powersgd_error_feedback or "
         "powersgd_warm_start is true");
  const std::string m =
      error_of("[strategy]\ncomm_hook = \"powersgd\"\n", {"strategy.powersgd_start_iter=1"});
  EXPECT_NE(m.find("--set strategy.powersgd_start_iter=1"), std::string::npos) << m;
  EXPECT_NE(m.find("set both to false"), std::string::npos) << m;
  // Only the powersgd hook reads them.
  EXPECT_EQ(error_of("[strategy]\ncomm_hook = \"qsgd\"\npowersgd_start_iter = 1\n"), "");
}

TEST(TrainConfig, FsdpRejectsDdpCommHook) {
  std::string m = error_of("[strategy]\nkind = \"fsdp\"\ncomm_hook = \"qsgd\"\n");
  EXPECT_NE(m.find("test.toml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("key 'strategy.comm_hook' = 'qsgd' is a DDP communication hook; "
                   "strategy.kind = \"fsdp\" reduce-scatters gradients itself: set comm_hook = "
                   "\"none\" or kind = \"ddp\""),
            std::string::npos)
      << m;
  m = error_of("[strategy]\nkind = \"fsdp\"\n", {"strategy.comm_hook=bf16"});
  EXPECT_NE(m.find("--set strategy.comm_hook=bf16"), std::string::npos) << m;
  EXPECT_NE(m.find("is a DDP communication hook"), std::string::npos) << m;
  m = error_of("[strategy]\ncomm_hook = \"bf16\"\n", {"strategy.kind=fsdp"});
  EXPECT_NE(m.find("test.toml:2:"), std::string::npos) << m;  // the hook's line, not the --set
  EXPECT_EQ(error_of("[strategy]\nkind = \"fsdp\"\ncomm_hook = \"none\"\n"), "");
  EXPECT_EQ(error_of("[strategy]\nkind = \"ddp\"\ncomm_hook = \"qsgd\"\n"), "");
}

TEST(TrainConfig, DiLoCoKeys) {
  // No [strategy] table at all: the defaults (this once crashed the diloco key check).
  EXPECT_EQ(parse("[run]\nseed = 3\n").config.strategy.kind, "ddp");
  const StrategyConfig s = parse(R"([strategy]
kind = "diloco"
diloco_inner_steps = 20
diloco_fragments = 4
diloco_overlap_steps = 2
diloco_mixing = 0.5
diloco_compression = "qsgd"
)")
                               .config.strategy;
  EXPECT_EQ(s.diloco_inner_steps, 20);
  EXPECT_EQ(s.diloco_fragments, 4);
  EXPECT_EQ(s.diloco_overlap_steps, 2);
  EXPECT_DOUBLE_EQ(s.diloco_mixing, 0.5);
  EXPECT_EQ(s.diloco_compression, "qsgd");
  EXPECT_DOUBLE_EQ(s.diloco_outer_lr, 0.7);
  // Ignored by the other kinds, as FSDP's keys (a config switches kind with one --set).
  EXPECT_EQ(parse("[strategy]\nkind = \"ddp\"\ndiloco_fragments = 2\n").config.strategy.kind,
            "ddp");
  std::string m =
      error_of("[strategy]\nkind = \"diloco\"\ndiloco_inner_steps = 4\ndiloco_fragments = 5\n");
  EXPECT_NE(m.find("test.toml:4:"), std::string::npos) << m;
  EXPECT_NE(m.find("key 'strategy.diloco_fragments' = 5: must be in [1, inner_steps = 4]"),
            std::string::npos)
      << m;
  m = error_of("[strategy]\nkind = \"diloco\"\ndiloco_outer_momentum = 0.0\n");
  EXPECT_NE(m.find("key 'strategy.diloco_nesterov' = true needs outer_momentum > 0"),
            std::string::npos)
      << m;
}

}  // namespace

TEST(TrainConfig, FaultToleranceKeys) {
  const FaultToleranceConfig d = parse("[run]\nseed = 3\n").config.fault_tolerance;
  EXPECT_FALSE(d.enable);
  EXPECT_EQ(d.min_replicas, 1);
  const FaultToleranceConfig f =
      parse("[fault_tolerance]\nenable = true\nmin_replicas = 2\ntimeout_s = 5.5\n")
          .config.fault_tolerance;
  EXPECT_TRUE(f.enable);
  EXPECT_EQ(f.min_replicas, 2);
  EXPECT_DOUBLE_EQ(f.timeout_s, 5.5);
  // A replica is one DDP rank or one FSDP shard group, reducing full-precision gradients.
  EXPECT_EQ(error_of("[fault_tolerance]\nenable = true\n[strategy]\nkind = \"fsdp\"\n"), "");
  std::string m = error_of("[fault_tolerance]\nenable = true\n[strategy]\nkind = \"diloco\"\n");
  EXPECT_NE(m.find("test.toml:4:"), std::string::npos) << m;
  EXPECT_NE(m.find("key 'strategy.kind' = 'diloco': fault_tolerance.enable = true needs \"ddp\""),
            std::string::npos)
      << m;
  m = error_of("[fault_tolerance]\nenable = true\n", {"strategy.comm_hook=qsgd"});
  EXPECT_NE(m.find("--set strategy.comm_hook=qsgd"), std::string::npos) << m;
  EXPECT_NE(m.find("averaged in full precision"), std::string::npos) << m;
  EXPECT_EQ(error_of("[fault_tolerance]\nenable = false\n[strategy]\nkind = \"fsdp\"\n"), "");
  m = error_of("[fault_tolerance]\nmin_replicas = 0\n");
  EXPECT_NE(m.find("fault_tolerance.min_replicas"), std::string::npos) << m;
}
