// compress/codec_avx2.cpp: the QSGD codec's kernels compiled for the AVX2 + F16C path (Haswell, Zen
// and later), 8 float lanes per vector. ISA flags: src/compress/CMakeLists.txt; choice:
// codec_dispatch.cpp.
#define LOCKSTEP_CODEC_NS avx2
#define LOCKSTEP_CODEC_LANES 8
#define LOCKSTEP_CODEC_NAME "avx2"
#include "compress/codec_kernels.inc"
