#!/usr/bin/env bash
# One build of mlx-bun with and without an environment setting, alternating:
# each round runs `bench generate` (one row, a random 128-token prompt, 128
# generated tokens, two passes) once with VAR=OFF_VALUE and once with the
# setting at its default, and prints both generation tok/s; the last line
# gives the medians. With ON_VALUE set, the other side runs with VAR=ON_VALUE
# instead of the default.
#   [ON_VALUE=v] scripts/bench-setting-ab.sh VAR OFF_VALUE [rounds] [binary]
# Examples: scripts/bench-setting-ab.sh MLX_BUN_HUGE_PAGES 0 6
#           ON_VALUE=1 scripts/bench-setting-ab.sh MLX_BUN_CPU_INT8_DOT 0 6
set -euo pipefail
var=${1:?the setting, e.g. MLX_BUN_HUGE_PAGES}
off=${2:?the value that turns it off, e.g. 0}
rounds=${3:-6}
bin=${4:-"$(cd "$(dirname "$0")/.." && pwd)/target/release/mlx-bun"}
tps() {
  "$@" bench generate -p 128 -g 128 -n 2 --no-db 2>&1 |
    sed -n 's/.*Averages:.*generation_tps=\([0-9.]*\).*/\1/p'
}
off_runs=()
on_runs=()
for r in $(seq 1 "$rounds"); do
  a=$(tps env "$var=$off" "$bin")
  if [ -n "${ON_VALUE:-}" ]; then
    b=$(tps env "$var=$ON_VALUE" "$bin")
  else
    b=$(tps env -u "$var" "$bin")
  fi
  off_runs+=("$a")
  on_runs+=("$b")
  echo "round $r  $var=$off: $a tok/s  ${ON_VALUE:+$var=}${ON_VALUE:-default}: $b tok/s"
done
python3 - "${off_runs[*]}" "${on_runs[*]}" <<'PY'
import statistics, sys
off = [float(v) for v in sys.argv[1].split()]
on = [float(v) for v in sys.argv[2].split()]
print(f"medians: off {statistics.median(off):.1f} ({min(off):.1f}-{max(off):.1f}), "
      f"default {statistics.median(on):.1f} ({min(on):.1f}-{max(on):.1f}), "
      f"default/off {statistics.median(on) / statistics.median(off):.2f}x")
PY
