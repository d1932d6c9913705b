#!/usr/bin/env bash
# The documentation checks CI runs: the README stays a front door (at most
# 250 lines, none over 200 characters), the user guide builds with mdBook
# without a warning, and every internal link and anchor of the guide and of
# the top-level Markdown files resolves (offline). The CLI reference's
# freshness is a test (tests/it/cli_reference.rs). Usage: scripts/check-docs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MDBOOK_VERSION=0.5.4

lines=$(wc -l < README.md)
if [ "$lines" -gt 250 ]; then
  echo "README.md has $lines lines: at most 250 (the guide, docs/book, takes the rest)" >&2
  exit 1
fi
long=$(awk 'length($0) > 200 { printf "README.md:%d: %d characters\n", NR, length($0) }' README.md)
if [ -n "$long" ]; then
  echo "$long" >&2
  echo "README.md: lines of at most 200 characters" >&2
  exit 1
fi

if ! mdbook --version 2>/dev/null | grep -q "v$MDBOOK_VERSION"; then
  echo "installing mdbook $MDBOOK_VERSION"
  cargo install mdbook --version "=$MDBOOK_VERSION" --locked --no-default-features --features search --quiet
fi
out=$(mdbook build docs/book 2>&1) || { echo "$out" >&2; exit 1; }
echo "$out"
if echo "$out" | grep -E "WARN|ERROR" >/dev/null; then
  echo "mdbook build printed warnings: they count as errors" >&2
  exit 1
fi
python3 scripts/check_links.py target/book README.md CONTRIBUTING.md CHANGELOG.md
