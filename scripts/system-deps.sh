#!/usr/bin/env bash
# Debian packages the integration tests use: the real Prometheus server and promtool,
# headless Chromium for the HTML report, and a C compiler (gcc). Installs only what is
# missing (needs root or sudo).
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# a C compiler: the thread tests build a small LD_PRELOAD library (tests/sidecar/fake_cpus.py)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "system-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# The Debian prometheus package starts a service on :9090 where an init system runs; tests
# start their own on free ports, so stop it if it was started.
if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl stop prometheus >/dev/null 2>&1 || true; fi
if command -v service >/dev/null 2>&1; then $SUDO service prometheus stop >/dev/null 2>&1 || true; fi
