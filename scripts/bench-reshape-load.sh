#!/bin/bash
# A grow under load (issue 25 item 3: a reshape paced as md paces a resync): a RAID5 of four
# member files on the disk grown to five while fio runs random 4 KiB reads and writes (half
# each, iodepth 32) through NBD. Prints the clients alone (the peer, the same run, before the
# grow), the clients while the reshape runs and their ratio, and the reshape's rate over 20 s
# of that load (measured from 4 s after fio starts, so fio's start is not counted).
#
#   scripts/bench-reshape-load.sh [URAID_BINARY] [DIR] [POLICY]
#       POLICY: md | adaptive (the default) | - (leave the tunable alone: an older binary)
#       needs fio with its nbd engine; 5 GiB in DIR
set -euo pipefail
U=$(realpath "${1:-target/release/uraid}")
POLICY=${3:-adaptive}
MEMBER=${MEMBER:-1G}
. "$(dirname "$0")/bench-lib.sh"
bench_dir "${2:-./bench-reshape}"
bench_cpu
cd "$D"
for i in 0 1 2 3 4; do fallocate -l "$MEMBER" "m$i"; done
"$U" create --level 5 --raid-devices 4 --chunk 64K --assume-clean --force --bitmap none m0 m1 m2 m3 \
    >create.log 2>&1 || { cat create.log >&2; exit 1; }
"$U" serve --unix "$D/s.sock" --control "$D/c.ctl" m0 m1 m2 m3 >serve.log 2>&1 &
for _ in $(seq 50); do [ -S "$D/c.ctl" ] && break; sleep 0.1; done
[ "$POLICY" = - ] || "$U" set --control "$D/c.ctl" sync_policy "$POLICY" >/dev/null
# fio's IOPS (reads and writes) and read p99 in us; fio prints a line before its JSON.
fio_job() {
    fio --name=x --ioengine=nbd --uri="nbd+unix:///?socket=$D/s.sock" --rw=randrw --bs=4k \
        --iodepth=32 --time_based --runtime="$1" --size=2G --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]
print(int(j["read"]["iops"]+j["write"]["iops"]), round(j["read"]["clat_ns"]["percentile"]["99.000000"]/1000))'
}
# The reshape's checkpoint in KiB, from status's `reshape = N% (done/total)`.
done_kib() { "$U" status --control "$D/c.ctl" | sed -n 's/.*reshape = [^ ]* (\([0-9]*\)\/.*/\1/p'; }
read -r alone_iops alone_p99 < <(fio_job 10)
"$U" add --control "$D/c.ctl" m4 >/dev/null
"$U" grow --control "$D/c.ctl" --raid-devices 5 >/dev/null
fio_job 25 >with.txt &
FIO=$!
sleep 4
k0=$(done_kib); t0=$(date +%s.%N)
sleep 20
k1=$(done_kib); t1=$(date +%s.%N)
share=$("$U" status --control "$D/c.ctl" | grep -o 'share=[0-9]*%' || echo "share=-")
wait "$FIO"
read -r with_iops with_p99 <with.txt
[ -n "$k0" ] && [ -n "$k1" ] || { echo "the reshape ended inside the measured window: use larger members (MEMBER=)" >&2; exit 1; }
python3 - "$POLICY" "$alone_iops" "$alone_p99" "$with_iops" "$with_p99" "$k0" "$k1" "$t0" "$t1" "$share" <<'EOF'
import sys
pol, ai, ap, wi, wp, k0, k1, t0, t1, share = sys.argv[1:]
mbs = (int(k1) - int(k0)) * 1024 / (float(t1) - float(t0)) / 1e6
print(f"policy {pol}: clients alone {ai} IOPS (p99 read {ap} us); with the reshape {wi} IOPS "
      f"(p99 read {wp} us), x alone {int(wi) / int(ai):.2f}; reshape {mbs:.1f} MB/s under load, {share}")
EOF
