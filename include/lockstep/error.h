// lockstep/error.h: the exception hierarchy and the checking macros.
//
// Every error lockstep raises derives from lockstep::Error. Library code never
// calls exit(); programs decide in main what an error means for the process.
// Header-only (the base layer): a program that uses only these classes links no library.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace lockstep {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed something that can never work (wrong dtype, bad size, unknown option).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A configuration or environment problem: names the setting and how to fix it.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// Where a distributed operation failed: enough to find the culprit from one log line.
struct CommContext {
  int rank = -1;
  int world_size = 0;
  int peer = -1;         // the rank that failed us, when known
  std::string backend;   // "shm", "gloo", "mpi"
  std::string op;        // "allreduce", "send", "rendezvous", ...
  uint64_t seq = 0;      // per-group sequence number of the collective (1-based; 0 = none)
  int64_t numel = -1;    // elements in the operation (-1 = not applicable)
  std::string dtype;     // element type, when applicable
  double elapsed_s = 0;  // time since the op started running
  double timeout_s = 0;  // the op's timeout

  // "rank 1/2 [shm] allreduce #12 (1000 elements float32) after 3.0 s of 30.0 s timeout"
  std::string describe() const {
    std::ostringstream os;
    if (rank >= 0) os << "rank " << rank << "/" << world_size;
    if (!backend.empty()) os << " [" << backend << "]";
    if (!op.empty()) os << " " << op;
    if (seq > 0) os << " #" << seq;
    if (numel >= 0) {
      os << " (" << numel << " elements";
      if (!dtype.empty()) os << " " << dtype;
      os << ")";
    }
    if (peer >= 0) os << " peer rank " << peer;
    if (timeout_s > 0) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " after %.1f s of %.1f s timeout", elapsed_s, timeout_s);
      os << buf;
    }
    return os.str();
  }
};

// A collective or point-to-point operation failed: peer died, timed out, ranks disagreed.
class CommError : public Error {
 public:
  enum class Kind { Failed, Timeout, PeerGone, Mismatch, Rendezvous, Aborted };
  CommError(Kind kind, CommContext ctx, const std::string& what_happened)
      : Error(ctx.describe() + ": " + kind_name(kind) + ": " + what_happened),
        kind_(kind),
        ctx_(std::move(ctx)),
        detail_(what_happened) {}
  Kind kind() const { return kind_; }
  const CommContext& context() const { return ctx_; }
  // What happened, without the context prefix.
  const std::string& detail() const { return detail_; }
  static const char* kind_name(Kind k) {
    switch (k) {
      case Kind::Failed:
        return "failed";
      case Kind::Timeout:
        return "timed out";
      case Kind::PeerGone:
        return "peer gone";
      case Kind::Mismatch:
        return "mismatch";
      case Kind::Rendezvous:
        return "rendezvous failed";
      case Kind::Aborted:
        return "aborted";
    }
    return "?";
  }

 private:
  Kind kind_;
  CommContext ctx_;
  std::string detail_;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace lockstep

// LOCKSTEP_CHECK(cond, msg...) throws lockstep::InvalidArgument with the message when cond fails.
#define LOCKSTEP_CHECK(cond, ...)                                                    \
  do {                                                                               \
    if (!(cond))                                                                     \
      throw ::lockstep::InvalidArgument(::lockstep::detail::concat(                  \
          "check failed: " #cond " (" __FILE__ ":", __LINE__, ") ", ##__VA_ARGS__)); \
  } while (0)

// LOCKSTEP_CHECK_EQ(a, b, msg...) prints both values when they differ.
#define LOCKSTEP_CHECK_EQ(a, b, ...)                                            \
  do {                                                                          \
    const auto& lockstep_a_ = (a);                                              \
    const auto& lockstep_b_ = (b);                                              \
    if (!(lockstep_a_ == lockstep_b_))                                          \
      throw ::lockstep::InvalidArgument(::lockstep::detail::concat(             \
          "check failed: " #a " == " #b " (", lockstep_a_, " vs ", lockstep_b_, \
          ") (" __FILE__ ":", __LINE__, ") ", ##__VA_ARGS__));                  \
  } while (0)
