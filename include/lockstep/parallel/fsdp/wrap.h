// lockstep/parallel/fsdp/wrap.h: marking a layer as an FSDP unit.
//
// The C++ frontend has no module forward hooks, so a unit learns that its forward begins
// and ends from a wrapper the model puts in place of the layer:
//
//   struct Net : torch::nn::Module {
//     Net() {
//       for (int i = 0; i < 8; ++i)
//         blocks.push_back(register_module("block" + std::to_string(i),
//                                          lockstep::fsdp::wrap(Block(1024))));
//     }
//     std::vector<lockstep::fsdp::Wrapped<BlockImpl>> blocks;
//   };
//
// The wrapper is transparent: it registers the layer's own parameters, buffers and
// children under their own names, so `block0.fc.weight` is named as without it, a plain
// (non-FSDP) copy of the model loads FSDP's full state dict, and outside FSDP its forward
// is the layer's forward. Under FullyShardedDataParallel, each wrapper the wrap policy
// selects becomes a unit: the wrapper tells the unit when the forward begins (gather the
// parameters) and ends (free them, and attach the pre-backward hooks to the outputs).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace lockstep::fsdp {

// What FSDP plugs into a wrapper that became a unit.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void pre_forward() = 0;
  // `outputs`: the forward's tensors (those of a tuple or vector too).
  virtual void post_forward(const std::vector<at::Tensor>& outputs) = 0;
};

namespace internal {
inline void collect(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void collect(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <class... T>
void collect(const std::tuple<T...>& t, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... x) { (collect(x, out), ...); }, t);
}
template <class T>
void collect(const T&, std::vector<at::Tensor>&) {}  // not a tensor: nothing to hook
}  // namespace internal

// The non-template part: what FSDP finds when it walks the model.
class WrapBase : public torch::nn::Module {
 public:
  const std::shared_ptr<torch::nn::Module>& inner() const { return inner_; }
  // Set by FSDP for the wrappers that became units; null otherwise.
  void set_hooks(UnitHooks* hooks) { hooks_ = hooks; }
  void pretty_print(std::ostream& stream) const override;

 protected:
  explicit WrapBase(std::shared_ptr<torch::nn::Module> inner);
  std::shared_ptr<torch::nn::Module> inner_;
  UnitHooks* hooks_ = nullptr;
};

template <class M>
class WrapImpl : public WrapBase {
 public:
  explicit WrapImpl(std::shared_ptr<M> inner) : WrapBase(inner), typed_(std::move(inner)) {}

  template <class... A>
  auto forward(A&&... args) {
    if (hooks_ == nullptr) return typed_->forward(std::forward<A>(args)...);
    hooks_->pre_forward();
    auto out = typed_->forward(std::forward<A>(args)...);
    std::vector<at::Tensor> tensors;
    internal::collect(out, tensors);
    hooks_->post_forward(tensors);
    return out;
  }
  template <class... A>
  auto operator()(A&&... args) {
    return forward(std::forward<A>(args)...);
  }
  const std::shared_ptr<M>& module() const { return typed_; }
  M* operator->() const { return typed_.get(); }

 private:
  std::shared_ptr<M> typed_;
};

template <class M>
class Wrapped : public torch::nn::ModuleHolder<WrapImpl<M>> {
 public:
  using torch::nn::ModuleHolder<WrapImpl<M>>::ModuleHolder;
  // ModuleHolder's own operator() cannot see a template forward().
  template <class... A>
  auto operator()(A&&... args) {
    return this->get()->forward(std::forward<A>(args)...);
  }
};

// A type-erased wrapper for the children of a torch::nn::Sequential (tensor in, tensor
// out, as Sequential chains them).
class WrapAnyImpl : public WrapBase {
 public:
  explicit WrapAnyImpl(torch::nn::AnyModule inner);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::AnyModule any_;
};
TORCH_MODULE(WrapAny);

// Auto-wrap of a Sequential: a new Sequential of the same children (same names, same
// parameter tensors), each behind a wrapper, so that the wrap policy can make each child
// a unit. Use it in place of the original: `seq = register_module("seq", wrap_children(seq))`.
torch::nn::Sequential wrap_children(const torch::nn::Sequential& seq);

template <class M>
Wrapped<M> wrap(std::shared_ptr<M> module) {
  return Wrapped<M>(std::make_shared<WrapImpl<M>>(std::move(module)));
}
template <class M>
Wrapped<M> wrap(const torch::nn::ModuleHolder<M>& holder) {
  return wrap(holder.ptr());
}

}  // namespace lockstep::fsdp
