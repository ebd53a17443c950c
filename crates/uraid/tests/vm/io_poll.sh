# VM script (md VM built with --with-clients), run by cli_vm_io_poll.rs: uraid inside the VM
# serving a RAID5 of four null_blk devices that have poll queues, with `--io-poll`, the
# kernel's NBD client in front. null_blk.ko (and configfs.ko, its dependency) come in as
# files: the VM's initramfs does not load them. The data is written and read back through
# NBD, the array is stopped, and Linux md must assemble it, read the same bytes and find
# mismatch_cnt 0 in its check. Prints "IO-POLL OK" at the end.
set -u
ip link set lo up
F=/mdvm/files
U=$F/uraid-vm; chmod +x $U
export LD_LIBRARY_PATH=$F
MB=32
fail() { echo "FAIL: $*"; cat /tmp/serve.log 2>/dev/null; exit 1; }

[ -e /sys/kernel/config ] || insmod $F/configfs.ko || fail "insmod configfs"
insmod $F/null_blk.ko queue_mode=2 poll_queues=2 nr_devices=4 gb=1 memory_backed=1 \
  || fail "insmod null_blk (queue_mode=2 poll_queues=2 memory_backed=1)"
M=""
for i in 0 1 2 3; do
  [ -b /dev/nullb$i ] || fail "no /dev/nullb$i"
  p=$(cat /sys/block/nullb$i/queue/io_poll)
  [ "$p" = 1 ] || fail "/sys/block/nullb$i/queue/io_poll is $p: this kernel's null_blk has no poll queues"
  M="$M /dev/nullb$i"
done
echo "null_blk: 4 devices, queue/io_poll 1"

# A member without poll queues (virtio) is refused, naming it, before anything is served.
$U create --level 1 --raid-devices 2 --size 8M --name novirtpoll /dev/vda /dev/vdb > /tmp/create.log 2>&1 || { cat /tmp/create.log; fail "create on vda, vdb"; }
$U serve --io-poll --listen 127.0.0.1:10809 /dev/vda /dev/vdb > /tmp/refused.log 2>&1 && fail "--io-poll on /dev/vda was not refused"
grep -q "vda has no poll queues" /tmp/refused.log || { cat /tmp/refused.log; fail "the refusal does not name /dev/vda's missing poll queues"; }
echo "refused without poll queues: $(grep -o 'has no poll queues[^;]*' /tmp/refused.log)"

$U create --level 5 --raid-devices 4 --chunk 64K --bitmap internal --size 64M --name iopoll $M >/dev/null 2>&1 \
  || fail "create"
$U serve --io-poll --listen 127.0.0.1:10809 --control /tmp/c.sock $M > /tmp/serve.log 2>&1 &
SERVER=$!
for i in 1 2 3 4 5 6 7 8 9 10; do [ -S /tmp/c.sock ] && break; sleep 1; done
kill -0 $SERVER 2>/dev/null || fail "serve --io-poll exited"
grep -q "polled completions (IORING_SETUP_IOPOLL) for the O_DIRECT" /tmp/serve.log || fail "serve did not log the polled ring"
# The initial recovery (as mdadm's create) goes through the polled ring too; wait for it.
n=0
while $U status --control /tmp/c.sock | grep -qE "(recovery|resync) ="; do
  n=$((n+1)); [ $n -lt 300 ] || fail "the recovery did not finish"; sleep 1
done
nbd-client 127.0.0.1 10809 /dev/nbd0 -N iopoll >/dev/null 2>&1 || fail "nbd-client"
timeout 300 mdvm-pattern -o /dev/nbd0 -d 11 0 $((MB << 20)) || fail "the write pass saw an error"
echo 3 > /proc/sys/vm/drop_caches
want=$(mdvm-pattern 11 0 $((MB << 20)) | sha256sum | cut -d' ' -f1)
got=$(head -c $((MB << 20)) /dev/nbd0 | sha256sum | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "data read back through NBD differs"
echo "written and read back through NBD: $got"
$U detail --json --control /tmp/c.sock > /tmp/d.json
grep -q '"errors": [1-9]' /tmp/d.json && { cat /tmp/d.json; fail "member errors counted"; }
grep -q '"timed_out_ios": [1-9]' /tmp/d.json && { cat /tmp/d.json; fail "member I/O timed out"; }
nbd-client -d /dev/nbd0 >/dev/null 2>&1
kill -TERM $SERVER; wait $SERVER; rc=$?
[ $rc = 0 ] || fail "serve exited $rc after SIGTERM"
grep -q "refused a polled I/O" /tmp/serve.log && fail "null_blk refused polled I/O"
polled=$(sed -n 's/^uraid-io: io_uring: \([0-9]*\) member I\/Os were polled$/\1/p' /tmp/serve.log)
[ "${polled:-0}" -gt 1000 ] || fail "only '${polled}' member I/Os were polled"
echo "$polled member I/Os were polled"

mdadm --assemble /dev/md0 $M >/dev/null 2>&1 || fail "md did not assemble the array"
got=$(head -c $((MB << 20)) /dev/md0 | sha256sum | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "md reads other data"
echo check > /sys/block/md0/md/sync_action
n=0
while [ "$(cat /sys/block/md0/md/sync_action)" != idle ]; do
  n=$((n+1)); [ $n -lt 600 ] || fail "md's check did not finish"; sleep 1
done
mm=$(cat /sys/block/md0/md/mismatch_cnt)
[ "$mm" = 0 ] || fail "md's check found mismatch_cnt $mm"
mdadm --stop /dev/md0 >/dev/null 2>&1
echo "md assembled it, same data, mismatch_cnt 0"
echo "IO-POLL OK"
