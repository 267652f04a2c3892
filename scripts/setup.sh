#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for skiff: system packages, npm packages, build.
# Run as root from the repository root: ./scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  runc crun conmon catatonit          # OCI runtimes and the container monitor
  containernetworking-plugins iproute2 iptables socat util-linux  # pod networking and namespaces
  conntrack                           # the service proxy drops stale UDP conntrack entries
  zstd                                # zstd-compressed layers
  docker-registry busybox-static      # the tests' local registry and image contents
  openssl                             # the tests' TLS registry certificate
  gcc libc6-dev                       # the seccomp tests build a static syscall probe
  containerd                          # the reference runtime kubelet-lite is tested against
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian starts docker-registry as a service on install where it can; the tests run their own.

npm ci --no-audit --no-fund
npm run build
npx tsx scripts/build-demo-images.ts   # the demo images, from busybox-static: build/images/*.tar
echo "setup: done. Run the whole-node demo: npx skiff node --manifests examples/demo --images-dir build/images"
