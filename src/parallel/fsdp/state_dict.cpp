// FSDP's full state dict: gathered one unit at a time onto rank 0, saved in the format
// of torch::save(module) (docs/fsdp.md, "State dicts").
#include <lockstep/error.h>
#include <lockstep/parallel/fsdp/core.h>

#include <ATen/ATen.h>
#include <torch/serialize/output-archive.h>

#include <cstdio>
#include <unordered_map>

#include "flat_unit.h"

namespace lockstep::fsdp {
namespace {

using ByImpl = std::unordered_map<const c10::TensorImpl*, at::Tensor>;

// Module::save's layout: own parameters, own buffers, then one nested archive per child.
void write_module(const torch::nn::Module& m, const ByImpl& values,
                  torch::serialize::OutputArchive& ar) {
  for (const auto& p : m.named_parameters(/*recurse=*/false))
    ar.write(p.key(), values.at(p.value().unsafeGetTensorImpl()));
  for (const auto& b : m.named_buffers(/*recurse=*/false))
    ar.write(b.key(), values.at(b.value().unsafeGetTensorImpl()), /*is_buffer=*/true);
  for (const auto& c : m.named_children()) {
    torch::serialize::OutputArchive sub(ar.compilation_unit());
    write_module(*c.value(), values, sub);
    ar.write(c.key(), sub);
  }
}

// Rank 0's copies of every parameter and buffer, keyed by tensor (empty elsewhere).
ByImpl gather_copies(std::vector<std::unique_ptr<FlatUnit>>& units,
                     const std::vector<at::Tensor>& buffers, bool keep) {
  ByImpl out;
  for (auto& u : units) {
    const at::Tensor flat = u->gather_master();  // the master dtype, one unit at a time
    if (!keep) continue;
    int64_t offset = 0;
    for (const auto& p : u->params()) {
      out.emplace(p.unsafeGetTensorImpl(),
                  flat.narrow(0, offset, p.numel()).view(p.sizes()).clone());
      offset += p.numel();
    }
  }
  if (keep)
    for (const auto& b : buffers) out.emplace(b.unsafeGetTensorImpl(), b.detach().clone());
  return out;
}

}  // namespace

torch::OrderedDict<std::string, at::Tensor> FSDPCore::full_state_dict() {
  LOCKSTEP_CHECK(!in_forward_ && !backward_started_,
                 "full_state_dict: not allowed during forward or backward");
  const ByImpl values = gather_copies(units_, buffers_, is_writer());
  torch::OrderedDict<std::string, at::Tensor> out;
  if (!is_writer()) return out;
  for (const auto& p : root_->named_parameters(true))
    out.insert(p.key(), values.at(p.value().unsafeGetTensorImpl()));
  for (const auto& b : root_->named_buffers(true))
    out.insert(b.key(), values.at(b.value().unsafeGetTensorImpl()));
  return out;
}

void FSDPCore::save_full_state_dict(const std::string& path) {
  LOCKSTEP_CHECK(!in_forward_ && !backward_started_,
                 "save_full_state_dict: not allowed during forward or backward");
  const ByImpl values = gather_copies(units_, buffers_, is_writer());
  std::string failure;
  if (is_writer()) {
    const std::string tmp = path + ".tmp";
    try {
      torch::serialize::OutputArchive ar;
      write_module(*root_, values, ar);
      ar.save_to(tmp);
      if (std::rename(tmp.c_str(), path.c_str()) != 0)
        failure = lockstep::detail::concat("cannot rename ", tmp, " to ", path);
    } catch (const std::exception& e) {
      std::remove(tmp.c_str());
      failure = e.what();
    }
  }
  agree_or_throw(failure, "save_full_state_dict(" + path + ")");
}

bool FSDPCore::is_writer() const {
  const auto& rep = options_.replicate_group;
  return group_->rank() == 0 && (!rep || rep->rank() == 0);
}

void FSDPCore::agree_or_throw(const std::string& failure, const std::string& what) {
  // The highest failing rank + 1, or 0: every rank learns whether all succeeded.
  at::Tensor failed = at::full({1}, failure.empty() ? 0 : group_->rank() + 1, at::kInt);
  group_->allreduce(failed, {comm::ReduceOp::Max, comm::Millis(0)})->wait();
  if (const auto& rep = options_.replicate_group)  // hybrid: the other replicas learn it too
    rep->allreduce(failed, {comm::ReduceOp::Max, comm::Millis(0)})->wait();
  const int who = failed.item<int>() - 1;
  if (who < 0) return;
  throw Error(lockstep::detail::concat(what, " failed on rank ", who, ": ",
                                       failure.empty() ? "see that rank's error" : failure));
}

}  // namespace lockstep::fsdp
