// The optimizer's and FSDP's snapshots (checkpoint_staging.h): the archives
// torch::optim::serialize and FSDPCore::sharded_state write, over staged tensors.
#include "train/checkpoint/checkpoint_staging.h"

#include <lockstep/compat.h>
#include <lockstep/error.h>
#include <lockstep/numerics/anyprecision_adamw.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>

#include <sstream>
#include <type_traits>
#include <utility>

namespace lockstep::train {
namespace {

using lockstep::numerics::AnyPrecisionAdamW;
using lockstep::numerics::AnyPrecisionAdamWParamState;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

// The key type of an optimizer's state map: the parameter's TensorImpl address as text in
// libtorch 1.x, the address itself in 2.x.
using StateKey =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state().begin()->first)>;

// How torch's serializer names a parameter in an optimizer archive: its TensorImpl's address,
// in hex where the state is keyed by text (libtorch 1.x: c10::guts::to_string), in decimal
// where it is keyed by the pointer (2.x: std::to_string of the integer, read back with
// std::stoull, so a hex name would load every state onto one key).
std::string address_of(const void* p) {
  if constexpr (std::is_same_v<StateKey, std::string>) {
    std::ostringstream os;
    os << p;
    return os.str();
  } else {
    return std::to_string(reinterpret_cast<size_t>(p));
  }
}

template <class K>
std::string key_text(const K& key) {
  if constexpr (std::is_same_v<K, std::string>)
    return key;
  else
    return address_of(static_cast<const void*>(key));
}

template <class S>
void stage_adam_like(S& s, HostStaging& staging) {
  s.exp_avg(staging.stage(s.exp_avg()));
  s.exp_avg_sq(staging.stage(s.exp_avg_sq()));
  s.max_exp_avg_sq(staging.stage(s.max_exp_avg_sq()));
}

// A copy of one parameter's state over staged tensors.
std::unique_ptr<torch::optim::OptimizerParamState> staged_state(
    const torch::optim::OptimizerParamState& live, HostStaging& staging) {
  auto s = live.clone();  // shallow: the tensors are replaced below
  if (auto* a = dynamic_cast<AnyPrecisionAdamWParamState*>(s.get())) {
    a->exp_avg(staging.stage(a->exp_avg()));
    a->exp_avg_sq(staging.stage(a->exp_avg_sq()));
    a->compensation(staging.stage(a->compensation()));
  } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(s.get())) {
    stage_adam_like(*w, staging);
  } else if (auto* d = dynamic_cast<torch::optim::AdamParamState*>(s.get())) {
    stage_adam_like(*d, staging);
  } else if (auto* g = dynamic_cast<torch::optim::SGDParamState*>(s.get())) {
    g->momentum_buffer(staging.stage(g->momentum_buffer()));
  } else {
    throw Error(
        "asynchronous checkpoint: cannot copy this optimizer's state (SGD, Adam, AdamW and "
        "AnyPrecisionAdamW only); set checkpoint.mode = \"sync\"");
  }
  return s;
}

// What FSDPCore names the optimizer in its shard files (sharded_state.cpp's optimizer_kind).
std::string fsdp_optimizer_kind(const torch::optim::Optimizer& opt) {
  if (dynamic_cast<const AnyPrecisionAdamW*>(&opt)) return "anyprecision_adamw";
  if (dynamic_cast<const torch::optim::AdamW*>(&opt)) return "adamw";
  if (dynamic_cast<const torch::optim::Adam*>(&opt)) return "adam";
  if (dynamic_cast<const torch::optim::SGD*>(&opt)) return "sgd";
  throw Error(
      "asynchronous checkpoint: FSDP shard files hold the state of SGD, Adam, AdamW and "
      "AnyPrecisionAdamW only; set checkpoint.mode = \"sync\"");
}

// The per-element tensors FSDP writes for one shard ("opt.<name>"), by name, staged.
std::map<std::string, at::Tensor> fsdp_state_tensors(const torch::optim::OptimizerParamState& st,
                                                     HostStaging& staging, int64_t* step) {
  std::map<std::string, at::Tensor> t;
  if (const auto* p = dynamic_cast<const AnyPrecisionAdamWParamState*>(&st)) {
    *step = p->step();
    t = {{"exp_avg", p->exp_avg()},
         {"exp_avg_sq", p->exp_avg_sq()},
         {"compensation", p->compensation()}};
  } else if (const auto* w = dynamic_cast<const torch::optim::AdamWParamState*>(&st)) {
    *step = w->step();
    t = {{"exp_avg", w->exp_avg()},
         {"exp_avg_sq", w->exp_avg_sq()},
         {"max_exp_avg_sq", w->max_exp_avg_sq()}};
  } else if (const auto* a = dynamic_cast<const torch::optim::AdamParamState*>(&st)) {
    *step = a->step();
    t = {{"exp_avg", a->exp_avg()},
         {"exp_avg_sq", a->exp_avg_sq()},
         {"max_exp_avg_sq", a->max_exp_avg_sq()}};
  } else if (const auto* g = dynamic_cast<const torch::optim::SGDParamState*>(&st)) {
    t = {{"momentum_buffer", g->momentum_buffer()}};
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, live] : t)
    if (live.defined()) out[name] = staging.stage(live);
  return out;
}

c10::IValue read_value(InputArchive& ar, const std::string& key) {
  c10::IValue v;
  ar.read(key, v);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The optimizer

void check_snapshot_supported(const torch::optim::Optimizer& opt) {
  (void)fsdp_optimizer_kind(opt);  // the same four optimizers
}

std::unique_ptr<OptimizerSnapshot> snapshot_optimizer(const torch::optim::Optimizer& opt,
                                                      HostStaging& staging) {
  auto s = std::make_unique<OptimizerSnapshot>();
  for (const auto& [key, state] : opt.state())  // the live map's order: torch writes in it
    s->state.emplace_back(key_text(key), staged_state(*state, staging));
  for (const auto& g : opt.param_groups()) {
    OptimizerSnapshot::Group group;
    for (const auto& p : g.params()) group.params.push_back(address_of(p.unsafeGetTensorImpl()));
    group.options = g.options().clone();
    s->groups.push_back(std::move(group));
  }
  return s;
}

// torch::optim::serialize(archive, optimizer), field for field.
void OptimizerSnapshot::write(OutputArchive& ar) const {
  ar.write("pytorch_version", c10::IValue("1.5.0"));
  OutputArchive state_ar(ar.compilation_unit());
  for (const auto& [key, st] : state) {
    OutputArchive one(state_ar.compilation_unit());
    st->serialize(one);
    state_ar.write(key, one);
  }
  ar.write("state", state_ar);
  OutputArchive groups_ar(ar.compilation_unit());
  groups_ar.write("param_groups/size", torch::tensor(static_cast<int64_t>(groups.size())));
  for (size_t i = 0; i < groups.size(); ++i) {
    OutputArchive group_ar(groups_ar.compilation_unit());
    group_ar.write("params/size", torch::tensor(static_cast<int64_t>(groups[i].params.size())));
    for (size_t k = 0; k < groups[i].params.size(); ++k)
      group_ar.write("params/" + std::to_string(k), c10::IValue(groups[i].params[k]));
    OutputArchive options_ar(group_ar.compilation_unit());
    groups[i].options->serialize(options_ar);
    group_ar.write("options", options_ar);
    groups_ar.write("param_groups/" + std::to_string(i), group_ar);
  }
  ar.write("param_groups", groups_ar);
}

// ---------------------------------------------------------------------------------------
// FSDP's shard file

FsdpShardLayout read_fsdp_layout(const fsdp::FSDPCore& core) {
  const std::string bytes = core.sharded_state(nullptr);
  InputArchive ar;
  ar.load_from(bytes.data(), bytes.size());
  FsdpShardLayout l;
  l.format = read_value(ar, "format").toStringRef();
  l.world_size = read_value(ar, "world_size").toInt();
  l.rank = read_value(ar, "rank").toInt();
  l.sharded = read_value(ar, "sharded").toInt();
  const int64_t n = read_value(ar, "num_units").toInt();
  for (int64_t k = 0; k < n; ++k) {
    InputArchive ua;
    ar.read("unit" + std::to_string(k), ua);
    FsdpShardLayout::Unit u;
    u.name = read_value(ua, "name").toStringRef();
    u.layout = read_value(ua, "layout").toStringRef();
    u.numel = read_value(ua, "numel").toInt();
    u.offset = read_value(ua, "offset").toInt();
    l.units.push_back(std::move(u));
  }
  return l;
}

std::unique_ptr<FsdpShardSnapshot> snapshot_fsdp(const fsdp::FSDPCore& core,
                                                 const FsdpShardLayout& layout,
                                                 const torch::optim::Optimizer& opt,
                                                 HostStaging& staging) {
  auto s = std::make_unique<FsdpShardSnapshot>();
  s->layout = &layout;
  const std::vector<at::Tensor> shards = core.parameters();
  LOCKSTEP_CHECK_EQ(shards.size(), layout.units.size());
  for (const auto& shard : shards) {
    FsdpShardSnapshot::Unit u;
    u.shard = staging.stage(shard.detach());
    const auto it = opt.state().find(compat::optimizer_state_key(opt.state(), shard));
    if (it != opt.state().end()) {
      u.opt_kind = fsdp_optimizer_kind(opt);
      u.opt = fsdp_state_tensors(*it->second, staging, &u.opt_step);
    }
    s->units.push_back(std::move(u));
  }
  return s;
}

// FSDPCore::sharded_state's archive, key for key.
void FsdpShardSnapshot::write(OutputArchive& ar) const {
  ar.write("format", c10::IValue(layout->format));
  ar.write("world_size", c10::IValue(layout->world_size));
  ar.write("rank", c10::IValue(layout->rank));
  ar.write("sharded", c10::IValue(layout->sharded));
  ar.write("num_units", c10::IValue(static_cast<int64_t>(units.size())));
  for (size_t k = 0; k < units.size(); ++k) {
    const FsdpShardLayout::Unit& l = layout->units[k];
    const Unit& u = units[k];
    OutputArchive ua(ar.compilation_unit());
    ua.write("name", c10::IValue(l.name));
    ua.write("layout", c10::IValue(l.layout));
    ua.write("numel", c10::IValue(l.numel));
    ua.write("offset", c10::IValue(l.offset));
    // A fresh detached tensor, as sharded_state writes: torch's pickler memoizes a tensor
    // only when something else holds it too, and the memo changes the bytes.
    ua.write("shard", u.shard.detach());
    ua.write("opt_kind", c10::IValue(u.opt_kind));
    ua.write("opt_step", c10::IValue(u.opt_step));
    for (const auto& [key, t] : u.opt) ua.write("opt." + key, t);
    ar.write("unit" + std::to_string(k), ua);
  }
}

}  // namespace lockstep::train
