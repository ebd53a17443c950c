#!/usr/bin/env bash
# The project's test command (README "Run the tests"): format, lints, every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --release
