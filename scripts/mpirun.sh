#!/usr/bin/env bash
# mpirun with the settings lockstep's tests and benchmarks need on a small
# container: root allowed, more ranks than cores, shared memory + self only.
#   scripts/mpirun.sh -np 4 ./build/tests/multiprocess/some_test [args...]
# Extra mpirun options pass through; MPIRUN overrides the mpirun binary.
set -euo pipefail

# Containers often run as root; OpenMPI refuses that unless both are set.
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# 3-4 ranks on 2 cores: allow oversubscription (mpirun then also makes idle ranks yield).
export OMPI_MCA_rmaps_base_oversubscribe=1
# One node: shared memory (vader) and self. Skips the openib/ofi/usnic probes and
# their warnings on machines without those devices; set OMPI_MCA_btl to override.
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
# vader's single-copy path for large messages uses process_vm_readv (CMA). It works
# in this container (root, same user); where it does not (no CAP_SYS_PTRACE, strict
# seccomp/yama: "Read -1, expected ..., errno = 1"), LOCKSTEP_MPI_CMA=0 makes large
# messages copy in and out through shared memory instead (about 3x slower here).
if [[ "${LOCKSTEP_MPI_CMA:-1}" == 0 ]]; then
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
fi

# glibc malloc as lockstep-run sets it up (docs/launcher.md): large tensors stay in the
# heap instead of page-faulting through a fresh mmap() every step.
if [[ -z "${MALLOC_MMAP_THRESHOLD_:-}" ]]; then export MALLOC_MMAP_MAX_="${MALLOC_MMAP_MAX_:-0}"; fi
export MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-17179869184}"

exec "${MPIRUN:-mpirun}" "$@"
