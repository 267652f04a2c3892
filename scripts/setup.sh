#!/usr/bin/env bash
# Sets up a Debian 12 machine for skiff: system packages, npm packages, the build, the demo
# images. Each step is skipped when nothing is missing. Run as root: ./scripts/setup.sh
# (scripts/demo.sh and scripts/test.sh run it first.)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  runc crun conmon catatonit          # OCI runtimes and the container monitor
  containernetworking-plugins iproute2 iptables socat util-linux  # pod networking and namespaces
  conntrack                           # the service proxy drops stale UDP conntrack entries
  nftables                            # nft: the proxy's nftables mode and NetworkPolicy rules
  dnsutils dnsmasq-base               # dig in the service DNS tests; dnsmasq, the DNS benchmark's floor
  zstd                                # zstd-compressed layers
  docker-registry busybox-static      # the tests' local registry and image contents
  openssl                             # the tests' TLS registry certificate
  unzip                               # kubectl and helm for the API tests, from their npm package
  gcc libc6-dev                       # the seccomp tests build a static syscall probe
  containerd                          # the reference runtime kubelet-lite is tested against
  e2fsprogs                           # mkfs.ext4: the disk-pressure test's small filesystem on a loop device
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

# npm ci only when the lock file changed since the last install (it is the slow step).
lock_hash=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ "$(cat node_modules/.skiff-lock-hash 2>/dev/null)" != "$lock_hash" ]; then
  npm ci --no-audit --no-fund
  echo "$lock_hash" > node_modules/.skiff-lock-hash
fi
npm run build
./scripts/unpack-kubectl.sh          # kubectl 1.35 and helm 4 for the API tests: build/bin (skipped when current)
# The demo images, from busybox-static: build/images/*.tar, remade when their builder changes.
if [ ! -s build/images/demo-web.tar ] || [ ! -s build/images/demo-client.tar ] || [ scripts/build-demo-images.ts -nt build/images/demo-web.tar ]; then
  npx tsx scripts/build-demo-images.ts
fi
echo "setup: done."
