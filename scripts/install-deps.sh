#!/usr/bin/env bash
# Installs the Debian packages the tests drive (real NBD clients, fio, zstd, mdadm, systemd's
# unit checker, curl for the metrics endpoint, GnuTLS's certtool/psktool for the TLS test)
# and OpenSSL's headers the build links `serve --tls` against, when missing.
set -euo pipefail
need=()
for pair in qemu-io:qemu-utils nbdinfo:libnbd-bin nbdcopy:libnbd-bin nbdkit:nbdkit fio:fio zstd:zstd mdadm:mdadm systemd-analyze:systemd curl:curl certtool:gnutls-bin psktool:gnutls-bin pkg-config:pkg-config; do
  cmd=${pair%%:*}; pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
# The openssl crate builds against the system's libssl.
if ! pkg-config --exists openssl 2>/dev/null; then need+=(libssl-dev); fi
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

# Real Linux md in a qemu VM (../shared/tools/mdvm), the oracle for what uraid leaves on
# disk. Debian 12's qemu-system-x86 conflicts with qemu-utils from bookworm-backports, so
# it comes from backports too when that is where qemu-utils came from.
MDVM_TOOLS="$(cd "$(dirname "$0")/../.." && pwd)/shared/tools/mdvm"
MDVM_BUILD="${MDVM_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/mdvm}"
# Built with the client kit (the kernel's NBD client, device-mapper's error target and
# suspend): the block-device fault tests run uraid inside the VM on members that fail or hang.
if [ ! -s "$MDVM_BUILD/initramfs.cpio.gz" ] || [ ! -s "$MDVM_BUILD/vmlinuz" ] || [ ! -x "$MDVM_BUILD/root/sbin/dmsetup" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: the md VM is not built ($MDVM_BUILD); run as root" >&2
    exit 1
  fi
  if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    if dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null | grep -q bpo; then
      grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/ \
        || echo "deb http://deb.debian.org/debian bookworm-backports main" > /etc/apt/sources.list.d/backports.list
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 >/dev/null
    fi
  fi
  MDVM_BUILD="$MDVM_BUILD" bash "$MDVM_TOOLS/build-vm" --with-clients >/dev/null
fi
