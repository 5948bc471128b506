// Schema-checked TOML loading: toml++ parses, ConfigSchema (config_schema.h) checks every
// key of the trainer's sections and of the workload's.
#include <lockstep/train/config.h>
#include "train/loop/diloco_support.h"

#include <lockstep/numerics/autocast.h>
#include <lockstep/parallel/fsdp/options.h>
#include <lockstep/train/config_schema.h>

#include <toml++/toml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace lockstep::train {
namespace {

constexpr const char* kSetPrefix = "--set ";

// "FILE:LINE:COLUMN: " for a key of the file; "--set a.b=c: " for an override (parsed
// from its own one-line document, whose line and column would mislead).
std::string where(const toml::node& n) {
  const auto& s = n.source();
  const std::string path = s.path ? *s.path : std::string("<config>");
  if (path.rfind(kSetPrefix, 0) == 0) return path + ": ";
  std::ostringstream os;
  os << path << ":" << s.begin.line << ":" << s.begin.column << ": ";
  return os.str();
}

// toml++'s node as the schema's parser-independent value.
ConfigValue value_of(const toml::node& n) {
  ConfigValue v;
  v.where = where(n);
  switch (n.type()) {
    case toml::node_type::integer:
      v.type = ConfigValue::Type::Integer;
      v.integer = *n.value_exact<int64_t>();
      v.number = double(v.integer);
      break;
    case toml::node_type::floating_point:
      v.type = ConfigValue::Type::Float;
      v.number = *n.value_exact<double>();
      break;
    case toml::node_type::boolean:
      v.type = ConfigValue::Type::Boolean;
      v.boolean = *n.value_exact<bool>();
      break;
    case toml::node_type::string:
      v.type = ConfigValue::Type::String;
      v.string = *n.value_exact<std::string>();
      break;
    case toml::node_type::table:
      v.type = ConfigValue::Type::Table;
      break;
    case toml::node_type::array:
      v.type = ConfigValue::Type::Array;
      break;
    default:
      v.type = ConfigValue::Type::Other;
      break;
  }
  return v;
}

// The names fsdp::parse_strategy accepts, in the order docs/trainer.md lists them.
std::vector<std::string> sharding_names() {
  using fsdp::ShardingStrategy;
  std::vector<std::string> out;
  for (auto s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                 ShardingStrategy::NoShard, ShardingStrategy::HybridShard})
    out.emplace_back(fsdp::strategy_name(s));
  return out;
}

void declare_strategy_keys(ConfigSchema& s, StrategyConfig& c) {
  s.one_of("strategy.kind", c.kind, {"single", "ddp", "fsdp", "diloco"});
  s.one_of("strategy.comm_hook", c.comm_hook, {"none", "bf16", "qsgd", "powersgd"});
  s.i64("strategy.qsgd_bits", c.qsgd_bits, 1, 32);
  s.i64("strategy.qsgd_bucket_size", c.qsgd_bucket_size, 1);
  s.i64("strategy.powersgd_rank", c.powersgd_rank, 1);
  s.i64("strategy.powersgd_start_iter", c.powersgd_start_iter, 0);
  s.f64("strategy.powersgd_min_compression_rate", c.powersgd_min_compression_rate, 0);
  s.boolean("strategy.powersgd_error_feedback", c.powersgd_error_feedback);
  s.boolean("strategy.powersgd_warm_start", c.powersgd_warm_start);
  s.i64("strategy.diloco_inner_steps", c.diloco_inner_steps, 1);
  s.f64("strategy.diloco_outer_lr", c.diloco_outer_lr, 0);
  s.f64("strategy.diloco_outer_momentum", c.diloco_outer_momentum, 0);
  s.boolean("strategy.diloco_nesterov", c.diloco_nesterov);
  s.i64("strategy.diloco_fragments", c.diloco_fragments, 1);
  s.i64("strategy.diloco_overlap_steps", c.diloco_overlap_steps, 0);
  s.f64("strategy.diloco_mixing", c.diloco_mixing, 0);
  s.one_of("strategy.diloco_compression", c.diloco_compression, {"none", "qsgd"});
  s.one_of("strategy.backend", c.backend, {"auto", "shm", "gloo", "mpi"});
  s.one_of("strategy.sharding", c.sharding, sharding_names());
  s.one_of("strategy.wrap", c.wrap, {"all", "size"});
  s.i64("strategy.wrap_min_params", c.wrap_min_params, 1);
  s.one_of("strategy.param_dtype", c.param_dtype, {"", "float32", "bfloat16"});
  s.one_of("strategy.reduce_dtype", c.reduce_dtype, {"", "float32", "bfloat16"});
  s.boolean("strategy.backward_prefetch", c.backward_prefetch);
  s.boolean("strategy.forward_prefetch", c.forward_prefetch);
  s.i64("strategy.gather_bits", c.gather_bits, 0, 8);
  s.i64("strategy.reduce_bits", c.reduce_bits, 0, 8);
  s.boolean("strategy.secondary_shards", c.secondary_shards);
}

// [precision], [memory] and the options of anyprecision_adamw (docs/precision.md).
void declare_precision_keys(ConfigSchema& s, TrainConfig& c) {
  const std::vector<std::string> dtypes{"float32", "bfloat16", "float64"};
  auto& o = c.optim;
  s.boolean("optim.kahan_summation", o.kahan_summation);
  s.one_of("optim.momentum_dtype", o.momentum_dtype, dtypes);
  s.one_of("optim.variance_dtype", o.variance_dtype, dtypes);
  s.one_of("optim.compensation_dtype", o.compensation_dtype, dtypes);
  auto& p = c.precision;
  s.one_of("precision.param_dtype", p.param_dtype, dtypes);
  s.one_of("precision.autocast", p.autocast, {"none", "bfloat16", "float16"});
  s.one_of("precision.loss_scaling", p.loss_scaling, {"none", "dynamic"});
  s.f64("precision.init_scale", p.init_scale, 1.0);
  s.i64("precision.growth_interval", p.growth_interval, 1);
  s.boolean("memory.activation_checkpointing", c.memory.activation_checkpointing);
  s.i64("memory.checkpoint_every", c.memory.checkpoint_every, 1);
  s.one_of("memory.checkpoint_blocks", c.memory.checkpoint_blocks, {"layer", "attention", "mlp"});
  s.boolean("memory.keep_dropout_masks", c.memory.keep_dropout_masks);
  s.one_of("train.non_finite", c.train.non_finite, {"stop", "skip"});
}

// The trainer's own keys; the workload adds its own to the same schema.
void declare_trainer_keys(ConfigSchema& s, TrainConfig& c,
                          const std::vector<std::string>& gate_metrics) {
  s.str("run.workload", c.run.workload);
  s.str("run.name", c.run.name);
  s.str("run.out_dir", c.run.out_dir);
  s.i64("run.seed", c.run.seed, 0);
  auto& o = c.optim;
  s.one_of("optim.name", o.name, {"sgd", "adamw", "anyprecision_adamw"});
  s.f64("optim.lr", o.lr, 0);
  s.f64("optim.weight_decay", o.weight_decay, 0);
  s.f64("optim.momentum", o.momentum, 0, 1);
  s.f64("optim.beta1", o.beta1, 0, 1);
  s.f64("optim.beta2", o.beta2, 0, 1);
  s.f64("optim.grad_clip", o.grad_clip, 0);
  s.one_of("optim.lr_scaling", o.lr_scaling, {"linear", "sqrt", "none"});
  s.i64("schedule.warmup_steps", c.schedule.warmup_steps, 0);
  s.f64("schedule.min_lr_ratio", c.schedule.min_lr_ratio, 0, 1);
  auto& t = c.train;
  s.i64("train.epochs", t.epochs, 1);
  s.i64("train.batch_size", t.batch_size, 1);
  s.i64("train.grad_accum", t.grad_accum, 1);
  s.i64("train.reference_world_size", t.reference_world_size, 1);
  s.boolean("train.keep_global_batch", t.keep_global_batch);
  s.i64("train.max_steps", t.max_steps, 0);
  s.i64("train.stop_after_steps", t.stop_after_steps, 0);
  s.i64("train.threads", t.threads, 1);
  declare_strategy_keys(s, c.strategy);
  declare_precision_keys(s, c);
  s.one_of("eval.metric", c.eval.metric, gate_metrics);
  s.f64("eval.threshold", c.eval.threshold, -1e300);  // the metric's range: check_gate()
  s.i64("eval.every_steps", c.eval.every_steps, 0);
  s.i64("checkpoint.every_steps", c.checkpoint.every_steps, 0);
  s.i64("checkpoint.keep", c.checkpoint.keep, 1);
  s.str("checkpoint.dir", c.checkpoint.dir);
  s.one_of("checkpoint.mode", c.checkpoint.mode, {"async", "sync"});
  auto& ft = c.fault_tolerance;
  s.boolean("fault_tolerance.enable", ft.enable);
  s.i64("fault_tolerance.min_replicas", ft.min_replicas, 1);
  s.f64("fault_tolerance.heartbeat_s", ft.heartbeat_s, 0.01, 10);
  s.f64("fault_tolerance.timeout_s", ft.timeout_s, 0.5);
  s.f64("fault_tolerance.quorum_timeout_s", ft.quorum_timeout_s, 1);
  s.i64("log.every_steps", c.log.every_steps, 1);
  s.boolean("log.progress", c.log.progress);
  s.boolean("log.tensorboard", c.log.tensorboard);
  s.boolean("log.plot", c.log.plot);
}

// Checks every key of `root` against the schema and stores the values.
void apply(const ConfigSchema& schema, const toml::table& root) {
  for (const auto& [k, node] : root) {
    const std::string section(k.str());
    if (!schema.has_section(section))
      throw ConfigError(where(node) + "unknown key '" + section +
                        "' (sections: " + schema.sections() + ")");
    if (!node.is_table())
      throw ConfigError(lockstep::detail::concat(where(node), "key '", section,
                                                 "' must be a table ([", section, "]), got ",
                                                 value_of(node).type_name()));
    for (const auto& [leaf, value] : *node.as_table())
      schema.set(section + "." + std::string(leaf.str()), value_of(value));
  }
}

// The combinations of [precision], [memory] and optim.name that cannot work.
void validate_precision_keys(const TrainConfig& c, const toml::table& root) {
  auto at = [&](const char* section, const char* key) {
    const toml::node* n = root[section][key].node();
    return n ? where(*n) : c.source + ": ";
  };
  const auto& p = c.precision;
  if (p.autocast != "none") {
    numerics::AutocastOptions a;
    a.dtype = p.autocast == "float16" ? c10::ScalarType::Half : c10::ScalarType::BFloat16;
    try {
      numerics::Autocast probe(a);  // the runtime's own rule: this libtorch, this device
    } catch (const InvalidArgument& e) {
      throw ConfigError(at("precision", "autocast") + "key 'precision.autocast' = '" + p.autocast +
                        "': " + e.what() + "; use \"bfloat16\" or \"none\"");
    }
  }
  if (c.optim.name != "anyprecision_adamw")
    for (const char* k :
         {"kahan_summation", "momentum_dtype", "variance_dtype", "compensation_dtype"})
      if (root["optim"][k].node() != nullptr)
        throw ConfigError(at("optim", k) + "key 'optim." + k +
                          "' is an option of optim.name = \"anyprecision_adamw\", not of \"" +
                          c.optim.name + "\"");
  if (p.loss_scaling == "none")
    for (const char* k : {"init_scale", "growth_interval"})
      if (root["precision"][k].node() != nullptr)
        throw ConfigError(at("precision", k) + "key 'precision." + k +
                          "' needs precision.loss_scaling = \"dynamic\"");
  if (!c.memory.activation_checkpointing)
    for (const char* k : {"checkpoint_every", "checkpoint_blocks", "keep_dropout_masks"})
      if (root["memory"][k].node() != nullptr)
        throw ConfigError(at("memory", k) + "key 'memory." + k +
                          "' needs memory.activation_checkpointing = true");
}

// strategy.kind = "diloco": no DDP hook; the diloco_* values as diloco::validate checks them
// (its message names the option, here the key).
void validate_diloco_keys(const TrainConfig& c, const toml::table& root) {
  const auto& st = c.strategy;
  auto at_key = [&](const std::string& k) {
    const toml::node* n = root["strategy"][k].node();
    return n ? where(*n) : c.source + ": ";
  };
  if (st.kind != "diloco") return;  // its keys are ignored otherwise, as FSDP's
  if (st.comm_hook != "none")
    throw ConfigError(at_key("comm_hook") + "key 'strategy.comm_hook' = '" + st.comm_hook +
                      "' is a DDP communication hook; strategy.kind = \"diloco\" exchanges "
                      "parameters every diloco_inner_steps: set comm_hook = \"none\" (for 4-bit "
                      "exchanges, diloco_compression = \"qsgd\")");
  try {
    diloco::validate(diloco_options(st, 0));
  } catch (const InvalidArgument& e) {
    std::string what = e.what();
    what = what.substr(what.find(": ") + 2);  // "NAME = VALUE: why"
    const std::string name = what.substr(0, what.find(' '));
    const std::string key = name.rfind("qsgd_", 0) == 0 ? name : "diloco_" + name;
    throw ConfigError(at_key(key) + "key 'strategy." + key + "'" + what.substr(name.size()));
  }
}

// fault_tolerance.enable: a replica is one DDP rank, or the ranks of one FSDP shard group
// (HSDP), whose gradients the fault-tolerant step averages itself, in full precision.
void validate_fault_tolerance_keys(const TrainConfig& c, const toml::table& root) {
  if (!c.fault_tolerance.enable) return;
  auto at = [&](const char* section, const char* key) {
    const toml::node* n = root[section][key].node();
    return n ? where(*n) : c.source + ": ";
  };
  const auto& st = c.strategy;
  if (st.kind != "ddp" && st.kind != "fsdp")
    throw ConfigError(at("strategy", "kind") + "key 'strategy.kind' = '" + st.kind +
                      "': fault_tolerance.enable = true needs \"ddp\" (a replica is one rank) "
                      "or \"fsdp\" (HSDP: a replica shards over its lockstep-run --replica-size "
                      "ranks), docs/fault-tolerance.md");
  if (st.comm_hook != "none")
    throw ConfigError(at("strategy", "comm_hook") + "key 'strategy.comm_hook' = '" + st.comm_hook +
                      "': under fault_tolerance.enable = true the gradients are averaged in "
                      "full precision over the step's replicas; set comm_hook = \"none\"");
  if (st.kind == "fsdp" && st.sharding == "hybrid_shard")
    throw ConfigError(at("strategy", "sharding") +
                      "key 'strategy.sharding' = 'hybrid_shard': under fault_tolerance.enable = "
                      "true the replicas are lockstep-run's (--replica-size S shards each over S "
                      "ranks): set sharding = \"full_shard\"");
}

// strategy.gather_bits / reduce_bits compress FSDP's gathers and reduce-scatters: only a
// sharded FSDP strategy has them.
void validate_fsdp_compression_keys(const TrainConfig& c, const toml::table& root) {
  const auto& st = c.strategy;
  if (st.secondary_shards && (st.kind != "fsdp" || st.sharding != "full_shard")) {
    const toml::node* n = root["strategy"]["secondary_shards"].node();
    throw ConfigError((n ? where(*n) : c.source + ": ") +
                      "key 'strategy.secondary_shards' = true keeps FSDP full_shard's "
                      "parameters in the node for backward, but strategy.kind = \"" +
                      st.kind + "\", sharding = \"" + st.sharding +
                      "\": set kind = \"fsdp\" and sharding = \"full_shard\", or false");
  }
  for (const auto& [key, bits] : {std::pair<const char*, int64_t>{"gather_bits", st.gather_bits},
                                  {"reduce_bits", st.reduce_bits}}) {
    if (bits == 0) continue;
    const toml::node* n = root["strategy"][key].node();
    const std::string at =
        (n ? where(*n) : c.source + ": ") + "key 'strategy." + key + "' = " + std::to_string(bits);
    if (st.kind != "fsdp")
      throw ConfigError(at + " compresses FSDP's collectives, but strategy.kind = \"" + st.kind +
                        "\": set kind = \"fsdp\", or for DDP comm_hook = \"qsgd\" (qsgd_bits)");
    if (st.sharding == "no_shard")
      throw ConfigError(at +
                        ": strategy.sharding = \"no_shard\" gathers and reduce-scatters "
                        "nothing; set sharding = \"full_shard\" or \"shard_grad_op\", or " +
                        key + " = 0");
  }
}

// Checks across the trainer's keys once all are set. `root` gives the offending key's line.
void validate_trainer_keys(const TrainConfig& c, const toml::table& root) {
  validate_precision_keys(c, root);
  validate_fault_tolerance_keys(c, root);
  validate_fsdp_compression_keys(c, root);
  const auto& st = c.strategy;
  if (st.kind == "fsdp" && st.comm_hook != "none") {
    const toml::node* n = root["strategy"]["comm_hook"].node();
    throw ConfigError((n ? where(*n) : c.source + ": ") + "key 'strategy.comm_hook' = '" +
                      st.comm_hook +
                      "' is a DDP communication hook; strategy.kind = \"fsdp\" reduce-scatters "
                      "gradients itself: set comm_hook = \"none\" or kind = \"ddp\"");
  }
  validate_diloco_keys(c, root);
  // PowerSGD keeps per-bucket state, which DDP's bucket rebuild after step 1 would void.
  if (st.comm_hook == "powersgd" && st.powersgd_start_iter < 2 &&
      (st.powersgd_error_feedback || st.powersgd_warm_start)) {
    const toml::node* n = root["strategy"]["powersgd_start_iter"].node();
    throw ConfigError(lockstep::detail::concat(
        n ? where(*n) : c.source + ": ",
        "key 'strategy.powersgd_start_iter' = ", st.powersgd_start_iter,
        " must be >= 2 while powersgd_error_feedback or powersgd_warm_start is true (DDP "
        "rebuilds its buckets after the first step, which the kept error and Q would not "
        "survive): raise it, or set both to false"));
  }
}

// eval.threshold within the range of the gated metric (Workload::gate_rule), and the
// gate's direction.
void check_gate(TrainConfig& c, const toml::table& root, const Workload& workload) {
  const GateRule rule = workload.gate_rule(c.eval.metric);
  c.eval.lower_is_better = rule.lower_is_better;
  if (c.eval.threshold >= rule.min && c.eval.threshold <= rule.max) return;
  const toml::node* n = root["eval"]["threshold"].node();
  std::ostringstream os;
  os << (n ? where(*n) : c.source + ": ") << "key 'eval.threshold' = " << c.eval.threshold
     << (n ? "" : " (the default)") << " is out of range [" << rule.min << ", " << rule.max
     << "] for eval.metric '" << c.eval.metric << "' ("
     << (rule.lower_is_better ? "lower" : "higher") << " is better)"
     << (n ? "" : ": set eval.threshold");
  throw ConfigError(os.str());
}

// run.workload from the (overridden) document, or the registry's default workload.
std::string workload_name(const toml::table& root, const std::string& source,
                          const WorkloadRegistry& registry) {
  const toml::node* n = root["run"]["workload"].node();
  if (!n) {
    if (!registry.default_name().empty()) return registry.default_name();
    throw ConfigError(source + ": [run] workload is not set (registered workloads: " +
                      (registry.size() ? registry.names() : std::string("none")) + ")");
  }
  const ConfigValue v = value_of(*n);
  if (v.type != ConfigValue::Type::String)
    throw ConfigError(v.where + "key 'run.workload' must be a string, got " + v.type_name());
  if (!registry.contains(v.string))
    throw ConfigError(v.where + "key 'run.workload' = '" + v.string +
                      "' is not one of: " + registry.names());
  return v.string;
}

// `s` as a TOML basic string literal.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

// Parses "a.b=value" into `root`, keeping the override text as the node's source so a
// schema error names it.
void apply_override(toml::table& root, const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set " + text + ": expected section.key=value");
  const std::string key = text.substr(0, eq), value = text.substr(eq + 1);
  const auto dot = key.find('.');
  if (dot == std::string::npos) throw ConfigError("--set " + text + ": key must be section.key");
  const std::string section = key.substr(0, dot), leaf = key.substr(dot + 1);
  const std::string src = kSetPrefix + text;
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value, src);
  } catch (const toml::parse_error&) {
    // Not a TOML value: take it as a bare string (e.g. --set run.out_dir=/tmp/x), parsed
    // as a quoted TOML string so that the node keeps the override as its source.
    try {
      parsed = toml::parse("v = " + quoted(value), src);
    } catch (const toml::parse_error&) {  // not even a string (e.g. invalid UTF-8): no source
      parsed = toml::parse("v = \"\"", src);
      parsed.insert_or_assign("v", value);
    }
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* t = root[section].as_table();
  if (!t) throw ConfigError(src + ": '" + section + "' is not a table");
  t->insert_or_assign(leaf, std::move(*parsed.get("v")));
}

// An override of a section nobody declares is named by its --set argument (its table was
// made by apply_override and has no source to point at).
void check_override_sections(const ConfigSchema& schema,
                             const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) {
    const std::string section = o.substr(0, o.find('.'));
    if (!schema.has_section(section))
      throw ConfigError(lockstep::detail::concat(kSetPrefix, o, ": unknown section '", section,
                                                 "' (sections: ", schema.sections(), ")"));
  }
}

LoadedConfig finish(toml::table& root, const std::string& source, const WorkloadRegistry& registry,
                    const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) apply_override(root, o);
  LoadedConfig out;
  TrainConfig& c = out.config;
  c.source = source;
  const std::string name = workload_name(root, source, registry);
  out.workload = registry.create(name);
  const std::vector<std::string> gate_metrics = out.workload->gate_metrics();
  LOCKSTEP_CHECK(!gate_metrics.empty(), "workload '", name, "' names no gate metric");
  ConfigSchema schema;
  declare_trainer_keys(schema, c, gate_metrics);
  out.workload->declare_config(schema);
  check_override_sections(schema, overrides);
  apply(schema, root);
  validate_trainer_keys(c, root);
  out.workload->validate_config(source);
  c.run.workload = name;
  if (c.run.name.empty()) c.run.name = name;
  if (c.run.out_dir.empty()) c.run.out_dir = "out/" + name;
  if (c.eval.metric.empty()) c.eval.metric = gate_metrics.front();
  check_gate(c, root, *out.workload);
  if (c.checkpoint.dir.empty()) c.checkpoint.dir = c.run.out_dir + "/checkpoints";
  std::ostringstream js;
  js << toml::json_formatter{root};
  c.json = js.str();
  return out;
}

LoadedConfig parse_text(const std::string& text, const std::string& source,
                        const WorkloadRegistry& registry, const std::vector<std::string>& ov) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& s = e.source();
    throw ConfigError(source + ":" + std::to_string(s.begin.line) + ":" +
                      std::to_string(s.begin.column) +
                      ": TOML syntax error: " + std::string(e.description()));
  }
  return finish(root, source, registry, ov);
}

// The text of the config file at `path`, refusing what cannot be one: a directory, a
// missing or unreadable file, an empty one (only blanks and comments), a binary one.
std::string read_config_file(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string hint = " (lockstep-train takes a TOML file, e.g. configs/ctsm-tiny.toml)";
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw ConfigError(path + ": is a directory, not a config file" + hint);
  if (!fs::exists(path, ec)) throw ConfigError(path + ": no such config file" + hint);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot read config file (permissions?)");
  std::stringstream ss;
  ss << in.rdbuf();  // sets ss's failbit for an empty file, which the check below reports
  std::string text = ss.str();
  if (text.find('\0') != std::string::npos)
    throw ConfigError(path + ": is a binary file (it holds NUL bytes), not a TOML config" + hint);
  bool any = false;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first != std::string::npos && line[first] != '#') any = true;
  }
  if (!any) throw ConfigError(path + ": is empty (no settings, only blanks or comments)" + hint);
  return text;
}

}  // namespace

LoadedConfig load_config(const std::string& path, const WorkloadRegistry& registry,
                         const std::vector<std::string>& overrides) {
  return parse_text(read_config_file(path), path, registry, overrides);
}

LoadedConfig parse_config(const std::string& toml_text, const std::string& source_name,
                          const WorkloadRegistry& registry,
                          const std::vector<std::string>& overrides) {
  return parse_text(toml_text, source_name, registry, overrides);
}

}  // namespace lockstep::train
