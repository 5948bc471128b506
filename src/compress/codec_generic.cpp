// compress/codec_generic.cpp: the QSGD codec's kernels compiled for the baseline path: any x86-64
// (SSE2), or any other CPU's baseline, 4 float lanes per vector. ISA flags:
// src/compress/CMakeLists.txt; choice: codec_dispatch.cpp.
#define LOCKSTEP_CODEC_NS generic
#define LOCKSTEP_CODEC_LANES 4
#define LOCKSTEP_CODEC_NAME "generic"
#include "compress/codec_kernels.inc"
