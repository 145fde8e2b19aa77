"""Compiles mlx-bun's CUDA kernels with NVRTC, as MLX's custom-kernel API
wraps them (the header, then a `__global__` signature around the body), for
an H100/H200 (sm_90): the check that the sources compile, on a machine
without a GPU.

Usage: python nvrtc_check.py LIBNVRTC CUDA_INCLUDE KERNELS_DIR
LIBNVRTC: libnvrtc.so; CUDA_INCLUDE: the folder with cuda_bf16.h and
cuda_fp16.h; KERNELS_DIR: kernels/cuda. Prints one line per kernel and
instantiation; exits 1 when any fails, with NVRTC's log.
"""

import ctypes
import pathlib
import re
import sys

# What the kernels take from MLX's device headers (`Shape`, fixed-width
# integers).
PRELUDE = """
typedef int int32_t;
typedef unsigned int uint32_t;
struct Shape {
  int32_t data[10];
  __device__ int32_t operator[](int i) const { return data[i]; }
};
"""

# name -> (header file, body, [(param, type)] inputs, [(name, type)] outputs,
#          [dict of compile-time constants] instantiations)
KERNELS = {
    "mlx_bun_decode_attention": (
        "decode_attention.cu",
        "mlx_bun_attention::decode_attention<T, D, WARPS, TRAD, FREQS>(\n"
        "    q, k, v, keys, keys_shape, values, offset, params, freqs, out);",
        [("q", "T"), ("k", "T"), ("v", "T"), ("keys", "T"), ("keys_shape", "Shape"),
         ("values", "T"), ("offset", "int32_t"), ("params", "float"), ("freqs", "float")],
        [("out", "T")],
        [
            {"T": t, "D": d, "WARPS": 8, "TRAD": trad, "FREQS": freqs}
            for t in ("__nv_bfloat16", "__half")
            for d in (64, 128, 256)
            for trad in (0, 1)
            for freqs in (0, 1)
            if not (trad and d < 128)
        ],
    ),
    "mlx_bun_qmv": (
        "qmv.cu",
        "mlx_bun_qmv::qmv<T, S, MB, GS, BITS, WARPS, R, KCAP, false>(\n"
        " x, x_shape, x_ndim, w, w_shape, scales, biases, w, scales, biases, y, nullptr, 0);",
        [("x", "T"), ("x_shape", "Shape"), ("x_ndim", "int"), ("w", "uint32_t"),
         ("w_shape", "Shape"), ("scales", "S"), ("biases", "S")],
        [("y", "T")],
        [
            {"T": "__nv_bfloat16", "S": "__nv_bfloat16", "MB": mb, "GS": 64, "BITS": bits,
             "WARPS": 4, "R": r, "KCAP": kcap}
            for mb in (1, 4)
            for bits in (4, 8)
            for r in (1, 4)
            for kcap in (0, 4096)
        ],
    ),
    "mlx_bun_qmv_qkv_norm": (
        "qmv.cu",
        "mlx_bun_qmv::qkv<T, S, MB, GS, BITS, WARPS, R, KCAP>(\n"
        " x, x_shape, x_ndim, w, w_shape, scales, biases, wk, wk_shape, sk, bk,\n"
        " wv, wv_shape, sv, bv, y, yk, yv, norm, __int_as_float(EPS));",
        [("x", "T"), ("x_shape", "Shape"), ("x_ndim", "int"), ("norm", "T"), ("w", "uint32_t"),
         ("w_shape", "Shape"), ("scales", "S"), ("biases", "S"), ("wk", "uint32_t"),
         ("wk_shape", "Shape"), ("sk", "S"), ("bk", "S"), ("wv", "uint32_t"),
         ("wv_shape", "Shape"), ("sv", "S"), ("bv", "S")],
        [("y", "T"), ("yk", "T"), ("yv", "T")],
        [
            {"T": t, "S": t, "MB": mb, "GS": 64, "BITS": 4, "WARPS": 4, "R": 2, "KCAP": 4096,
             "EPS": 925353388}
            for t in ("__nv_bfloat16", "__half")
            for mb in (1, 4)
        ],
    ),
    "mlx_bun_qmv_glu_norm": (
        "qmv.cu",
        "mlx_bun_qmv::qmv<T, S, MB, GS, BITS, WARPS, R, KCAP, true>(\n"
        " x, x_shape, x_ndim, w, w_shape, scales, biases, w2, scales2, biases2, y, nullptr, 0,\n"
        " norm, __int_as_float(EPS));",
        [("x", "T"), ("x_shape", "Shape"), ("x_ndim", "int"), ("norm", "T"), ("w", "uint32_t"),
         ("w_shape", "Shape"), ("scales", "S"), ("biases", "S"), ("w2", "uint32_t"),
         ("scales2", "S"), ("biases2", "S")],
        [("y", "T")],
        [
            {"T": "__nv_bfloat16", "S": "__nv_bfloat16", "MB": 1, "GS": 64, "BITS": bits,
             "WARPS": 4, "R": 4, "KCAP": 4096, "EPS": 925353388}
            for bits in (4, 8)
        ],
    ),
}


def source(name, header, body, inputs, outputs, consts):
    params = []
    for param, ty in inputs:
        if ty == "Shape":
            params.append(f"    const __grid_constant__ Shape {param}")
        elif param.endswith("_ndim"):
            params.append(f"    const __grid_constant__ int {param}")
        else:
            params.append(f"    const {ty}* {param}")
    params += [f"    {ty}* {param}" for param, ty in outputs]
    lines = []
    for key, value in consts.items():
        if isinstance(value, str):
            lines.append(f"  using {key} = {value};")
        else:
            lines.append(f"  constexpr int {key} = {value};")
    # The signature names types before the constants define them: MLX
    # writes the concrete types there; so does this check.
    types = {k: v for k, v in consts.items() if isinstance(v, str)}
    for key, value in types.items():
        params = [re.sub(rf"\b{key}\b(?=\*)", value, p) for p in params]
    return (
        PRELUDE
        + header
        + "\nnamespace mlx::core::cu {\n__global__ void "
        + name
        + "(\n"
        + ",\n".join(params)
        + ") {\n"
        + "\n".join(lines)
        + "\n"
        + body
        + "\n}\n}\n"
    )


def compile_one(nvrtc, text, name, include):
    prog = ctypes.c_void_p()
    rc = nvrtc.nvrtcCreateProgram(
        ctypes.byref(prog), text.encode(), f"{name}.cu".encode(), 0, None, None
    )
    if rc != 0:
        return False, f"nvrtcCreateProgram: {rc}"
    options = [
        b"--gpu-architecture=compute_90",
        b"--std=c++17",
        f"--include-path={include}".encode(),
    ]
    array = (ctypes.c_char_p * len(options))(*options)
    rc = nvrtc.nvrtcCompileProgram(prog, len(options), array)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc == 0, log.value.decode(errors="replace")


def main():
    lib, include, kernels = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    nvrtc = ctypes.CDLL(lib)
    failed = 0
    for name, (file, body, inputs, outputs, instances) in KERNELS.items():
        header = (kernels / file).read_text()
        for consts in instances:
            text = source(name, header, body, inputs, outputs, consts)
            ok, log = compile_one(nvrtc, text, name, include)
            tag = " ".join(f"{k}={v}" for k, v in consts.items())
            print(f"{name} {tag}: {'ok' if ok else 'FAILED'}", flush=True)
            if not ok:
                failed += 1
                print(log)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
