// The choice of the codec's SIMD path (codec_kernels.h): the widest one this build has and
// this CPU runs, unless LOCKSTEP_CODEC_ISA or set_codec_isa() names another. Chosen once,
// on first use; an atomic pointer afterwards, so the choice costs nothing per call.
#include "compress/codec_kernels.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

namespace lockstep::compress {
namespace detail {

#if !LOCKSTEP_CODEC_SIMD
namespace avx2 {
const CodecKernels* table() { return nullptr; }
}  // namespace avx2
namespace avx512 {
const CodecKernels* table() { return nullptr; }
}  // namespace avx512
#endif

namespace {

bool cpu_runs(const CodecKernels* k) {
  if (k == nullptr) return false;
#if defined(__x86_64__) || defined(__i386__)
  const std::string name = k->name;
  // __builtin_cpu_supports also checks that the OS saves the vector registers (XCR0).
  if (name == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (name == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("f16c");
#endif
  return true;  // generic
}

// Best first.
std::vector<const CodecKernels*> runnable() {
  std::vector<const CodecKernels*> out;
  for (const CodecKernels* k : {avx512::table(), avx2::table(), generic::table()})
    if (cpu_runs(k)) out.push_back(k);
  return out;
}

const CodecKernels* named(const std::string& name) {
  std::string have;
  for (const CodecKernels* k : runnable()) {
    if (name == k->name) return k;
    have += std::string(have.empty() ? "" : ", ") + k->name;
  }
  throw InvalidArgument("codec path '" + name + "' is not available here (built and supported: " +
                        have + "); unset LOCKSTEP_CODEC_ISA to take the best one");
}

const CodecKernels* initial() {
  const char* env = std::getenv("LOCKSTEP_CODEC_ISA");
  if (env != nullptr && *env != '\0') return named(env);
  return runnable().front();
}

std::atomic<const CodecKernels*> g_active{nullptr};

}  // namespace

const CodecKernels& active() {
  const CodecKernels* k = g_active.load(std::memory_order_acquire);
  if (k == nullptr) {
    k = initial();
    g_active.store(k, std::memory_order_release);
  }
  return *k;
}

}  // namespace detail

std::string codec_isa() { return detail::active().name; }

std::vector<std::string> codec_isas() {
  std::vector<std::string> out;
  for (const auto* k : detail::runnable()) out.emplace_back(k->name);
  return out;
}

void set_codec_isa(const std::string& name) {
  detail::g_active.store(detail::named(name), std::memory_order_release);
}

}  // namespace lockstep::compress
