#!/usr/bin/env bash
# The Node package's tests (node --test), each file against its own keychaind on a private swtpm; KEYCHAIN_BIN names
# the binaries (default: the repository's .build/debug), KEYCHAIN_SEEDS the seed texts (default: test/seeds, the repository's copies of shared/seeds 000, 001 and 004).
set -euo pipefail
cd "$(dirname "$0")"
node --version
exec timeout "${KEYCHAIN_NODE_DEADLINE:-600}" node --test golden.test.js keychaind.test.js seed-examples.test.js types.test.js outside.test.js \
  connection.test.js
