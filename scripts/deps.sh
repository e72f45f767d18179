#!/usr/bin/env bash
# Install zoff's build and test dependencies from Debian 12 packages.
# Idempotent: skips apt-get when everything is already installed.
set -euo pipefail

PKGS=(build-essential cmake pkg-config git
      libopenblas-dev libjansson-dev libcmocka-dev liburing-dev
      libopenmpi-dev openmpi-bin
      fortunes                  # the default training corpus (text)
      python3-torch python3-numpy python3-regex  # reference fixtures and peer benchmarks
      clang libclang-rt-14-dev  # fuzzing and sanitizers
      gnuplot-nox               # step-breakdown and loss-curve plots
      fio)                      # zoff bench nvme: the disk's bandwidth beside the swapper's

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "zoff: installing Debian packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
