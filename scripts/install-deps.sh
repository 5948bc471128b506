#!/usr/bin/env bash
# Installs every build, test and run dependency of lockstep from Debian 12's packages.
# Does nothing when all are present. Runs as root, or through sudo when available.
#   scripts/install-deps.sh          build + test dependencies
#   scripts/install-deps.sh --bench  also the peers the benchmarks compare against (python3-torch)
set -euo pipefail

pkgs=(
  build-essential cmake ccache pkg-config
  libtorch-dev          # libtorch 1.13 (CPU), c10d with ProcessGroupGloo
  libgloo-dev           # headers that c10d's ProcessGroupGloo.hpp includes
  libopenblas0-pthread  # without it libtorch uses the reference BLAS: GEMM ~13x slower
  libopenmpi-dev openmpi-bin
  libgtest-dev
  zlib1g-dev            # lockstep_data inflates the gzip'd Fashion-MNIST idx files
  libcli11-dev nlohmann-json3-dev libtomlplusplus-dev
  dataset-fashion-mnist # real data for the demo and the accuracy tests
  iproute2              # ip netns / tc for the thin-link benchmarks
  procps bc             # ps, bc: used by the fault tests
  python3               # tests/train/read_tfevents.py: an independent TensorBoard reader
)
if [[ "${1:-}" == "--bench" ]]; then
  pkgs+=(python3-torch)   # the peer of lockstep-bench ddp: PyTorch's own DDP
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
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
