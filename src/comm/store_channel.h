// Internal: a process group's keys in the rendezvous store, beside its backend: the
// fingerprint check of LOCKSTEP_DEBUG=DETAIL and the stall inspector's questions and
// answers (docs/debugging.md).
//
// Only calls that return at once are used (set, get of a key known to exist, check, add,
// delete): a c10d TCPStore wait() that times out leaves its connection out of step, so
// waits poll check() instead. Thread-safe as the store is (c10d's TCPStore serializes its
// calls). Every call may throw what the store throws (e.g. rank 0's store is gone).
#pragma once

#include <lockstep/comm/types.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::comm {

class StoreChannel {
 public:
  // Keys live under `prefix` (unique to one group) in `store`.
  StoreChannel(c10::intrusive_ptr<c10d::Store> store, std::string prefix);

  void set(const std::string& key, const std::string& value);
  // The value if the key exists (never waits for it).
  std::optional<std::string> get_if(const std::string& key);
  std::string get(const std::string& key);  // the key must exist
  bool has(const std::string& key);
  int64_t add(const std::string& key, int64_t delta);
  void erase(const std::string& key);
  // Polls (backing off from 20 us to 250 us: a debugging mode, latency over load) until every key
  // exists: true; false when `deadline` passes or `stop()` returns true first.
  bool wait_for(const std::vector<std::string>& keys, Clock::time_point deadline,
                const std::function<bool()>& stop);

 private:
  std::string full(const std::string& key) const { return prefix_ + key; }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
};

}  // namespace lockstep::comm
