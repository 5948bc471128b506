// lockstep/hostlist.h: Slurm's compressed host lists ("node[01-04,07]", "a[1-2]b,c").
//
// Slurm writes the nodes of a job or a step (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST) in
// its hostlist syntax: names separated by commas, where a name may hold bracket groups of
// numbers and ranges ("lx[10-20]", "linux[0-64,128]", "lx[15,18,32-33]"). A range whose
// low end has leading zeros gives every number that many digits ("linux[0000-1023]");
// several groups in one name expand as their product, leftmost slowest
// ("rack[0-1]_blade[0-2]": rack0_blade0, rack0_blade1, ...). This is what
// `scontrol show hostnames` prints, in the same order.
//
// Used by comm (init(): the master address of a task-per-rank launch) and by launch
// (lockstep-run under srun), so it lives in the base layer, header-only, linking nothing.
// Pure functions; bad input throws ConfigError naming the list and the fault.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "lockstep/error.h"

namespace lockstep::hostlist {

// At most this many names: a list is a job's nodes, never millions of them.
inline constexpr std::size_t kMaxHosts = std::size_t(1) << 20;

namespace detail_ {

[[noreturn]] inline void bad(const std::string& list, const std::string& why) {
  throw ConfigError(lockstep::detail::concat("host list '", list, "': ", why,
                                             " (Slurm's syntax: node[01-04,07],other)"));
}

inline bool is_digits(const std::string& s) {
  if (s.empty() || s.size() > 9) return false;  // 9 digits: no overflow of an int
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// "7" or "01-04" -> its numbers, each printed with the low end's width when it is
// zero-padded.
inline void expand_range(const std::string& list, const std::string& r,
                         std::vector<std::string>& out) {
  const std::size_t dash = r.find('-');
  const std::string lo_s = r.substr(0, dash);
  const std::string hi_s = dash == std::string::npos ? lo_s : r.substr(dash + 1);
  if (!is_digits(lo_s) || !is_digits(hi_s))
    bad(list, "'" + r + "' in brackets is not a number or a range N-M");
  const long lo = std::stol(lo_s), hi = std::stol(hi_s);
  if (hi < lo) bad(list, "range '" + r + "' goes down");
  if (static_cast<std::size_t>(hi - lo) >= kMaxHosts) bad(list, "range '" + r + "' is too long");
  const std::size_t width = lo_s.size() > 1 && lo_s[0] == '0' ? lo_s.size() : 0;
  for (long v = lo; v <= hi; ++v) {
    std::string s = std::to_string(v);
    if (s.size() < width) s.insert(0, width - s.size(), '0');
    out.push_back(std::move(s));
  }
}

// The numbers of one bracket group's inside ("01-04,07").
inline std::vector<std::string> expand_group(const std::string& list, const std::string& inside) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = inside.find(',', start);
    expand_range(list, inside.substr(start, comma - start), out);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

// One name with zero or more bracket groups, appended to out in Slurm's order.
inline void expand_name(const std::string& list, const std::string& name,
                        std::vector<std::string>& out) {
  std::vector<std::string> partial = {""};
  std::size_t i = 0;
  while (i < name.size()) {
    const std::size_t open = name.find('[', i);
    const std::string text = name.substr(i, open - i);
    if (text.find(']') != std::string::npos) bad(list, "']' without '['");
    for (auto& p : partial) p += text;
    if (open == std::string::npos) break;
    const std::size_t close = name.find(']', open);
    if (close == std::string::npos) bad(list, "'[' without ']'");
    const std::vector<std::string> nums =
        expand_group(list, name.substr(open + 1, close - open - 1));
    if (partial.size() * nums.size() > kMaxHosts) bad(list, "more than 2^20 names");
    std::vector<std::string> next;
    next.reserve(partial.size() * nums.size());
    for (const auto& p : partial)
      for (const auto& n : nums) next.push_back(p + n);
    partial = std::move(next);
    i = close + 1;
  }
  if (partial.size() == 1 && partial[0].empty()) bad(list, "an empty name");
  if (out.size() + partial.size() > kMaxHosts) bad(list, "more than 2^20 names");
  out.insert(out.end(), partial.begin(), partial.end());
}

}  // namespace detail_

// Every name of the list, in order (duplicates kept, as Slurm keeps them).
inline std::vector<std::string> expand(const std::string& list) {
  if (list.empty()) detail_::bad(list, "it is empty");
  std::vector<std::string> out;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[' && ++depth > 1) detail_::bad(list, "nested '['");
    if (c == ']' && --depth < 0) detail_::bad(list, "']' without '['");
    if (c == ' ') detail_::bad(list, "a space");
    if (c != ',' || depth > 0) continue;
    detail_::expand_name(list, list.substr(start, i - start), out);
    start = i + 1;
  }
  if (depth != 0) detail_::bad(list, "'[' without ']'");
  return out;
}

// The first name of the list: the node of task 0 in Slurm's block layout, where rank 0's
// store listens.
inline std::string first(const std::string& list) {
  std::size_t end = 0;
  int depth = 0;
  for (; end < list.size(); ++end) {
    if (list[end] == '[') ++depth;
    if (list[end] == ']') --depth;
    if (list[end] == ',' && depth == 0) break;
  }
  // Check the whole list (a typo further on is still a typo), expand only the first name.
  expand(list);
  std::vector<std::string> one;
  detail_::expand_name(list, list.substr(0, end), one);
  return one.front();
}

// The tasks on node `node` (0-based) of a Slurm task count list, as in
// SLURM_STEP_TASKS_PER_NODE: counts in node order, "N(xK)" for K nodes of N tasks
// ("2(x3),1": nodes 0-2 run 2 tasks, node 3 runs 1). Throws ConfigError on bad syntax or a
// node beyond the list.
inline int tasks_on_node(const std::string& spec, int node) {
  auto bad = [&](const std::string& why) -> int {
    throw ConfigError(
        lockstep::detail::concat("task counts '", spec, "': ", why, " (Slurm's syntax: 2(x3),1)"));
  };
  int first = 0;  // index of the first node the current item covers
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = spec.find(',', start);
    const std::string item = spec.substr(start, comma - start);
    const std::size_t paren = item.find("(x");
    const std::string count = item.substr(0, paren);
    std::string times = "1";
    if (paren != std::string::npos) {
      if (item.back() != ')') return bad("'" + item + "' lacks its ')'");
      times = item.substr(paren + 2, item.size() - paren - 3);
    }
    if (!detail_::is_digits(count) || !detail_::is_digits(times))
      return bad("'" + item + "' is not N or N(xK)");
    first += std::stoi(times);
    if (node < first) return std::stoi(count);
    if (comma == std::string::npos) return bad(lockstep::detail::concat("no node ", node));
    start = comma + 1;
  }
}

}  // namespace lockstep::hostlist
