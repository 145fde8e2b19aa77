#!/usr/bin/env bash
# The pinned official API clients (`openai`, `anthropic`) that the agent
# tests drive the server with, in their own virtual environment under the
# mlx-bun cache. Prints the environment's python.
#   scripts/clients-setup.sh
set -euo pipefail

OPENAI_VERSION=3.57.0
ANTHROPIC_VERSION=2.14.0
CACHE="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
VENV="$CACHE/agent-clients-venv"

installed() {
  "$VENV/bin/python" - "$OPENAI_VERSION" "$ANTHROPIC_VERSION" <<'PY' 2>/dev/null
import sys
import anthropic
import openai
sys.exit(0 if (openai.__version__, anthropic.__version__) == tuple(sys.argv[1:3]) else 1)
PY
}

if ! installed; then
  echo "setting up $VENV (openai==$OPENAI_VERSION, anthropic==$ANTHROPIC_VERSION)" >&2
  mkdir -p "$CACHE"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    "openai==$OPENAI_VERSION" "anthropic==$ANTHROPIC_VERSION"
fi
echo "$VENV/bin/python"
