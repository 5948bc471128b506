#include "command.h"

#include <sys/wait.h>

#include <cstdio>

namespace lm {

CommandOutput run_command(const std::string& command) {
  CommandOutput out;
  std::FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.text.append(buf, n);
  const int st = ::pclose(p);
  out.status = (st != -1 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
  return out;
}

}  // namespace lm
