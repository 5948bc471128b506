#!/usr/bin/env bash
# Installs every build, test and run dependency of lockstep from Debian 12's packages.
# Does nothing when all are present. Runs as root, or through sudo when available.
#   scripts/install-deps.sh          build + test dependencies
#   scripts/install-deps.sh --bench  also the peers the benchmarks compare against: python3-torch
#                                    (PyTorch DDP) and, for lockstep-bench fsdp, a virtual
#                                    environment .venv-bench/ with torch 2.x from PyPI (PyTorch's
#                                    FSDP; Debian's torch 1.13 cannot import it under Python 3.11)
#   scripts/install-deps.sh --torch2 the same .venv-bench/ (one torch 2.x download for both) plus
#                                    the tensorboard package: make test-torch2 builds against the
#                                    wheel's libtorch and reads the trainer's events with TensorBoard
set -euo pipefail

pkgs=(
  build-essential cmake ccache pkg-config
  libtorch-dev          # libtorch 1.13 (CPU), c10d with ProcessGroupGloo
  libgloo-dev           # headers that c10d's ProcessGroupGloo.hpp includes
  libopenblas0-pthread  # without it libtorch uses the reference BLAS: GEMM ~13x slower
  libopenmpi-dev openmpi-bin
  libgtest-dev
  zlib1g-dev            # lockstep_data inflates the gzip'd Fashion-MNIST idx files
  libssl-dev            # OpenSSL's libcrypto: HMAC-SHA256 proofs of the rendezvous token
  libcli11-dev nlohmann-json3-dev libtomlplusplus-dev
  dataset-fashion-mnist # real data for the demo and the accuracy tests
  bible-kjv bible-kjv-text  # the lm workload's corpus: the KJV text and its reader (`bible`)
  iproute2              # ip netns / tc for the thin-link benchmarks
  procps bc             # ps, bc: used by the fault tests
  python3               # tests/train/read_tfevents.py: an independent TensorBoard reader
  python3-yaml          # tests/packaging/manifests_test.py: the Kubernetes manifests
  slurmctld slurmd slurm-client  # tests/multihost/slurm_test.sh: a real Slurm on loopback
)
bench=0
venv_extra=()
if [[ "${1:-}" == "--bench" ]]; then
  bench=1
  pkgs+=(python3-torch)   # the peer of lockstep-bench ddp: PyTorch's own DDP
  pkgs+=(python3-venv)    # the venv of lockstep-bench fsdp's peer (below)
elif [[ "${1:-}" == "--torch2" ]]; then
  bench=1                 # the bench's venv: its torch wheel carries libtorch 2.x for C++
  pkgs+=(python3-venv)
  venv_extra=(tensorboard)  # TensorBoard's own event reader (tests/packaging)
fi

# The peer of lockstep-bench fsdp: torch 2.x from PyPI in <source>/.venv-bench (ignored by git,
# never used by make test or make demo). LOCKSTEP_BENCH_TORCH picks another version.
bench_venv() {
  local root venv spec
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  venv="$root/.venv-bench"
  spec="${LOCKSTEP_BENCH_TORCH:-torch==2.15.0}"
  if ! "$venv/bin/python" -c 'import torch.distributed.fsdp' 2>/dev/null; then
    echo "install-deps: creating $venv with $spec from PyPI (several GB: the wheel pulls CUDA libraries)"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$spec" numpy
  fi
  local p
  for p in "${venv_extra[@]}"; do
    if ! "$venv/bin/python" -c "import $p" 2>/dev/null; then
      echo "install-deps: installing $p into $venv"
      "$venv/bin/pip" install --quiet --disable-pip-version-check "$p"
    fi
  done
}

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  if [[ $bench -eq 1 ]]; then bench_venv; fi
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then sudo="sudo"; else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi
apt=($sudo env DEBIAN_FRONTEND=noninteractive apt-get)
# A fresh machine has no package lists; refresh them once (and again if install fails on stale lists).
if ! "${apt[@]}" install -y --no-install-recommends "${missing[@]}"; then
  "${apt[@]}" update
  "${apt[@]}" install -y --no-install-recommends "${missing[@]}"
fi
if [[ $bench -eq 1 ]]; then bench_venv; fi
