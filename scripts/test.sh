#!/usr/bin/env bash
# The project's test command (README "Run the tests"): format, lints, every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo fmt --all -- --check
# Build first, then lint with the same (release) profile: clippy then reuses the build's
# dependencies instead of checking all of them again in a second profile.
# The optional features the tests cover (NBD over TLS links the system's OpenSSL, which
# install-deps.sh installs); run-tests.sh builds with the same.
features="uraid/tls,uraid-nbd/tls"
cargo test --workspace --release --features "$features" --no-run
cargo clippy --workspace --all-targets --release --features "$features" -- -D warnings
# And the default build, which needs no system library.
cargo clippy --workspace --all-targets --release -- -D warnings
bash scripts/run-tests.sh
