#!/usr/bin/env bash
# Installs Debian packages from the distribution (sudo where not root), for the ensure-*
# scripts: bash scripts/apt-install.sh WHO PACKAGE...; WHO prefixes the log line.
set -euo pipefail
who=${1:?usage: apt-install.sh WHO PACKAGE...}
shift
command -v apt-get >/dev/null || { echo "$who: no apt-get: install $* by hand" >&2; exit 1; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
echo "$who: installing $* from the distribution" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "$@" >/dev/null
