// lockstep/blas_core.h: which OpenBLAS kernels this CPU deserves, and whether the ones
// OpenBLAS picked fall short of them.
//
// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels ("core") from the CPU's
// model number when it loads. A version older than the CPU does not know the model and
// falls back to a generic SSE core: Debian 12's OpenBLAS 0.3.21 runs "Prescott" kernels
// on Intel Xeons of family 6 model 207 (Emerald Rapids), 36 instead of 209 GFLOP/s for a
// 1024^3 fp32 GEMM. The environment variable OPENBLAS_CORETYPE, read when the library
// loads, overrides the choice; it cannot be changed afterwards in a running process.
//
// lockstep-run sets it for the ranks it starts (lockstep/launch/rank_env.h,
// blas_defaults) and lockstep::init() says in one line what to set when the running
// process got less than the CPU supports (docs/launcher.md, "The BLAS").
//
// Pure functions of their inputs plus cpu_isa() (the CPU's flags, with the OS's support
// for the wider registers, through GCC's __builtin_cpu_supports).
// Base layer: no dependencies, includable from every layer (scripts/layers.py).
#pragma once

#include <cctype>
#include <optional>
#include <string>
#include <string_view>

namespace lockstep::blas {

// Instruction set tiers, as OpenBLAS's x86-64 kernels use them.
enum class Isa { Unknown = 0, Sse = 1, Avx = 2, Avx2 = 3, Avx512 = 4 };

inline const char* isa_name(Isa i) {
  switch (i) {
    case Isa::Sse:
      return "SSE";
    case Isa::Avx:
      return "AVX";
    case Isa::Avx2:
      return "AVX2";
    case Isa::Avx512:
      return "AVX-512";
    default:
      return "unknown";
  }
}

// The tier of an OpenBLAS core name (as openblas_get_corename() reports it, any case);
// Unknown for a name this table does not know (a newer OpenBLAS's core: no judgement).
inline Isa core_isa(std::string_view core) {
  std::string c;
  for (char ch : core) c.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
  for (const char* n : {"skylakex", "cooperlake", "sapphirerapids"})
    if (c == n) return Isa::Avx512;
  for (const char* n : {"haswell", "zen", "excavator"})
    if (c == n) return Isa::Avx2;
  for (const char* n : {"sandybridge", "bulldozer", "piledriver", "steamroller"})
    if (c == n) return Isa::Avx;
  for (const char* n : {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "nano",
                        "katmai", "coppermine", "northwood", "banias", "athlon", "opteron",
                        "opteron_sse3", "barcelona", "bobcat", "unknown"})
    if (c == n) return Isa::Sse;
  return Isa::Unknown;
}

// The widest tier the CPU (and the OS, for the register state) supports.
inline Isa cpu_isa() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  // OpenBLAS's AVX-512 kernels (SkylakeX) need F, BW, VL and DQ together.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return Isa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
  if (__builtin_cpu_supports("avx")) return Isa::Avx;
  return Isa::Sse;
#else
  return Isa::Unknown;  // not x86-64: OpenBLAS's own choice stands
#endif
}

inline bool cpu_is_amd() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

// The OPENBLAS_CORETYPE value that gives a CPU of tier `cpu` its kernels, when OpenBLAS
// picked `core` of a lower tier; nullopt when the pick is as good as the CPU allows, or
// either side is unknown. SkylakeX rather than a newer AVX-512 core: every OpenBLAS with
// AVX-512 kernels knows it, and its fp32/fp64 kernels are the newer cores' too.
inline std::optional<std::string> better_core(std::string_view core, Isa cpu, bool amd) {
  const Isa have = core_isa(core);
  if (have == Isa::Unknown || cpu == Isa::Unknown || have >= cpu) return std::nullopt;
  switch (cpu) {
    case Isa::Avx512:
      return std::string("SkylakeX");
    case Isa::Avx2:
      return std::string(amd ? "Zen" : "Haswell");
    case Isa::Avx:
      return std::string(amd ? "Bulldozer" : "Sandybridge");
    default:
      return std::nullopt;
  }
}

}  // namespace lockstep::blas
