// lockstep/quorum_wire.h: the quorum service's wire format, written once.
//
// The quorum service (lockstep-run --coordinator, src/launch/coordinator.cpp) and the
// replicas that talk to it (lockstep::ft::QuorumClient, src/parallel/ft/) exchange text
// lines over one TCP connection per replica. Both sides format and parse through this
// header only. The protocol, its rules and its timings: docs/fault-tolerance.md.
//
//   replica -> service                      service -> replica
//   HELLO <replica id> <host> <store port>  (nothing)
//     [<min replicas>]                      (the replica's own minimum; optional)
//   HB                                      (nothing; a heartbeat)
//   QUORUM <step>                           QUORUM <quorum id> <max step> <n> <member>...
//                                             member = <replica id>:<step>:<host>:<port>
//                                           DONE <step>  (the job finished without it)
//   VOTE <quorum id> <step> <0|1>           VOTE <quorum id> <step> <0|1>  (commit or not)
//   BYE <step>                              (nothing; the replica finished <step> steps
//                                            and leaves: done, not lost)
//                                           STOP <reason>  (the job ends; any time)
//
// Base layer: no dependencies, includable from every layer (scripts/layers.py).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace lockstep::quorum_wire {

struct Member {
  int id = -1;       // replica id
  int64_t step = 0;  // the step it asked to start
  std::string host;  // where its rendezvous store listens
  int port = 0;
};

struct Quorum {
  bool done = false;            // DONE: the job finished (at max_step) without this replica
  int64_t id = 0;               // changes whenever the members change
  int64_t max_step = 0;         // the furthest member's step: replicas behind it heal
  std::vector<Member> members;  // sorted by replica id
};

inline std::string format_quorum(const Quorum& q) {
  std::ostringstream o;
  o << "QUORUM " << q.id << ' ' << q.max_step << ' ' << q.members.size();
  for (const Member& m : q.members)
    o << ' ' << m.id << ':' << m.step << ':' << m.host << ':' << m.port;
  return o.str();
}

// False when `line` is not a well-formed QUORUM reply.
inline bool parse_quorum(const std::string& line, Quorum* q) {
  std::istringstream in(line);
  std::string word;
  size_t n = 0;
  if (!(in >> word >> q->id >> q->max_step >> n) || word != "QUORUM") return false;
  q->members.clear();
  for (size_t i = 0; i < n; ++i) {
    std::string m;
    if (!(in >> m)) return false;
    const auto a = m.find(':'), b = m.find(':', a + 1), c = m.rfind(':');
    if (a == std::string::npos || b == std::string::npos || c <= b) return false;
    Member x;
    try {
      x.id = std::stoi(m.substr(0, a));
      x.step = std::stoll(m.substr(a + 1, b - a - 1));
      x.port = std::stoi(m.substr(c + 1));
    } catch (...) {
      return false;
    }
    x.host = m.substr(b + 1, c - b - 1);
    q->members.push_back(x);
  }
  return true;
}

}  // namespace lockstep::quorum_wire
