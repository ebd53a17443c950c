#!/usr/bin/env bash
# Installs the Debian packages the tests drive (real NBD clients, fio, zstd, mdadm) when missing.
set -euo pipefail
need=()
for pair in qemu-io:qemu-utils nbdinfo:libnbd-bin nbdcopy:libnbd-bin nbdkit:nbdkit fio:fio zstd:zstd mdadm:mdadm; do
  cmd=${pair%%:*}; pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
  else
    echo "install-deps: missing ${need[*]}; run as root or install them" >&2
    exit 1
  fi
fi
