#!/bin/bash
# Random-ish 4 KiB writes into clean bitmap chunks against the same writes into chunks whose
# bits are already set, in one run (issue 26: md batches the bits of a batch of writes into
# one bitmap write per member). RAID6 of six member files on the disk (written through once,
# so the file system allocates nothing during the runs), served by `uraid serve`, fio's nbd
# engine, iodepth 32; each write goes to a stripe of its own, so to a bitmap chunk of its own.
#
#   scripts/bench-bitmap.sh [URAID_BINARY] [DIR]    (needs fio with its nbd engine; ~40 GB in DIR)
set -euo pipefail
U=$(realpath "${1:-target/release/uraid}")
MEMBER_MB=${MEMBER_MB:-6144}
WRITES=${WRITES:-10000}
. "$(dirname "$0")/bench-lib.sh"
bench_dir "${2:-./bench-bitmap}"
for i in 0 1 2 3 4 5; do
    dd if=/dev/zero of="$D/m$i" bs=16M count=$((MEMBER_MB / 16)) oflag=direct status=none
done
cd "$D"
"$U" create --level=6 --raid-devices=6 --assume-clean --force --bitmap internal --bitmap-chunk 256K \
    --name bm m0 m1 m2 m3 m4 m5 >create.log 2>&1 || { cat create.log >&2; exit 1; }
"$U" serve --unix "$D/s.sock" --control "$D/c.ctl" --export-name bm m0 m1 m2 m3 m4 m5 >serve.log 2>&1 &
for _ in $(seq 50); do [ -S "$D/s.sock" ] && break; sleep 0.1; done
URI="nbd+unix:///bm?socket=$D/s.sock"
# One 4 KiB write per 2 MiB stripe (four data chunks of 512 KiB): each in a bitmap chunk
# (256 KiB of member space) of its own.
pass() {
    fio --name=w --ioengine=nbd --uri="$URI" --rw=write --bs=4k --iodepth=32 --zonemode=strided \
        --zonerange=2M --zonesize=4k --offset=0 --size=$((MEMBER_MB * 4 - 1024))M --number_ios="$WRITES" \
        --output-format=json --output="$D/fio.json" >/dev/null
    python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["jobs"][0]["write"]["iops"]))' "$D/fio.json"
}
clear=$(pass)
set_=$(pass)
bench_cpu
echo "RAID6 6 x ${MEMBER_MB} MiB files on $(stat -f -c %T "$D"), $WRITES writes of 4 KiB, iodepth 32"
echo "| bits | IOPS |"
echo "|---|---|"
echo "| clear (each write sets its bit first) | $clear |"
echo "| already set (the same writes again) | $set_ |"
python3 -c "print('clear / set: %.2f (issue 26 target >= 0.7)' % ($clear / $set_))"
