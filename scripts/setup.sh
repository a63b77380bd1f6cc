#!/usr/bin/env bash
# Installs what building and testing pagedattn needs, on a fresh Debian-based machine, if it
# is missing: a C compiler, CMake, clang (fuzz target), Python 3 with venv. Idempotent.
set -euo pipefail
need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v clang >/dev/null 2>&1 || need+=(clang)
command -v python3 >/dev/null 2>&1 || need+=(python3 python3-venv python3-pip)
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need+=(python3-venv)
fi
if [ "${#need[@]}" -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
