#!/usr/bin/env bash
# Prints the path of redis-server, installing Debian's package first when it is missing (the
# routing tests start their own instances on free loopback ports).
set -euo pipefail
if ! command -v redis-server >/dev/null; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  { $sudo_cmd apt-get install -y -q redis-server || { $sudo_cmd apt-get update -q && $sudo_cmd apt-get install -y -q redis-server; }; } >&2
fi
command -v redis-server
