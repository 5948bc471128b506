// The BLAS check: which OpenBLAS kernels a CPU deserves (lockstep/blas_core.h), what
// lockstep-run sets for its ranks (launch::blas_tuning) and what init() says (blas_note).
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/blas_check.h"
#include "lockstep/blas_core.h"
#include "lockstep/launch/rank_env.h"

namespace {

using lockstep::blas::better_core;
using lockstep::blas::core_isa;
using lockstep::blas::Isa;

TEST(BlasCore, TiersOfOpenBlasCoreNames) {
  EXPECT_EQ(core_isa("SkylakeX"), Isa::Avx512);
  EXPECT_EQ(core_isa("cooperlake"), Isa::Avx512);  // any case
  EXPECT_EQ(core_isa("SAPPHIRERAPIDS"), Isa::Avx512);
  EXPECT_EQ(core_isa("Haswell"), Isa::Avx2);
  EXPECT_EQ(core_isa("Zen"), Isa::Avx2);
  EXPECT_EQ(core_isa("Sandybridge"), Isa::Avx);
  EXPECT_EQ(core_isa("Prescott"), Isa::Sse);
  EXPECT_EQ(core_isa("Nehalem"), Isa::Sse);
  EXPECT_EQ(core_isa("Zen5"), Isa::Unknown);  // a newer OpenBLAS's name: no judgement
  EXPECT_EQ(core_isa(""), Isa::Unknown);
}

TEST(BlasCore, BetterCoreOnlyWhenThePickIsBelowTheCpu) {
  // The measured case: Debian's OpenBLAS 0.3.21 on an Emerald Rapids Xeon.
  EXPECT_EQ(better_core("Prescott", Isa::Avx512, false), "SkylakeX");
  EXPECT_EQ(better_core("Haswell", Isa::Avx512, false), "SkylakeX");
  EXPECT_EQ(better_core("Prescott", Isa::Avx2, false), "Haswell");
  EXPECT_EQ(better_core("Prescott", Isa::Avx2, true), "Zen");
  EXPECT_EQ(better_core("Nehalem", Isa::Avx, false), "Sandybridge");
  EXPECT_FALSE(better_core("Cooperlake", Isa::Avx512, true));  // Zen 4 here: right already
  EXPECT_FALSE(better_core("SkylakeX", Isa::Avx2, false));     // above the CPU: its business
  EXPECT_FALSE(better_core("Haswell", Isa::Avx2, false));
  EXPECT_FALSE(better_core("Prescott", Isa::Sse, false));
  EXPECT_FALSE(better_core("Zen5", Isa::Avx512, true));        // unknown core
  EXPECT_FALSE(better_core("Prescott", Isa::Unknown, false));  // not x86-64
}

TEST(BlasTuning, LauncherSetsTheCoreTypeOnlyWhenOpenBlasFallsShort) {
  using lockstep::launch::blas_tuning;
  const auto fix = blas_tuning({}, "Prescott", Isa::Avx512, false);
  ASSERT_EQ(fix.env.size(), 1u);
  EXPECT_EQ(fix.env.at("OPENBLAS_CORETYPE"), "SkylakeX");
  EXPECT_NE(fix.note.find("Prescott"), std::string::npos) << fix.note;
  EXPECT_NE(fix.note.find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos) << fix.note;
  EXPECT_NE(fix.note.find("AVX-512"), std::string::npos) << fix.note;

  const auto right = blas_tuning({}, "Cooperlake", Isa::Avx512, true);
  EXPECT_TRUE(right.env.empty());
  EXPECT_TRUE(right.note.empty());
  EXPECT_TRUE(blas_tuning({}, "", Isa::Avx512, false).env.empty());  // no OpenBLAS

  // A user's value stands, whatever it is (and the machine is not even probed).
  const auto user =
      blas_tuning({{"OPENBLAS_CORETYPE", "Prescott"}}, "Prescott", Isa::Avx512, false);
  EXPECT_TRUE(user.env.empty());
  EXPECT_TRUE(blas_tuning({{"OPENBLAS_CORETYPE", "Haswell"}}).env.empty());
}

TEST(BlasTuning, ProbeSeesTheOpenBlasThisProcessLoaded) {
  const auto loaded = lockstep::comm::loaded_openblas_core();
  if (!loaded) GTEST_SKIP() << "this libtorch loads no OpenBLAS (MKL or the reference BLAS)";
  if (const char* c = std::getenv("OPENBLAS_CORETYPE"); c && *c)
    GTEST_SKIP() << "OPENBLAS_CORETYPE=" << c << " set for this test: the probe ignores it";
  // The launcher's child-process look-up reports what libtorch's OpenBLAS chose here.
  EXPECT_EQ(lockstep::launch::probe_openblas_core(), *loaded);
  std::printf("OpenBLAS core here: %s (CPU: %s)\n", loaded->c_str(),
              lockstep::blas::isa_name(lockstep::blas::cpu_isa()));
}

TEST(BlasNote, InitSaysWhatToSetOnlyWhenItMatters) {
  using lockstep::comm::blas_note;
  EXPECT_EQ(blas_note(std::nullopt, nullptr, true), "");  // no OpenBLAS: nothing to say
  const Isa cpu = lockstep::blas::cpu_isa();
  if (cpu <= Isa::Sse) GTEST_SKIP() << "this CPU has no AVX: Prescott is its tier";
  const std::string fix =
      lockstep::blas::better_core("Prescott", cpu, lockstep::blas::cpu_is_amd()).value();

  const std::string unset = blas_note("Prescott", nullptr, false);
  EXPECT_NE(unset.find("did not recognise this CPU"), std::string::npos) << unset;
  EXPECT_NE(unset.find("OPENBLAS_CORETYPE=" + fix), std::string::npos) << unset;

  const std::string user = blas_note("Prescott", "Prescott", false);
  EXPECT_NE(user.find("OPENBLAS_CORETYPE=Prescott selects its Prescott kernels"), std::string::npos)
      << user;

  // Right already: silent, but LOCKSTEP_DEBUG shows what runs.
  const std::string best = cpu == Isa::Avx512 ? "SkylakeX"
                           : cpu == Isa::Avx2 ? "Haswell"
                                              : "Sandybridge";
  EXPECT_EQ(blas_note(best, nullptr, false), "");
  EXPECT_NE(blas_note(best, nullptr, true).find("runs its " + best + " kernels"),
            std::string::npos);
}

}  // namespace
