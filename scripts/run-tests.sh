#!/usr/bin/env bash
# Runs the workspace's built test binaries (`cargo test --release --no-run` first) two at a
# time: the md-VM tests spend most of their time in one single-threaded qemu each, so the
# rest of the suite runs beside them instead of after them. The longest binaries start
# first. Each binary runs from its package's folder, as `cargo test` runs it, into a log of
# its own; the logs are printed whole, and any failed binary fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

# The slowest binaries (md-VM tests, arrays served under real clients, the CI seed set),
# longest first; the rest follow in cargo's order.
SLOW_FIRST="cli_scrub cli_vm_block_faults cli_crash cli_readd cli_faults uraid_sim cli_badblocks cli_ppl cli_replace"

logs=target/test-lanes
rm -rf "$logs"
mkdir -p "$logs"
# As scripts/test.sh builds them: with the optional features the tests cover.
features="${URAID_TEST_FEATURES:-uraid/tls,uraid-nbd/tls}"

# "<executable> <package folder>" per test binary, from cargo's artifact messages.
cargo test --workspace --release --features "$features" --no-run --message-format=json 2>/dev/null |
  grep '"executable":"' | grep -E '"profile":\{[^}]*"test":true' |
  sed -E 's/.*"manifest_path":"([^"]*)".*"executable":"([^"]*)".*/\2 \1/' |
  while read -r exe manifest; do echo "$exe $(dirname "$manifest")"; done >"$logs/binaries"

# A parse that missed binaries must not pass as a shorter suite.
listed=$(cargo test --workspace --release --features "$features" --no-run 2>&1 | grep -c '^ *Executable ')
found=$(wc -l <"$logs/binaries")
if [ "$found" = 0 ] || [ "$found" != "$listed" ]; then
  echo "run-tests.sh: found $found test binaries where cargo lists $listed" >&2
  exit 1
fi

name_of() { # cli_scrub-0123abcd -> cli_scrub
  local base
  base=$(basename "$1")
  echo "${base%-*}"
}

: >"$logs/order"
for slow in $SLOW_FIRST; do
  while read -r exe dir; do
    [ "$(name_of "$exe")" = "$slow" ] && echo "$exe $dir" >>"$logs/order"
  done <"$logs/binaries"
done
while read -r exe dir; do
  grep -qxF "$exe $dir" "$logs/order" || echo "$exe $dir" >>"$logs/order"
done <"$logs/binaries"

run_one() { # run_one EXE DIR: one binary into its own log; a failure leaves a mark
  local exe=$1 dir=$2 log
  log="$LOGS/$(basename "$exe").log"
  echo "     Running $exe" >"$log"
  if ! (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$exe") >>"$log" 2>&1; then
    echo "FAILED: $exe" | tee -a "$log" >>"$LOGS/failed"
  fi
}
export -f run_one
export LOGS="$logs"
xargs -P 2 -L 1 bash -c 'run_one "$@"' _ <"$logs/order"

while read -r exe _; do
  cat "$logs/$(basename "$exe").log"
done <"$logs/binaries"

# Doc tests are not among the binaries above.
cargo test --workspace --release --features "$features" --doc

if [ -s "$logs/failed" ]; then
  echo "test binaries failed:" >&2
  cat "$logs/failed" >&2
  exit 1
fi
echo "every test binary passed ($(wc -l <"$logs/binaries") binaries, two at a time, and the doc tests)"
