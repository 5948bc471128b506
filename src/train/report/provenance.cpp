// The model card's provenance; see lockstep/train/provenance.h.
#include <lockstep/train/provenance.h>

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

}  // namespace lockstep::train
