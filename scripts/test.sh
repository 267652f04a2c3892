#!/usr/bin/env bash
# The unit and integration tests (npm test), on a Debian 12 machine as root: first sets up
# whatever is missing (scripts/setup.sh). Extra arguments go to vitest (a file, -t NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec npm test -- "$@"
