#!/usr/bin/env bash
# The whole node running the demo (examples/demo), on a Debian 12 machine as root: first sets up
# whatever is missing (scripts/setup.sh), starts `skiff node`, and once its API answers applies the
# demo through it with kubectl (so kubectl can scale, edit and delete it, as on a cluster).
# Extra arguments go to `skiff node`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

# The admin kubeconfig is <--root-dir>/admin.kubeconfig.
root_dir=/var/lib/skiff/kubelet
args=("$@")
for i in "${!args[@]}"; do
  case "${args[$i]}" in
    --root-dir) root_dir="${args[$((i + 1))]:-$root_dir}" ;;
    --root-dir=*) root_dir="${args[$i]#--root-dir=}" ;;
  esac
done
kubectl=(build/bin/kubectl --kubeconfig "$root_dir/admin.kubeconfig")

(
  for _ in $(seq 120); do
    if "${kubectl[@]}" get namespace default >/dev/null 2>&1; then
      "${kubectl[@]}" apply -f examples/demo >&2 && exit 0
    fi
    sleep 1
  done
  echo "demo.sh: the node's API did not answer within 2 minutes; the demo was not applied" >&2
) &

exec node bin/skiff.js node --images-dir build/images "$@"
