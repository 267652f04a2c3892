#!/usr/bin/env bash
# The whole node running the demo (examples/demo), on a Debian 12 machine as root: first sets up
# whatever is missing (scripts/setup.sh). Extra arguments go to `skiff node`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec node bin/skiff.js node --manifests examples/demo --images-dir build/images "$@"
