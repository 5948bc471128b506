// lockstep-bench fsdp: the tables (step time, memory, the cap search), the targets
// and the CSV.
#include "bench_util.h"
#include "fsdp_driver.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

namespace lockstep::bench {

std::string result_key(const std::string& impl, const std::string& strategy, int ranks) {
  return impl + "|" + strategy + "|" + std::to_string(ranks);
}

const Result* FsdpReport::get(const std::string& impl, const std::string& strategy,
                              int ranks) const {
  auto it = medians.find(result_key(impl, strategy, ranks));
  return it == medians.end() || !it->second.count("step") ? nullptr : &it->second;
}

namespace {

double val(const Result* r, const char* k) { return r && r->count(k) ? r->at(k) : NAN; }
std::string num(double v, int decimals, const char* suffix = "") {
  return std::isnan(v) ? std::string("n/a") : fmt(v, decimals) + suffix;
}
std::string ms(const Result* r, const char* k) { return num(val(r, k) * 1e3, 0); }
std::string mb(const Result* r, const char* k) { return num(val(r, k) / 1e6, 0); }
std::string ratio(double a, double b) { return num(a / b, 2, "x"); }

std::vector<int> ranks_of(const FsdpArgs& a) {
  std::vector<int> out;
  for (const auto& s : split_csv(a.nprocs)) out.push_back(std::stoi(s));
  return out;
}

// The model-state bound of the target: 16 bytes per parameter / P + 2 x the largest unit
// (fp32 parameters of one block: 4 bytes each).
double state_bound(const ModelShape& s, int ranks) {
  const double root = double(s.total_params() - s.layers * s.block_params());
  const double unit = std::max(double(s.block_params()), root);
  return 16.0 * double(s.total_params()) / ranks + 2 * 4 * unit;
}

void print_step_table(const FsdpReport& rep) {
  Table t({"strategy", "ranks", "step ms", "fwd/bwd/opt ms", "step/DDP", "PyTorch step ms",
           "PyTorch fwd/bwd/opt", "ours/PyTorch", "loss first ours/PyTorch",
           "loss last ours/PyTorch", "param sum - DDP's", "verified", "rounds"});
  for (const int n : ranks_of(rep.a))
    for (const auto& s : split_csv(rep.a.strategies)) {
      const Result* r = rep.get("lockstep", s, n);
      const Result* p = rep.get("pytorch", s, n);
      const Result* ddp = rep.get("lockstep", "ddp", n);
      t.add({s, std::to_string(n), ms(r, "step"),
             ms(r, "forward") + "/" + ms(r, "backward") + "/" + ms(r, "optimizer"),
             ratio(val(r, "step"), val(ddp, "step")), ms(p, "step"),
             ms(p, "forward") + "/" + ms(p, "backward") + "/" + ms(p, "optimizer"),
             ratio(val(r, "step"), val(p, "step")),
             num(val(r, "loss_first"), 5) + "/" + num(val(p, "loss_first"), 5),
             num(val(r, "loss_last"), 5) + "/" + num(val(p, "loss_last"), 5),
             num(val(r, "param_sum") - val(ddp, "param_sum"), 4),
             val(r, "verified") == 1 ? "yes" : "NO",
             std::to_string(rep.rounds.count(result_key("lockstep", s, n))
                                ? rep.rounds.at(result_key("lockstep", s, n))
                                : 0)});
    }
  std::printf(
      "\nstep time (median of %d steps, median over rounds; rank 0); PyTorch = its own FSDP "
      "(fully_shard over Gloo) or DDP for the ddp row; load average before %s, after %s\n%s",
      rep.a.steps, rep.load_before.c_str(), rep.load_after.c_str(), t.str().c_str());
}

void print_memory_table(const FsdpReport& rep) {
  Table t({"strategy", "ranks", "state peak MB", "of which full", "state after step", "16Ψ/P+2U",
           "tensors peak", "activations", "tensors building", "VmData built/end", "peak RSS MB",
           "RSS at init", "PyTorch peak RSS", "PyTorch RSS init", "PyTorch state after step"});
  for (const int n : ranks_of(rep.a))
    for (const auto& s : split_csv(rep.a.strategies)) {
      const Result* r = rep.get("lockstep", s, n);
      const Result* p = rep.get("pytorch", s, n);
      const double shared = val(r, "shared_bytes");
      t.add({s, std::to_string(n), mb(r, "state_peak"), mb(r, "state_peak_full"),
             mb(r, "state_end"), num(state_bound(rep.a.shape, n) / 1e6, 0),
             num((val(r, "tensor_peak") + shared) / 1e6, 0), mb(r, "activations"),
             mb(r, "tensor_peak_build"), mb(r, "vmdata_built") + "/" + mb(r, "vmdata_end"),
             mb(r, "rss_peak"), mb(r, "rss_base"), mb(p, "rss_peak"), mb(p, "rss_base"),
             mb(p, "state_end")});
    }
  std::printf(
      "\nmemory per rank (MB = 1e6 bytes; the maximum over ranks): state = parameters "
      "(gathered and shards) + gradients + AdamW state, storage bytes, peak over the warm-up "
      "steps' unit boundaries (of which full: the module's own parameters and gradients, i.e. "
      "the replica or the gathered units); tensors peak = every CPU tensor storage (counting "
      "allocator; "
      "DDP's shared buckets added); activations = what a forward adds beyond the state; tensors "
      "building = the peak while the model, the wrapper and the optimizer are built; VmData = the "
      "private address space RLIMIT_DATA caps, after building / at the end; RSS = "
      "VmHWM (peak) and VmRSS after init, whole process\n%s",
      t.str().c_str());
}

void print_profile(const FsdpReport& rep) {
  Table t({"ranks", "gather 1 unit", "gather, fresh buffer", "reduce-scatter 1 unit",
           "flat grad copy", "block fwd", "block bwd", "fwd chain (gather+fwd) x L",
           "L x block fwd"});
  for (const int n : ranks_of(rep.a)) {
    const Result* r = rep.get("lockstep", "full_shard", n);
    if (!r || !r->count("prof_gather")) continue;
    t.add({std::to_string(n), ms(r, "prof_gather"), ms(r, "prof_gather_alloc"),
           ms(r, "prof_reduce_scatter"), ms(r, "prof_flat_grad"), ms(r, "prof_block_fwd"),
           ms(r, "prof_block_bwd"), ms(r, "prof_fwd_chain"),
           num(val(r, "prof_block_fwd") * rep.a.shape.layers * 1e3, 0)});
  }
  std::printf(
      "\nprofile: FSDP's per-unit costs in isolation (ms, medians, every rank at once; "
      "unit = one block, %.1fM parameters)\n%s",
      rep.a.shape.block_params() / 1e6, t.str().c_str());
}

void print_caps(const FsdpReport& rep) {
  if (rep.caps.empty()) return;
  Table t({"strategy", "ranks", "malloc", "cap (RLIMIT_DATA)", "largest layers", "parameters",
           "first failing", "why", "peak RSS MB at largest", "VmData at init MB", "attempts"});
  for (const auto& c : rep.caps) {
    ModelShape s = rep.a.shape;
    s.layers = c.best_layers;
    std::string tries;
    for (const auto& [l, ok] : c.attempts)
      tries += (tries.empty() ? "" : " ") + std::to_string(l) + (ok ? "+" : "-");
    t.add({c.strategy, std::to_string(c.ranks), c.malloc_mode, format_size(c.cap),
           std::to_string(c.best_layers),
           c.best_layers ? num(s.total_params() / 1e6, 1, "M") : "none",
           c.first_failing < 0 ? "none" : std::to_string(c.first_failing), c.failure,
           mb(&c.at_best, "rss_peak"), mb(&c.at_best, "vmdata_base"), tries});
  }
  std::printf("\nlargest model under a per-rank cap (%d steps each; DDP with private buckets)\n%s",
              rep.a.cap_steps, t.str().c_str());
}

void target(const char* what, double v, double bound, bool at_most, const char* unit = "x") {
  if (std::isnan(v)) return std::printf("target %s: not measured\n", what), void();
  const bool met = at_most ? v <= bound : v >= bound;
  std::printf("target %s: %.2f%s (%s %.2f%s)  %s\n", what, v, unit, at_most ? "<=" : ">=", bound,
              unit, met ? "MET" : "MISSED");
}

// The targets at 2 ranks (or the first rank count measured).
void print_targets(const FsdpReport& rep) {
  const int n = ranks_of(rep.a).front();
  const Result* fs = rep.get("lockstep", "full_shard", n);
  const Result* ddp = rep.get("lockstep", "ddp", n);
  const Result* peer = rep.get("pytorch", "full_shard", n);
  std::printf("\ntargets (%d ranks, fp32 AdamW):\n", n);
  target("FULL_SHARD peak model state <= 16Ψ/P + 2 x largest unit (MB)",
         val(fs, "state_peak") / 1e6, state_bound(rep.a.shape, n) / 1e6, true, " MB");
  target("FULL_SHARD step / DDP step", val(fs, "step") / val(ddp, "step"), 1.25, true);
  target("FULL_SHARD step / PyTorch FSDP step", val(fs, "step") / val(peer, "step"), 0.8, true);
  for (size_t i = 0; i + 1 < rep.caps.size(); i += 2) {
    const auto &d = rep.caps[i], &f = rep.caps[i + 1];
    ModelShape sd = rep.a.shape, sf = rep.a.shape;
    sd.layers = d.best_layers;
    sf.layers = f.best_layers;
    const double r = d.best_layers ? double(sf.total_params()) / double(sd.total_params()) : NAN;
    target(("largest model under the cap, FULL_SHARD / DDP parameters, " + std::to_string(d.ranks) +
            " ranks, malloc " + d.malloc_mode)
               .c_str(),
           r,
           d.ranks == 2   ? 1.9  // the targets under lockstep-run's defaults (docs/benchmarks.md)
           : d.ranks == 4 ? 3.5
                          : 0.85 * d.ranks,
           false);
  }
  if (!rep.grad_check.empty())
    std::printf(
        "PyTorch fully_shard gradients vs one process on the whole batch: max |diff| / max |ref| "
        "%.2g, "
        "scale %.3f (1 = averaged, %d = summed)\n",
        val(&rep.grad_check, "grad_rel_diff"), val(&rep.grad_check, "grad_scale"), n);
  if (!rep.peer_note.empty()) std::printf("PyTorch peer: %s\n", rep.peer_note.c_str());
}

}  // namespace

void print_report(const FsdpReport& rep) {
  print_step_table(rep);
  print_memory_table(rep);
  if (rep.a.profile) print_profile(rep);
  print_caps(rep);
  print_targets(rep);
}

void write_csv(const FsdpReport& rep, const std::string& path) {
  std::set<std::string> keys;
  for (const auto& [k, r] : rep.medians)
    for (const auto& [key, v] : r) keys.insert(key);
  std::ofstream csv(path);
  csv << "impl,strategy,ranks";
  for (const auto& k : keys) csv << "," << k;
  csv << ",load_before,load_after\n";
  for (const auto& [k, r] : rep.medians) {
    std::string row = k;
    for (auto& c : row)
      if (c == '|') c = ',';
    csv << row;
    for (const auto& key : keys) csv << "," << (r.count(key) ? fmt(r.at(key), 6) : "");
    csv << "," << rep.load_before << "," << rep.load_after << "\n";
  }
  if (rep.caps.empty()) return;
  const std::string cap_path = path.substr(0, path.rfind(".csv")) + "-cap.csv";
  std::ofstream cap(cap_path);
  cap << "strategy,malloc,ranks,cap_bytes,largest_layers,largest_params,first_failing,failure,"
         "rss_peak_at_largest,attempts\n";
  for (const auto& c : rep.caps) {
    ModelShape s = rep.a.shape;
    s.layers = c.best_layers;
    cap << c.strategy << "," << c.malloc_mode << "," << c.ranks << "," << c.cap << ","
        << c.best_layers << "," << (c.best_layers ? s.total_params() : 0) << "," << c.first_failing
        << ",\"" << c.failure << "\"," << val(&c.at_best, "rss_peak") << ",";
    for (const auto& [l, ok] : c.attempts) cap << l << (ok ? "+" : "-") << " ";
    cap << "\n";
  }
}

}  // namespace lockstep::bench
