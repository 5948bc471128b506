// HostStaging (reusable copies of storages) and the module snapshot; see the header.
#include "train/checkpoint/checkpoint_staging.h"

#include <lockstep/error.h>

#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstring>

namespace lockstep::train {
namespace {

// Large storages staged in the step are copied in chunks over the intra-op threads
// (train.threads). The deferred copy is not: on the idle-priority copy thread, chunks
// handed to the intra-op pool would run at normal priority and hold up the step's own
// parallel regions, which it is meant to stay out of.
constexpr int64_t kCopyGrain = int64_t(16) << 20;

void copy_bytes(void* dst, const void* src, int64_t n, bool parallel) {
  if (!parallel) {
    std::memcpy(dst, src, size_t(n));
    return;
  }
  at::parallel_for(0, n, kCopyGrain, [&](int64_t begin, int64_t end) {
    std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin,
                size_t(end - begin));
  });
}

void* bytes_of(const at::Storage& s) {
  return const_cast<void*>(static_cast<const void*>(s.data()));
}

}  // namespace

void HostStaging::begin(bool defer) {
  defer_ = defer;
  for (auto& [impl, slot] : slots_) slot.used = false;
}

at::Tensor HostStaging::stage(const at::Tensor& live) { return stage(live, !defer_); }

at::Tensor HostStaging::stage_now(const at::Tensor& live) { return stage(live, true); }

at::Tensor HostStaging::stage(const at::Tensor& live, bool now) {
  if (!live.defined()) return live;
  if (!live.device().is_cpu() || live.layout() != c10::kStrided || live.is_quantized())
    throw Error(lockstep::detail::concat(
        "asynchronous checkpoint: cannot stage a ", live.toString(),
        " tensor (dense CPU tensors only); set checkpoint.mode = \"sync\""));
  const at::Storage& src = live.storage();
  const int64_t n = int64_t(src.nbytes());
  Slot& slot = slots_[src.unsafeGetStorageImpl()];
  if (!slot.copy || int64_t(slot.copy.nbytes()) != n)
    slot.copy = at::Storage(at::Storage::use_byte_size_t(), size_t(n), c10::GetCPUAllocator(),
                            /*resizable=*/false);
  if (now && (!slot.used || slot.pending) && n > 0) {
    copy_bytes(bytes_of(slot.copy), src.data(), n, /*parallel=*/true);
    slot.pending = at::Storage();
  } else if (!now && !slot.used) {
    slot.pending = src;
  }
  slot.used = true;
  at::Tensor t = at::empty({0}, live.options().requires_grad(false));
  t.set_(slot.copy, live.storage_offset(), live.sizes(), live.strides());
  if (live.requires_grad()) t.requires_grad_(true);
  return t;
}

void HostStaging::end() {
  for (auto it = slots_.begin(); it != slots_.end();)
    it = it->second.used ? std::next(it) : slots_.erase(it);
}

void HostStaging::copy_pending() {
  for (auto& [impl, slot] : slots_) {
    if (!slot.pending) continue;
    if (slot.pending.nbytes() > 0)
      copy_bytes(bytes_of(slot.copy), slot.pending.data(), int64_t(slot.pending.nbytes()),
                 /*parallel=*/false);
    slot.pending = at::Storage();
  }
}

int64_t HostStaging::bytes() const {
  int64_t n = 0;
  for (const auto& [impl, slot] : slots_) n += int64_t(slot.copy.nbytes());
  return n;
}

std::vector<const void*> HostStaging::buffers() const {
  std::vector<const void*> out;
  for (const auto& [impl, slot] : slots_) out.push_back(bytes_of(slot.copy));
  std::sort(out.begin(), out.end());
  return out;
}

// ---------------------------------------------------------------------------------------
// The module: Module::save's walk, over staged tensors.

std::unique_ptr<ModuleSnapshot> snapshot_module(const torch::nn::Module& m, HostStaging& staging) {
  auto s = std::make_unique<ModuleSnapshot>();
  for (const auto& p : m.named_parameters(/*recurse=*/false))
    s->params.emplace_back(p.key(), staging.stage(p.value()));
  for (const auto& b : m.named_buffers(/*recurse=*/false))
    s->buffers.emplace_back(b.key(), staging.stage_now(b.value()));
  for (const auto& c : m.named_children())
    if (c.value()->is_serializable())
      s->children.emplace_back(c.key(), snapshot_module(*c.value(), staging));
  return s;
}

void ModuleSnapshot::write(torch::serialize::OutputArchive& ar) const {
  for (const auto& [name, t] : params) ar.write(name, t);
  for (const auto& [name, t] : buffers) ar.write(name, t, /*is_buffer=*/true);
  for (const auto& [name, child] : children) {
    torch::serialize::OutputArchive child_ar(ar.compilation_unit());
    child->write(child_ar);
    ar.write(name, child_ar);
  }
}

}  // namespace lockstep::train
