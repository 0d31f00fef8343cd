#!/usr/bin/env bash
# Install what building and testing Stoker needs on a Debian machine, only what is missing.
# Called by `make demo` and `make test` (with --test: what only the tests need); safe to run
# again.
set -euo pipefail

need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
# libjpeg-turbo 3.x is built from source by the turbojpeg crate: cmake, and nasm for its SIMD code.
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v nasm >/dev/null 2>&1 || need+=(nasm)
tar --version 2>/dev/null | grep -q "GNU tar" || need+=(tar)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need+=(python3-venv)
fi

if [ "${1:-}" = "--test" ]; then
  need=()
  # The observability tests scrape a real cluster with a real Prometheus and lint with promtool.
  command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
  command -v promtool >/dev/null 2>&1 || need+=(prometheus)
  # The multi-host tests run real processes in network namespaces (ip netns, veth).
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  # The compose tests build their base image with debootstrap (no registry to pull one from).
  command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
  if ! docker info >/dev/null 2>&1; then
    echo "note: no Docker engine answers; the compose tests (python/tests/test_compose.py) will skip (fail under CI)" >&2
  fi
  # The fuzz targets link libFuzzer, which is C++ (a machine with only `cc` lacks it).
  command -v c++ >/dev/null 2>&1 || need+=(g++)
  if ! command -v kubectl >/dev/null 2>&1; then
    echo "note: kubectl is not installed; the tests that render deploy/k8s with kustomize will skip (fail under CI)" >&2
  fi
fi

if ((${#need[@]})); then
  echo "==> installing missing system packages: ${need[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found. Install Rust 1.95 or newer with rustup (https://rustup.rs), then run make again." >&2
  exit 1
fi
