#!/usr/bin/env bash
# Runs the official `openai` Python client (a pinned version, in its own small
# virtual environment under the mlx-bun cache) against a running server.
#
#   scripts/test-openai-client.sh http://127.0.0.1:8080 [API_KEY]
set -euo pipefail

OPENAI_VERSION=3.57.0
CACHE="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
VENV="$CACHE/openai-client-venv"
HERE="$(cd "$(dirname "$0")" && pwd)"

if [ $# -lt 1 ]; then
  echo "usage: $0 BASE_URL [API_KEY]" >&2
  exit 2
fi

installed() {
  "$VENV/bin/python" - "$OPENAI_VERSION" <<'PY' 2>/dev/null
import sys
import openai
sys.exit(0 if openai.__version__ == sys.argv[1] else 1)
PY
}

if ! installed; then
  echo "setting up $VENV (openai==$OPENAI_VERSION)" >&2
  mkdir -p "$CACHE"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION"
fi

exec "$VENV/bin/python" "$HERE/../tests/openai_client.py" "$@"
