#!/usr/bin/env bash
# Creates or updates the oracle environment: mlx-lm pinned to the same MLX as
# the mlx-bun binary, in ${MLX_BUN_CACHE:-~/.cache/mlx-bun}/oracle-venv.
# Idempotent: when the venv already matches requirements.txt (a stamp holds
# the file's hash) it only prints the interpreter path.
# Usage: scripts/oracle/setup.sh            prints the oracle python path
#        PYTHON=python3.11 scripts/oracle/setup.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
requirements="$here/requirements.txt"
cache="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
venv="$cache/oracle-venv"
python="$venv/bin/python"
stamp="$venv/.requirements.sha256"

want="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [[ -x "$python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "$python"
    exit 0
fi

base="${PYTHON:-python3}"
if ! command -v "$base" >/dev/null; then
    echo "error: $base not found; set PYTHON to a Python 3.10+ interpreter" >&2
    exit 1
fi
if ! "$base" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "error: $base is $("$base" --version 2>&1); the oracle needs Python 3.10+" >&2
    exit 1
fi

mkdir -p "$cache"
if [[ ! -x "$python" ]]; then
    echo "creating the oracle venv in $venv" >&2
    "$base" -m venv "$venv"
fi
echo "installing $(grep -cvE '^\s*(#|$)' "$requirements") pinned packages into $venv" >&2
"$python" -m pip install --quiet --disable-pip-version-check -r "$requirements" >&2
"$python" -c 'import mlx.core, mlx_lm' >&2
echo "$want" >"$stamp"
echo "$python"
