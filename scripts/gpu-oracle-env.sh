# Sourced by the GPU scripts: the oracle's environment on a GPU machine
# (mlx-lm in $WORK/site, the bundle's libmlx, CUDA 13's libraries from the
# nvidia-* Python packages) and the summary log.

cuda_libs() {
  local site
  site="$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null)"
  ls -d "$site"/nvidia/*/lib 2>/dev/null | tr '\n' :
}

oracle_env() {
  export PYTHONPATH="$WORK/site"
  export LD_LIBRARY_PATH="$WORK/site/mlx/lib:$(cuda_libs)${LD_LIBRARY_PATH:-}"
  export HF_HUB_OFFLINE=1
}

note() { echo "$*" | tee -a "$OUT/summary.txt"; }
