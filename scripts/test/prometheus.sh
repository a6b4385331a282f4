#!/usr/bin/env bash
# Prints the path of prometheus, installing Debian's package first when it is missing (the
# dashboard tests start their own instance on a free loopback port).
set -euo pipefail
if ! command -v prometheus >/dev/null; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  { $sudo_cmd apt-get install -y -q --no-install-recommends prometheus || { $sudo_cmd apt-get update -q && $sudo_cmd apt-get install -y -q --no-install-recommends prometheus; }; } >&2
fi
command -v prometheus
