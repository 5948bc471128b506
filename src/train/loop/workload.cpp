#include <lockstep/train/config.h>
#include <lockstep/train/workload.h>

#include <iostream>

namespace lockstep::train {

void RunContext::say(const std::string& line) const {
  if (rank == 0) std::cout << "[lockstep-train] " << line << std::endl;
}

numerics::CheckpointPolicy RunContext::checkpoint_policy() const {
  numerics::CheckpointPolicy p;
  if (config == nullptr) return p;
  const auto& m = config->memory;  // the values were checked by the schema
  p.enabled = m.activation_checkpointing;
  p.every = m.checkpoint_every;
  p.blocks = numerics::parse_checkpoint_blocks(m.checkpoint_blocks);
  p.keep_dropout_masks = m.keep_dropout_masks;
  return p;
}

void RunContext::barrier() const {
  if (group && world > 1) group->barrier()->wait();
}

double EvalResult::value(const std::string& name) const {
  for (const auto& [k, v] : scalars)
    if (k == name) return v;
  throw Error("evaluation has no metric '" + name + "'");
}

void WorkloadRegistry::add(const std::string& name, WorkloadFactory factory) {
  LOCKSTEP_CHECK(!name.empty(), "a workload needs a name");
  LOCKSTEP_CHECK(factory, "workload '", name, "': no factory");
  LOCKSTEP_CHECK(!contains(name), "workload '", name, "' is already registered");
  factories_.emplace(name, std::move(factory));
}

void WorkloadRegistry::set_default(const std::string& name) {
  LOCKSTEP_CHECK(contains(name), "default workload '", name, "' is not registered");
  default_ = name;
}

std::unique_ptr<Workload> WorkloadRegistry::create(const std::string& name) const {
  auto it = factories_.find(name);
  if (it == factories_.end())
    throw ConfigError("unknown workload '" + name +
                      "' (registered: " + (names().empty() ? "none" : names()) + ")");
  return it->second();
}

std::string WorkloadRegistry::names() const {
  std::string out;
  for (const auto& [k, f] : factories_) out += (out.empty() ? "" : ", ") + k;
  return out;
}

}  // namespace lockstep::train
