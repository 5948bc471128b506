// compress/codec_avx512.cpp: the QSGD codec's kernels compiled for the AVX-512 (F, BW, VL, DQ) +
// F16C path (Skylake-SP, Zen 4 and later), 16 float lanes per vector. ISA flags:
// src/compress/CMakeLists.txt; choice: codec_dispatch.cpp.
#define LOCKSTEP_CODEC_NS avx512
#define LOCKSTEP_CODEC_LANES 16
#define LOCKSTEP_CODEC_NAME "avx512"
#include "compress/codec_kernels.inc"
