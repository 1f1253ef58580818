#!/usr/bin/env bash
# Installs Debian bookworm's CUDA 11.8 headers, driver stub and nvcc, once.
# Idempotent: does nothing when /usr/include/cuda.h and the stub are present.
set -euo pipefail
if [ -f /usr/include/cuda.h ] && [ -f /usr/lib/x86_64-linux-gnu/stubs/libcuda.so ]; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
list=/etc/apt/sources.list.d/fairgo-nonfree.sources
if [ ! -f "$list" ]; then
  $sudo tee "$list" >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends nvidia-cuda-dev nvidia-cuda-toolkit >/dev/null
test -f /usr/include/cuda.h
