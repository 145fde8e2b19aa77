#!/usr/bin/env bash
# Builds mlx-bun for NVIDIA GPUs (MLX's CUDA backend) on a machine without
# the CUDA toolkit, and packs what a GPU machine needs into one folder:
#
#   scripts/gpu-build.sh [OUT]            # default OUT: target/gpu-bundle
#   OUT/run.sh generate --prompt "Hi"     # on the GPU machine
#
# How: the `mlx-cuda-13` wheel's libmlx.so is linked against the public
# headers and CMake files of the `mlx-cpu` wheel of the same version (they
# are identical; the CUDA wheel's MLXConfig.cmake asks for nvcc, which a CPU
# machine lacks). The CUDA libraries it needs (cuBLAS, cuDNN, NCCL, NVRTC)
# are not here, so the link allows undefined symbols in shared libraries;
# at run time they come from the GPU machine's CUDA 13 install.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/target/gpu-bundle}"
VERSION=0.32.2
CACHE="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
WHEEL_DIR="$CACHE/mlx-cuda-13-$VERSION"
CPU_DIR="$CACHE/mlx-cpu-$VERSION"
PREFIX="$CACHE/mlx-cuda-prefix-$VERSION"

step() { echo "gpu-build: $*" >&2; }

if [ ! -f "$WHEEL_DIR/mlx/lib/libmlx.so" ]; then
  step "fetching the mlx-cuda-13==$VERSION wheel"
  tmp="$(mktemp -d)"
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux_2_35_x86_64 --python-version 3.12 "mlx-cuda-13==$VERSION" -d "$tmp"
  mkdir -p "$WHEEL_DIR"
  python3 -m zipfile -e "$tmp"/mlx_cuda_13-*.whl "$WHEEL_DIR"
  rm -rf "$tmp"
fi
if [ ! -d "$CPU_DIR/mlx/include" ]; then
  step "fetching the mlx-cpu==$VERSION wheel (headers)"
  tmp="$(mktemp -d)"
  python3 -m pip download --quiet --no-deps "mlx-cpu==$VERSION" -d "$tmp"
  mkdir -p "$CPU_DIR"
  python3 -m zipfile -e "$tmp"/mlx_cpu-*.whl "$CPU_DIR"
  rm -rf "$tmp"
fi
mkdir -p "$PREFIX/lib"
ln -sfn "$CPU_DIR/mlx/include" "$PREFIX/include"
ln -sfn "$CPU_DIR/mlx/share" "$PREFIX/share"
ln -sf "$WHEEL_DIR/mlx/lib/libmlx.so" "$PREFIX/lib/libmlx.so"

step "building (target/gpu; the first build compiles mlx-c against this MLX)"
MLX_PREFIX="$PREFIX" MLX_BUN_BLAS=reference \
  RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined" \
  cargo build --release --bin mlx-bun --target-dir "$ROOT/target/gpu"

step "packing $OUT"
rm -rf "$OUT"
mkdir -p "$OUT/lib"
strip -o "$OUT/mlx-bun" "$ROOT/target/gpu/release/mlx-bun"
cp "$WHEEL_DIR/mlx/lib/"*.so* "$OUT/lib/"
[ -d "$WHEEL_DIR/mlx_cuda_13.libs" ] && cp "$WHEEL_DIR/mlx_cuda_13.libs/"* "$OUT/lib/" || true
# MLX's CUDA JIT (NVRTC) looks for the CUDA C++ standard library headers
# (CCCL) and CUTLASS/CuTe (quantized matmul kernels) in include/ beside the
# folder holding libmlx.so.
mkdir -p "$OUT/include"
cp -r "$WHEEL_DIR/mlx/include/"{cccl,cute,cutlass} "$OUT/include/"
# The link also pulls in the mlx-cpu wheel's bundled BLAS/LAPACK.
cp "$CPU_DIR/mlx_cpu.libs/"* "$OUT/lib/"
cat >"$OUT/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs mlx-bun on a machine with an NVIDIA GPU and CUDA 13's libraries: the
# bundled libmlx first, then CUDA's (CUDA_LIBS, else the nvidia-* Python
# packages of the first python3 that has them, else the system's).
here="$(cd "$(dirname "$0")" && pwd)"
cuda="${CUDA_LIBS:-}"
if [ -z "$cuda" ]; then
  site="$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null || true)"
  [ -n "$site" ] && cuda="$(ls -d "$site"/nvidia/*/lib 2>/dev/null | tr '\n' :)"
fi
export LD_LIBRARY_PATH="$here/lib:$cuda${LD_LIBRARY_PATH:-}"
exec "$here/mlx-bun" "$@"
RUN
chmod +x "$OUT/run.sh"
du -sh "$OUT" >&2
