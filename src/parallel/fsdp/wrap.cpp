// fsdp::wrap's transparent wrapper, and the wrap policies; see wrap.h and options.h.
#include <lockstep/error.h>
#include <lockstep/parallel/fsdp/options.h>
#include <lockstep/parallel/fsdp/wrap.h>

#include <algorithm>
#include <ostream>

namespace lockstep::fsdp {

WrapBase::WrapBase(std::shared_ptr<torch::nn::Module> inner)
    : torch::nn::Module("lockstep::fsdp::Wrap"), inner_(std::move(inner)) {
  LOCKSTEP_CHECK(inner_ != nullptr, "fsdp::wrap: null module");
  // The inner module's own members under their own names: the wrapper adds no name level.
  for (const auto& p : inner_->named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (const auto& b : inner_->named_buffers(/*recurse=*/false))
    register_buffer(b.key(), b.value());
  for (const auto& c : inner_->named_children()) register_module(c.key(), c.value());
}

void WrapBase::pretty_print(std::ostream& stream) const {
  stream << "fsdp::Wrap(";
  inner_->pretty_print(stream);
  stream << ")";
}

WrapAnyImpl::WrapAnyImpl(torch::nn::AnyModule inner)
    : WrapBase(inner.ptr()), any_(std::move(inner)) {}

at::Tensor WrapAnyImpl::forward(const at::Tensor& x) {
  if (hooks_ == nullptr) return any_.forward(x);
  hooks_->pre_forward();
  at::Tensor out = any_.forward(x);
  hooks_->post_forward({out});
  return out;
}

torch::nn::Sequential wrap_children(const torch::nn::Sequential& seq) {
  torch::nn::Sequential out;
  const auto names = seq->named_children();
  size_t i = 0;
  for (const auto& any : *seq) out->push_back(names[i++].key(), WrapAny(any).ptr());
  return out;
}

const char* strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FullShard:
      return "full_shard";
    case ShardingStrategy::ShardGradOp:
      return "shard_grad_op";
    case ShardingStrategy::NoShard:
      return "no_shard";
    case ShardingStrategy::HybridShard:
      return "hybrid_shard";
  }
  return "?";
}

ShardingStrategy parse_strategy(const std::string& name) {
  for (auto s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                 ShardingStrategy::NoShard, ShardingStrategy::HybridShard})
    if (name == strategy_name(s)) return s;
  throw InvalidArgument(
      lockstep::detail::concat("unknown FSDP sharding strategy '", name,
                               "': use full_shard, shard_grad_op, no_shard or hybrid_shard"));
}

WrapPolicy wrap_all() {
  return [](const std::string&, const torch::nn::Module&, int64_t) { return true; };
}

WrapPolicy wrap_by_size(int64_t min_num_params) {
  return [min_num_params](const std::string&, const torch::nn::Module&, int64_t n) {
    return n >= min_num_params;
  };
}

WrapPolicy wrap_by_type(std::vector<std::string> types) {
  return [types = std::move(types)](const std::string&, const torch::nn::Module& m, int64_t) {
    return std::find(types.begin(), types.end(), m.name()) != types.end();
  };
}

}  // namespace lockstep::fsdp
