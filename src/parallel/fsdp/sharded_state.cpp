// FSDP's sharded checkpoints: one archive per rank with its shards, the units' layout and
// the optimizer's state for the shards; loaded at any world size by copying, for each
// unit, the part of the flat order this rank now owns out of the files that hold it
// (docs/fsdp.md, "State dicts"; the file format in docs/formats.md).
#include <lockstep/compat.h>
#include <lockstep/error.h>
#include <lockstep/numerics/anyprecision_adamw.h>
#include <lockstep/parallel/fsdp/core.h>

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "flat_unit.h"

namespace lockstep::fsdp {
namespace {

namespace fs = std::filesystem;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;
constexpr const char* kFormat = "lockstep-fsdp-shard-v1";

// One line per parameter: "name 7,9". Equal layouts mean the flat orders agree.
std::string layout_of(const FlatUnit& u) {
  std::ostringstream os;
  for (size_t i = 0; i < u.params().size(); ++i) {
    os << u.param_names()[i] << ' ';
    const auto sizes = u.params()[i].sizes();
    for (size_t d = 0; d < sizes.size(); ++d) os << (d ? "," : "") << sizes[d];
    os << '\n';
  }
  return os.str();
}

// --- optimizer state: the per-element tensors of SGD, Adam, AdamW and AnyPrecision AdamW,
// and their step ---

using lockstep::numerics::AnyPrecisionAdamW;
using lockstep::numerics::AnyPrecisionAdamWParamState;

struct OptState {
  // "none" (no state yet), "sgd", "adam", "adamw", "anyprecision_adamw"
  std::string kind = "none";
  int64_t step = 0;
  std::map<std::string, at::Tensor> tensors;  // each as long as the shard, in its own dtype
};

std::string optimizer_kind(const torch::optim::Optimizer& opt) {
  if (dynamic_cast<const AnyPrecisionAdamW*>(&opt)) return "anyprecision_adamw";
  if (dynamic_cast<const torch::optim::AdamW*>(&opt)) return "adamw";
  if (dynamic_cast<const torch::optim::Adam*>(&opt)) return "adam";
  if (dynamic_cast<const torch::optim::SGD*>(&opt)) return "sgd";
  throw InvalidArgument(
      "FSDP sharded checkpoints hold the optimizer state of SGD, Adam, AdamW and "
      "AnyPrecisionAdamW only; "
      "save the state of other optimizers with the full state dict");
}

template <class S>
void adam_like_to(const S& s, OptState& out) {
  out.step = s.step();
  out.tensors["exp_avg"] = s.exp_avg();
  out.tensors["exp_avg_sq"] = s.exp_avg_sq();
  out.tensors["max_exp_avg_sq"] = s.max_exp_avg_sq();
}

void anyprecision_to(const AnyPrecisionAdamWParamState& s, OptState& out) {
  out.step = s.step();
  out.tensors["exp_avg"] = s.exp_avg();
  out.tensors["exp_avg_sq"] = s.exp_avg_sq();
  out.tensors["compensation"] = s.compensation();  // undefined without Kahan: dropped
}

OptState state_of(const torch::optim::Optimizer& opt, const at::Tensor& shard) {
  OptState out;
  const auto it = opt.state().find(lockstep::compat::optimizer_state_key(opt.state(), shard));
  if (it == opt.state().end()) return out;
  out.kind = optimizer_kind(opt);
  if (const auto* p = dynamic_cast<const AnyPrecisionAdamWParamState*>(it->second.get()))
    anyprecision_to(*p, out);
  else if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get()))
    adam_like_to(*s, out);
  else if (const auto* a = dynamic_cast<const torch::optim::AdamParamState*>(it->second.get()))
    adam_like_to(*a, out);
  else if (const auto* g = dynamic_cast<const torch::optim::SGDParamState*>(it->second.get()))
    out.tensors["momentum_buffer"] = g->momentum_buffer();
  for (auto it2 = out.tensors.begin(); it2 != out.tensors.end();)
    it2 = it2->second.defined() ? std::next(it2) : out.tensors.erase(it2);
  return out;
}

template <class S>
std::unique_ptr<S> adam_like_from(const OptState& st) {
  auto s = std::make_unique<S>();
  s->step(st.step);
  s->exp_avg(st.tensors.at("exp_avg"));
  s->exp_avg_sq(st.tensors.at("exp_avg_sq"));
  if (st.tensors.count("max_exp_avg_sq") != 0) s->max_exp_avg_sq(st.tensors.at("max_exp_avg_sq"));
  return s;
}

void set_state(torch::optim::Optimizer& opt, const at::Tensor& shard, const OptState& st) {
  auto& slot = opt.state()[lockstep::compat::optimizer_state_key(opt.state(), shard)];
  if (st.kind == "adamw") slot = adam_like_from<torch::optim::AdamWParamState>(st);
  if (st.kind == "adam") slot = adam_like_from<torch::optim::AdamParamState>(st);
  if (st.kind == "anyprecision_adamw") {
    auto s = std::make_unique<AnyPrecisionAdamWParamState>();
    s->step(st.step);
    s->exp_avg(st.tensors.at("exp_avg"));
    s->exp_avg_sq(st.tensors.at("exp_avg_sq"));
    if (st.tensors.count("compensation") != 0) s->compensation(st.tensors.at("compensation"));
    slot = std::move(s);
  }
  if (st.kind == "sgd") {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(st.tensors.at("momentum_buffer"));
    slot = std::move(s);
  }
}

// --- reading ---------------------------------------------------------------------------

std::string read_string(InputArchive& ar, const std::string& key) {
  c10::IValue v;
  ar.read(key, v);
  return v.toStringRef();
}
int64_t read_int(InputArchive& ar, const std::string& key) {
  c10::IValue v;
  ar.read(key, v);
  return v.toInt();
}
at::Tensor read_tensor(InputArchive& ar, const std::string& key) {
  at::Tensor t;
  ar.read(key, t);
  return t;
}

// One rank's file of a checkpoint, parsed lazily.
struct ShardFile {
  std::string name;
  InputArchive archive;
  bool sharded = true;
};

using ShardFiles = std::map<int, std::unique_ptr<ShardFile>>;

std::unique_ptr<ShardFile> open_file(const std::function<std::string(const std::string&)>& read,
                                     int rank) {
  auto f = std::make_unique<ShardFile>();
  f->name = FSDPCore::sharded_file_name(rank);
  const std::string bytes = read(f->name);
  try {
    f->archive.load_from(bytes.data(), bytes.size());
    if (read_string(f->archive, "format") != kFormat) throw Error("unknown format");
    f->sharded = read_int(f->archive, "sharded") != 0;
  } catch (const std::exception& e) {
    throw Error(lockstep::detail::concat("FSDP checkpoint file ", f->name, " is not a ", kFormat,
                                         " archive (", e.what(),
                                         "); was it written by save_sharded_state?"));
  }
  return f;
}

// Copies [lo, hi) of a unit's flat order from the file's `key` tensor into `dst` (which
// starts at flat offset `dst_offset`).
void copy_range(InputArchive& unit_ar, const std::string& key, int64_t file_offset,
                const at::Tensor& dst, int64_t dst_offset, int64_t lo, int64_t hi) {
  at::Tensor src = read_tensor(unit_ar, key);
  at::NoGradGuard no_grad;
  dst.narrow(0, lo - dst_offset, hi - lo).copy_(src.narrow(0, lo - file_offset, hi - lo));
}

void check_layout(const FlatUnit& u, const std::string& file, const std::string& name,
                  const std::string& layout) {
  const std::string mine = layout_of(u);
  if (name == u.name() && layout == mine) return;
  std::istringstream a(layout), b(mine);
  std::string la, lb;
  while (std::getline(a, la) && std::getline(b, lb) && la == lb) {
  }
  throw InvalidArgument(lockstep::detail::concat(
      "FSDP checkpoint ", file, " does not match this model: unit '", u.name(), "' holds [",
      lb.empty() ? "nothing more" : lb, "] here but [", la.empty() ? "nothing more" : la,
      "] in the checkpoint (unit '", name,
      "'); it was written for a different model or wrap policy"));
}

// The optimizer state of [lo, hi) from one file into `st` (tensors as long as the shard).
void read_opt_range(InputArchive& ua, const std::string& file, const FlatUnit& u,
                    const std::string& want_kind, int64_t f_off, int64_t lo, int64_t hi,
                    OptState& st) {
  const std::string kind = read_string(ua, "opt_kind");
  if (want_kind == "none" || kind == "none") return;
  if (kind != want_kind)
    throw InvalidArgument(lockstep::detail::concat("FSDP checkpoint ", file, " holds ", kind,
                                                   " state but the optimizer is ", want_kind));
  st.kind = kind;
  st.step = read_int(ua, "opt_step");
  for (const char* name :
       {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "compensation"}) {
    at::Tensor src;
    if (!ua.try_read(std::string("opt.") + name, src)) continue;
    auto& dst = st.tensors[name];
    // In the saved dtype: AnyPrecisionAdamW's states may differ from the shard's.
    if (!dst.defined())
      dst = at::zeros_like(u.shard().detach(), at::TensorOptions().dtype(src.scalar_type()));
    at::NoGradGuard no_grad;
    dst.narrow(0, lo - u.shard_offset(), hi - lo).copy_(src.narrow(0, lo - f_off, hi - lo));
  }
}

// Unit k of the checkpoint into `u`: for each part of this rank's range, the file that
// holds it (file q holds [q * n_old, (q + 1) * n_old) when sharded; file 0 all otherwise).
void load_unit(FlatUnit& u, size_t k, ShardFiles& files,
               const std::function<std::string(const std::string&)>& read,
               torch::optim::Optimizer* opt, const std::string& want_kind) {
  const std::string key = "unit" + std::to_string(k);
  InputArchive first_unit;
  files.at(0)->archive.read(key, first_unit);
  check_layout(u, files.at(0)->name, read_string(first_unit, "name"),
               read_string(first_unit, "layout"));
  const bool sharded = files.at(0)->sharded;
  const int64_t n_old = read_tensor(first_unit, "shard").numel();
  const int64_t lo = u.shard_offset();
  const int64_t hi = std::min(u.numel(), lo + u.shard().numel());
  const at::Tensor& shard = u.shard();
  {
    at::NoGradGuard no_grad;
    shard.zero_();  // the padding
  }
  OptState st;
  for (int64_t pos = lo; pos < hi;) {
    const int q = sharded ? static_cast<int>(pos / n_old) : 0;
    if (files.count(q) == 0) files.emplace(q, open_file(read, q));
    InputArchive ua;
    files.at(q)->archive.read(key, ua);
    const int64_t f_off = read_int(ua, "offset");
    const int64_t end = std::min(hi, f_off + n_old);
    copy_range(ua, "shard", f_off, shard, lo, pos, end);
    read_opt_range(ua, files.at(q)->name, u, want_kind, f_off, pos, end, st);
    pos = end;
  }
  if (opt != nullptr && st.kind != "none") set_state(*opt, shard, st);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(
        lockstep::detail::concat("FSDP checkpoint file ", path, " is missing or unreadable; ",
                                 "every rank of the saving job wrote one, keep them together"));
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.flush();
  if (!out)
    throw Error(lockstep::detail::concat("cannot write ", path, " (disk full or no permission?)"));
}

}  // namespace

std::string FSDPCore::sharded_file_name(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "fsdp-shard-%05d.pt", rank);
  return buf;
}

std::string FSDPCore::sharded_state(const torch::optim::Optimizer* opt) const {
  OutputArchive ar;
  ar.write("format", c10::IValue(std::string(kFormat)));
  ar.write("world_size", c10::IValue(static_cast<int64_t>(group_->size())));
  ar.write("rank", c10::IValue(static_cast<int64_t>(group_->rank())));
  ar.write("sharded",
           c10::IValue(static_cast<int64_t>(options_.strategy != ShardingStrategy::NoShard)));
  ar.write("num_units", c10::IValue(static_cast<int64_t>(units_.size())));
  for (size_t k = 0; k < units_.size(); ++k) {
    const FlatUnit& u = *units_[k];
    OutputArchive ua(ar.compilation_unit());
    ua.write("name", c10::IValue(u.name()));
    ua.write("layout", c10::IValue(layout_of(u)));
    ua.write("numel", c10::IValue(u.numel()));
    ua.write("offset", c10::IValue(u.shard_offset()));
    ua.write("shard", u.shard().detach());
    const OptState st = opt != nullptr ? state_of(*opt, u.shard()) : OptState{};
    ua.write("opt_kind", c10::IValue(st.kind));
    ua.write("opt_step", c10::IValue(st.step));
    for (const auto& [key, t] : st.tensors) ua.write("opt." + key, t);
    ar.write("unit" + std::to_string(k), ua);
  }
  std::string bytes;
  ar.save_to([&bytes](const void* data, size_t n) {
    bytes.append(static_cast<const char*>(data), n);
    return n;
  });
  return bytes;
}

void FSDPCore::load_sharded_state(const std::function<std::string(const std::string&)>& read,
                                  torch::optim::Optimizer* opt) {
  LOCKSTEP_CHECK(!in_forward_ && !backward_started_,
                 "load_sharded_state: not allowed during forward or backward");
  for (auto& u : units_) u->free_full();  // gathered copies would be stale
  ShardFiles files;
  files.emplace(0, open_file(read, 0));
  ShardFile& first = *files.at(0);
  const int64_t saved_units = read_int(first.archive, "num_units");
  if (saved_units != static_cast<int64_t>(units_.size()))
    throw InvalidArgument(lockstep::detail::concat(
        "FSDP checkpoint ", first.name, " holds ", saved_units, " units, this model has ",
        units_.size(), ": it was written for a different model or wrap policy"));
  const std::string want_kind = opt != nullptr ? optimizer_kind(*opt) : "none";
  for (size_t k = 0; k < units_.size(); ++k) load_unit(*units_[k], k, files, read, opt, want_kind);
}

void FSDPCore::save_sharded_state(const std::string& dir, const torch::optim::Optimizer* opt) {
  const std::string tmp = dir + ".tmp", old = dir + ".old";
  const bool root = is_writer();
  // Hybrid: the first replica writes; the others hold the same shards.
  const bool writes = !options_.replicate_group || options_.replicate_group->rank() == 0;
  std::string failure;
  auto attempt = [&failure](const std::function<void()>& step) {
    if (!failure.empty()) return;
    try {
      step();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  };
  if (root)
    attempt([&] {
      fs::remove_all(tmp);  // leftovers of a crash during an earlier save
      fs::create_directories(tmp);
    });
  agree_or_throw(failure, "save_sharded_state(" + dir + ")");
  if (writes)
    attempt([&] { write_file(tmp + "/" + sharded_file_name(group_->rank()), sharded_state(opt)); });
  agree_or_throw(failure, "save_sharded_state(" + dir + ")");
  if (root)  // a crash between the renames leaves `old`, which load_sharded_state falls back to
    attempt([&] {
      fs::remove_all(old);
      if (fs::exists(dir)) fs::rename(dir, old);
      fs::rename(tmp, dir);
      fs::remove_all(old);
    });
  agree_or_throw(failure, "save_sharded_state(" + dir + ")");
}

void FSDPCore::load_sharded_state(const std::string& dir, torch::optim::Optimizer* opt) {
  std::string d = dir;
  if (!fs::exists(d) && fs::exists(dir + ".old")) d = dir + ".old";
  load_sharded_state([&d](const std::string& name) { return read_file(d + "/" + name); }, opt);
}

}  // namespace lockstep::fsdp
