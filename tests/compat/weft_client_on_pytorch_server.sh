#!/bin/bash
# Runs weft's TCPStore client against PyTorch 2.x's TCPStore server, both ways: the server and a
# PyTorch client run in the PyTorch chroot (/work/shared/tools/pytorch-peer), weft's client here.
# Exits 77 (meson: SKIP) when that chroot is not available.
#
# Usage: weft_client_on_pytorch_server.sh WEFT_CLIENT_BINARY
set -u
client="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
peer="${WEFT_PYTORCH_PYTHON:-/work/shared/tools/pytorch-peer/pytorch-python}"

if [ ! -x "$peer" ] || ! timeout 60 "$peer" -c 'import torch.distributed' >/dev/null 2>&1; then
  echo "SKIP: no PyTorch peer at $peer (see /work/shared/tools/pytorch-peer/README.md)"
  exit 77
fi

# Beside the client binary (the build tree): /tmp is not visible inside the chroot.
work="$(mktemp -d "$(cd "$(dirname "$client")" && pwd)/compat.XXXXXX")"
trap 'kill "$server_pid" 2>/dev/null; rm -rf "$work"' EXIT
"$peer" "$here/weft_client_on_pytorch_server.py" "$work/port" >"$work/server.log" 2>&1 &
server_pid=$!

# Wait (bounded) for the server to publish its port; the file appears by rename, whole.
for _ in $(seq 1 600); do
  [ -s "$work/port" ] && break
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "PyTorch side exited before publishing its port:"; cat "$work/server.log"; exit 1
  fi
  sleep 0.1
done
if [ ! -s "$work/port" ]; then echo "PyTorch server did not start in 60 s"; exit 1; fi

timeout 120 "$client" "$(cat "$work/port")"
client_rc=$?
timeout 60 tail --pid="$server_pid" -f /dev/null
wait "$server_pid"
server_rc=$?
cat "$work/server.log"
echo "weft client exit $client_rc, PyTorch side exit $server_rc"
[ "$client_rc" = 0 ] && [ "$server_rc" = 0 ]
