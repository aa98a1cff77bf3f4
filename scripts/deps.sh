#!/usr/bin/env bash
# Installs the Debian packages kvrun needs to build and test, when any is missing.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libcli11-dev libfmt-dev doctest-dev
      nlohmann-json3-dev libpcre2-dev libedit-dev tmux)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
