#!/usr/bin/env bash
# The codec's AVX2 / AVX-512 objects may define exactly one external symbol, their path's
# table(): any other (an inline function from a header compiled with the wider ISA, kept
# out of line at -O0 or by the inliner's choice) could be the copy the linker keeps for
# every caller, and then run on a CPU without those instructions.
# Usage: codec_linkage_test.sh 'obj1;obj2;...' (the lockstep_compress objects)
set -euo pipefail
IFS=';' read -r -a objects <<<"$1"
checked=0
for o in "${objects[@]}"; do
  case "$o" in *codec_avx*.o) ;; *) continue ;; esac
  extern=$(nm -C --defined-only --extern-only "$o" | awk '{ $1 = ""; $2 = ""; print }' | sed 's/^ *//')
  if [ "$extern" != "lockstep::compress::detail::$(basename "$o" | sed 's/codec_\(avx[0-9]*\).*/\1/')::table()" ]; then
    echo "FAIL: $o defines external symbols besides table():"
    echo "$extern"
    exit 1
  fi
  echo "ok: $(basename "$o"): only table()"
  checked=$((checked + 1))
done
if [ "$checked" -eq 0 ]; then
  echo "no codec_avx* objects (LOCKSTEP_CODEC_SIMD=OFF or not x86-64): nothing to check"
fi
