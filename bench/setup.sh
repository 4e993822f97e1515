#!/usr/bin/env bash
# Installs what the CPU benchmark needs (OpenBLAS) on Debian/Ubuntu. Idempotent.
set -euo pipefail
if dpkg -s libopenblas-dev >/dev/null 2>&1; then
  echo "libopenblas-dev is already installed"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update
$SUDO apt-get install -y libopenblas-dev
