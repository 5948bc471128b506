// The model card; see lockstep/train/model_card.h.
#include <lockstep/train/atomic_file.h>
#include <lockstep/train/model_card.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <ctime>

namespace lockstep::train {

std::string git_revision() {
  std::FILE* p = ::popen("git rev-parse HEAD 2>/dev/null", "r");
  if (!p) return "";
  char buf[128] = {};
  std::string out;
  if (std::fgets(buf, sizeof buf, p)) out = buf;
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out.size() == 40 ? out : "";
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return ts;
}

std::string write_model_card(const std::string& dir, const std::string& format,
                             const std::string& model_json, const ModelCard& card,
                             const std::string& extra_json) {
  using nlohmann::json;
  json j;
  j["format"] = format;
  j["version"] = 1;
  j["run"] = card.run_name;
  j["model"] = json::parse(model_json);
  j.update(json::parse(extra_json));  // the workload's own members
  j["metrics"] = json::parse(card.metrics_json);
  j["gate"] = json::parse(card.gate_json);
  j["data"] = json::parse(card.data_json);
  j["config"] = json::parse(card.config_json);
  j["training"] = {{"steps", card.steps}, {"world_size", card.world_size}};
  const std::string rev = git_revision();
  j["git_revision"] = rev.empty() ? json(nullptr) : json(rev);
  j["created_at"] = utc_timestamp();
  const std::string path = dir + "/model_card.json";
  write_file_atomic(path, j.dump(2) + "\n");
  return path;
}

}  // namespace lockstep::train
