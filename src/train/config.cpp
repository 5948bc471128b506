// Schema-checked TOML loading. The schema is a flat table "section.key" -> typed setter,
// so the set of known keys, their types and the struct fields cannot drift apart.
#include <lockstep/train/config.h>

#include <toml++/toml.h>

#include <fstream>
#include <functional>
#include <map>
#include <sstream>

namespace lockstep::train {
namespace {

enum class Kind { Int, Float, Bool, String };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Int: return "an integer";
    case Kind::Float: return "a number";
    case Kind::Bool: return "a boolean";
    case Kind::String: return "a string";
  }
  return "?";
}
std::string node_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

std::string where(const toml::node& n) {
  const auto& s = n.source();
  std::ostringstream os;
  os << (s.path ? *s.path : std::string("<config>")) << ":" << s.begin.line << ":" << s.begin.column << ": ";
  return os.str();
}

struct Field {
  Kind kind;
  std::function<void(const toml::node&)> set;
};

class Schema {
 public:
  explicit Schema(TrainConfig& c) {
    str("run.name", c.run.name);
    str("run.out_dir", c.run.out_dir);
    i64("run.seed", c.run.seed, 0);
    auto& d = c.data;
    str("data.dir", d.dir);
    boolean("data.generate", d.generate);
    i64("data.seed", d.seed, 0);
    i64("data.clients", d.clients, 1);
    i64("data.items", d.items, 1);
    i64("data.shards", d.shards, 1);
    i64("data.days", d.days, 1);
    i64("data.latent_dim", d.latent_dim, 1);
    i64("data.styles", d.styles, 1);
    f64("data.style_spread", d.style_spread, 0, 1);
    i64("data.items_per_shipment", d.items_per_shipment, 1);
    f64("data.mean_gap_days", d.mean_gap_days, 10);
    f64("data.drift_halflife_days", d.drift_halflife_days, 1e-3);
    f64("data.affinity", d.affinity, 0);
    f64("data.recency", d.recency, 0);
    f64("data.noise", d.noise, 0);
    f64("data.base_logit", d.base_logit, -100);
    f64("data.stylist_noise", d.stylist_noise, 0);
    f64("data.feedback_prob", d.feedback_prob, 0, 1);
    i64("data.cutoff_day", d.cutoff_day, 1);
    i64("data.horizon_days", d.horizon_days, 1);
    i64("data.max_len", d.max_len, 2);
    i64("data.max_candidates", d.max_candidates, 1);
    i64("data.shuffle_buffer", d.shuffle_buffer, 1);
    i64("model.d_model", c.model.d_model, 1);
    i64("model.heads", c.model.heads, 1);
    i64("model.layers", c.model.layers, 0);
    i64("model.d_ff", c.model.d_ff, 1);
    f64("model.dropout", c.model.dropout, 0, 0.99);
    auto& o = c.optim;
    one_of("optim.name", o.name, {"sgd", "adamw"});
    f64("optim.lr", o.lr, 0);
    f64("optim.weight_decay", o.weight_decay, 0);
    f64("optim.momentum", o.momentum, 0, 1);
    f64("optim.beta1", o.beta1, 0, 1);
    f64("optim.beta2", o.beta2, 0, 1);
    f64("optim.grad_clip", o.grad_clip, 0);
    one_of("optim.lr_scaling", o.lr_scaling, {"linear", "sqrt", "none"});
    i64("schedule.warmup_steps", c.schedule.warmup_steps, 0);
    f64("schedule.min_lr_ratio", c.schedule.min_lr_ratio, 0, 1);
    auto& t = c.train;
    i64("train.epochs", t.epochs, 1);
    i64("train.batch_size", t.batch_size, 1);
    i64("train.grad_accum", t.grad_accum, 1);
    i64("train.reference_world_size", t.reference_world_size, 1);
    boolean("train.keep_global_batch", t.keep_global_batch);
    i64("train.max_steps", t.max_steps, 0);
    i64("train.stop_after_steps", t.stop_after_steps, 0);
    i64("train.threads", t.threads, 1);
    one_of("strategy.kind", c.strategy.kind, {"single", "ddp"});
    one_of("strategy.comm_hook", c.strategy.comm_hook, {"none", "bf16", "qsgd"});
    i64("strategy.qsgd_bits", c.strategy.qsgd_bits, 1, 32);
    i64("strategy.qsgd_bucket_size", c.strategy.qsgd_bucket_size, 1);
    one_of("strategy.backend", c.strategy.backend, {"auto", "shm", "gloo", "mpi"});
    one_of("eval.metric", c.eval.metric, {"auc", "recall_at_k"});
    f64("eval.threshold", c.eval.threshold, 0, 1);
    i64("eval.k", c.eval.k, 1);
    i64("eval.bins", c.eval.bins, 2);
    i64("eval.batch_size", c.eval.batch_size, 1);
    i64("checkpoint.every_steps", c.checkpoint.every_steps, 0);
    i64("checkpoint.keep", c.checkpoint.keep, 1);
    str("checkpoint.dir", c.checkpoint.dir);
    i64("log.every_steps", c.log.every_steps, 1);
    boolean("log.progress", c.log.progress);
    boolean("log.tensorboard", c.log.tensorboard);
    boolean("log.plot", c.log.plot);
  }

  // Checks every key of `root` against the schema and stores the values.
  void apply(const toml::table& root) { walk(root, ""); }

  std::string known_in(const std::string& section) const {
    std::string out;
    for (const auto& [k, f] : fields_)
      if (k.rfind(section + ".", 0) == 0) out += (out.empty() ? "" : ", ") + k.substr(section.size() + 1);
    return out;
  }
  bool has_section(const std::string& s) const { return !known_in(s).empty(); }

 private:
  void walk(const toml::table& t, const std::string& prefix) {
    for (const auto& [k, node] : t) {
      const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      if (prefix.empty()) {
        if (!has_section(key)) {
          std::string sections = "run, data, model, optim, schedule, train, strategy, eval, checkpoint, log";
          throw ConfigError(where(node) + "unknown key '" + key + "' (sections: " + sections + ")");
        }
        if (!node.is_table())
          throw ConfigError(where(node) + "key '" + key + "' must be a table ([" + key + "]), got " +
                            node_type_name(node));
        walk(*node.as_table(), key);
        continue;
      }
      auto it = fields_.find(key);
      if (it == fields_.end())
        throw ConfigError(where(node) + "unknown key '" + key + "' (known keys in [" + prefix + "]: " +
                          known_in(prefix) + ")");
      it->second.set(node);
    }
  }

  static void type_error(const std::string& key, const toml::node& n, Kind k) {
    throw ConfigError(where(n) + "key '" + key + "' must be " + kind_name(k) + ", got " + node_type_name(n));
  }
  void i64(const std::string& key, int64_t& dst, int64_t lo, int64_t hi = INT64_MAX) {
    fields_[key] = {Kind::Int, [key, &dst, lo, hi](const toml::node& n) {
                      auto v = n.value_exact<int64_t>();
                      if (!v) type_error(key, n, Kind::Int);
                      if (*v < lo || *v > hi)
                        throw ConfigError(where(n) + "key '" + key + "' = " + std::to_string(*v) +
                                          " is out of range [" + std::to_string(lo) + ", " +
                                          (hi == INT64_MAX ? std::string("inf") : std::to_string(hi)) + "]");
                      dst = *v;
                    }};
  }
  void f64(const std::string& key, double& dst, double lo, double hi = 1e300) {
    fields_[key] = {Kind::Float, [key, &dst, lo, hi](const toml::node& n) {
                      std::optional<double> v;
                      if (n.is_floating_point() || n.is_integer()) v = n.value<double>();
                      if (!v) type_error(key, n, Kind::Float);
                      if (*v < lo || *v > hi) {
                        std::ostringstream os;
                        os << where(n) << "key '" << key << "' = " << *v << " is out of range [" << lo << ", " << hi
                           << "]";
                        throw ConfigError(os.str());
                      }
                      dst = *v;
                    }};
  }
  void boolean(const std::string& key, bool& dst) {
    fields_[key] = {Kind::Bool, [key, &dst](const toml::node& n) {
                      auto v = n.value_exact<bool>();
                      if (!v) type_error(key, n, Kind::Bool);
                      dst = *v;
                    }};
  }
  void str(const std::string& key, std::string& dst) {
    fields_[key] = {Kind::String, [key, &dst](const toml::node& n) {
                      auto v = n.value_exact<std::string>();
                      if (!v) type_error(key, n, Kind::String);
                      dst = *v;
                    }};
  }
  void one_of(const std::string& key, std::string& dst, std::vector<std::string> allowed) {
    fields_[key] = {Kind::String, [key, &dst, allowed](const toml::node& n) {
                      auto v = n.value_exact<std::string>();
                      if (!v) type_error(key, n, Kind::String);
                      std::string list;
                      for (const auto& a : allowed) {
                        if (a == *v) {
                          dst = *v;
                          return;
                        }
                        list += (list.empty() ? "" : ", ") + a;
                      }
                      throw ConfigError(where(n) + "key '" + key + "' = '" + *v + "' is not one of: " + list);
                    }};
  }

  std::map<std::string, Field> fields_;
};

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
  const std::string src = "--set " + text;
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value, src);
  } catch (const toml::parse_error&) {
    // Not a TOML value: take it as a bare string (e.g. --set run.out_dir=/tmp/x).
    parsed = toml::parse("v = \"\"", src);
    parsed.insert_or_assign("v", value);
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* t = root[section].as_table();
  if (!t) throw ConfigError(src + ": '" + section + "' is not a table");
  t->insert_or_assign(leaf, std::move(*parsed.get("v")));
}

TrainConfig finish(toml::table& root, const std::string& source, const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) apply_override(root, o);
  TrainConfig c;
  c.source = source;
  Schema(c).apply(root);
  if (c.model.d_model % c.model.heads != 0)
    throw ConfigError(source + ": model.d_model (" + std::to_string(c.model.d_model) +
                      ") must be divisible by model.heads (" + std::to_string(c.model.heads) + ")");
  if (c.data.cutoff_day >= c.data.days)
    throw ConfigError(source + ": data.cutoff_day (" + std::to_string(c.data.cutoff_day) +
                      ") must be before data.days (" + std::to_string(c.data.days) + ")");
  if (c.data.max_candidates >= c.data.max_len)
    throw ConfigError(source + ": data.max_candidates must be smaller than data.max_len");
  if (c.checkpoint.dir.empty()) c.checkpoint.dir = c.run.out_dir + "/checkpoints";
  std::ostringstream js;
  js << toml::json_formatter{root};
  c.json = js.str();
  return c;
}

TrainConfig parse_text(const std::string& text, const std::string& source, const std::vector<std::string>& ov) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& s = e.source();
    throw ConfigError(source + ":" + std::to_string(s.begin.line) + ":" + std::to_string(s.begin.column) +
                      ": TOML syntax error: " + std::string(e.description()));
  }
  return finish(root, source, ov);
}

}  // namespace

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot read config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_text(ss.str(), path, overrides);
}

TrainConfig parse_config(const std::string& toml_text, const std::string& source_name,
                         const std::vector<std::string>& overrides) {
  return parse_text(toml_text, source_name, overrides);
}

}  // namespace lockstep::train
