#!/bin/bash
# A real PyTorch 2.6 client (TCPStore, is_master=False) against weft-store.
# Usage: pytorch_client_on_weft_server.sh WEFT_STORE_BIN CLIENT_SCRIPT
# Exits 77 (meson: SKIP) where the PyTorch chroot is not installed.
set -euo pipefail
WEFT_STORE="$1"
SCRIPT="$2"
PYTORCH_PYTHON=/work/shared/tools/pytorch-peer/pytorch-python
if [[ ! -x "$PYTORCH_PYTHON" || ! -d /opt/trixie ]]; then
  echo "SKIP: PyTorch peer not installed ($PYTORCH_PYTHON, /opt/trixie)"
  exit 77
fi

# Starts weft-store on a free port, runs the client script against it with the given extra
# arguments, then stops the server with SIGTERM and requires exit 0 from both.
run_against_weft_store() {
  # The server's stdout is a pipe: a blocking read (bounded) waits for the "listening" line,
  # which carries the port the kernel chose.
  coproc SERVER { exec "$WEFT_STORE" --host 127.0.0.1 --port 0; }
  local server=$SERVER_PID line="" port status=0
  trap 'kill "$server" 2>/dev/null || true' EXIT
  read -r -t 10 line <&"${SERVER[0]}" || true
  port=$(sed -n 's/^weft-store listening on .*:\([0-9]*\)$/\1/p' <<<"$line")
  if [[ -z "$port" ]]; then
    echo "FAIL: weft-store did not report its port (got: $line)"
    exit 1
  fi
  # The script lives in the checkout, which pytorch-python binds at the same path.
  timeout 90 "$PYTORCH_PYTHON" "$(realpath "$SCRIPT")" 127.0.0.1 "$port" "$@"
  kill -TERM "$server"
  wait "$server" || status=$?
  trap - EXIT
  echo "weft-store exited $status after SIGTERM"
  [[ $status -eq 0 ]] || exit "$status"
}

unset WEFT_STORE_TOKEN
run_against_weft_store
WEFT_STORE_TOKEN="compat-test-token" run_against_weft_store --expect-refused
