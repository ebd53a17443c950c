#!/bin/bash
# Peak memory of `uraid serve` during a resync against the member count (issue 26: "a
# resync's memory bounded and independent of the member count"; target: peak RSS at 64
# members at most 2x that at 8). For each N: a RAID6 of N sparse member files created
# without --assume-clean (so serving it resyncs it whole), served until the resync ends;
# the server's VmHWM (/proc/PID/status) is its peak RSS. Also prints the idle resync rate
# (each member's MB/s, from the time the status shows a resync; coarse on small members).
#
#   scripts/bench-resync-memory.sh [URAID_BINARY] [DIR]    (DIR on a disk, not tmpfs)
#   NS="8 16 64" MEMBER_MB=256 scripts/bench-resync-memory.sh target/release/uraid ./bench-rm
set -euo pipefail
U=${1:-target/release/uraid}
D=${2:-./bench-resync-memory}
U=$(realpath "$U")
NS=${NS:-8 16 64}
MEMBER_MB=${MEMBER_MB:-256}
mkdir -p "$D"
D=$(realpath "$D")
case "$(stat -f -c %T "$D")" in tmpfs) echo "$D is on tmpfs: the members would count as memory; use a disk" >&2; exit 2;; esac
PID=
cleanup() {
    if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
        kill -INT "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
    fi
    rm -rf "$D"
}
trap cleanup EXIT
kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
FS=$(findmnt -n -o FSTYPE -T "$D" 2>/dev/null || stat -f -c %T "$D")
echo "RAID6 of N x ${MEMBER_MB} MiB sparse files on $FS, chunk 512 KiB, idle resync (MB/s of each member)"
echo "| N | peak RSS (MiB) | per member (MiB) | resync MB/s |"
echo "|---|---|---|---|"
for n in $NS; do
    A="$D/n$n"
    mkdir -p "$A"
    members=()
    for i in $(seq 0 $((n - 1))); do
        truncate -s "${MEMBER_MB}M" "$A/m$i"
        members+=("$A/m$i")
    done
    "$U" create --level=6 --raid-devices="$n" --force --name "r$n" "${members[@]}" >"$A/create.log" 2>&1 \
        || { cat "$A/create.log" >&2; exit 1; }
    "$U" serve --unix "$A/s.sock" --control "$A/c.ctl" "${members[@]}" >"$A/serve.log" 2>&1 &
    PID=$!
    for _ in $(seq 100); do [ -S "$A/c.ctl" ] && break; sleep 0.1; done
    t0=$(date +%s.%N)
    # The resync runs from the start; done when status shows no sync line any more.
    seen=0
    for _ in $(seq 6000); do
        st=$("$U" status --control "$A/c.ctl" 2>/dev/null || true)
        if grep -qE '(resync|recovery) =' <<<"$st"; then
            seen=1
        elif [ -n "$st" ]; then
            break
        fi
        sleep 0.1
    done
    t1=$(date +%s.%N)
    hwm=$(kib "$PID" VmHWM)
    kill -INT "$PID"
    wait "$PID" 2>/dev/null || true
    PID=
    [ "$seen" = 1 ] || echo "warning: N=$n: no resync seen in status (too quick?)" >&2
    # A resync covers every member's data area: (N - 2) data members' worth of array.
    awk -v n="$n" -v h="$hwm" -v mb="$MEMBER_MB" -v t0="$t0" -v t1="$t1" \
        'BEGIN { printf "| %d | %.1f | %.2f | %.0f |\n", n, h / 1024, h / 1024 / n, mb * 1.048576 / (t1 - t0) }'
    rm -rf "$A"
done
