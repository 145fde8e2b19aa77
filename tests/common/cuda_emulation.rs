//! Building and driving mlx-bun's CUDA kernels compiled for the CPU
//! (`tests/cuda_emulation/`), and the float files they exchange.

use std::path::{Path, PathBuf};
use std::process::Command;

use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype};

/// Compiles `tests/cuda_emulation/{name}.cpp` (which includes the kernel's
/// source from `kernels/cuda`) into `dir`.
pub fn build(dir: &Path, name: &str) -> PathBuf {
    let root = super::repo_root();
    let include = dir.join("include");
    std::fs::create_dir_all(&include).unwrap();
    // The CUDA headers the kernels include; the shim defines what they use.
    for header in ["cuda_bf16.h", "cuda_fp16.h"] {
        std::fs::write(include.join(header), "").unwrap();
    }
    let exe = dir.join(name);
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    // CUDA reinterprets words as halves freely: no strict aliasing.
    let out = Command::new(&compiler)
        .args(["-std=c++20", "-O2", "-pthread", "-fno-strict-aliasing"])
        .args(["-Wall", "-Wno-unknown-pragmas", "-Wno-maybe-uninitialized"])
        .arg("-I")
        .arg(&include)
        .arg("-I")
        .arg(root.join("kernels/cuda"))
        .arg("-I")
        .arg(root.join("tests/cuda_emulation"))
        .arg("-o")
        .arg(&exe)
        .arg(root.join(format!("tests/cuda_emulation/{name}.cpp")))
        .output()
        .unwrap_or_else(|e| panic!("running the C++ compiler {compiler}: {e}"));
    assert!(
        out.status.success(),
        "compiling the emulated kernel {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs a built kernel; panics with its error output if it fails, or if it
/// has not finished in a minute (a kernel whose threads wait at a barrier
/// some never reach would hang).
pub fn run(exe: &Path, args: &[String]) {
    let mut child = Command::new(exe)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > std::time::Duration::from_secs(60) {
            child.kill().ok();
            panic!("{} {args:?} did not finish in 60 s", exe.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).ok();
    assert!(status.success(), "{}: {stderr}", exe.display());
}

pub fn random(shape: &[i32], dtype: Dtype) -> Array {
    let a = mlx_rs::random::normal::<f32>(shape, None, None, None)
        .unwrap()
        .as_dtype(dtype)
        .unwrap();
    eval([&a]).unwrap();
    a
}

pub fn floats(a: &Array) -> Vec<f32> {
    let a = a.as_dtype(Dtype::Float32).unwrap();
    eval([&a]).unwrap();
    a.as_slice::<f32>().to_vec()
}

/// `a` as float32 values (uint32 arrays as their raw words).
pub fn write(path: PathBuf, a: &Array) {
    let bytes: Vec<u8> = if a.dtype() == Dtype::Uint32 {
        eval([a]).unwrap();
        a.as_slice::<u32>()
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect()
    } else {
        floats(a).iter().flat_map(|f| f.to_le_bytes()).collect()
    };
    std::fs::write(path, bytes).unwrap();
}

pub fn read(path: PathBuf) -> Vec<f32> {
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The largest difference relative to the largest reference value (NaN
/// when `ours` holds one).
pub fn relative(ours: &[f32], reference: &[f32]) -> f32 {
    assert_eq!(ours.len(), reference.len());
    if ours.iter().any(|x| x.is_nan()) {
        return f32::NAN;
    }
    let diff = ours
        .iter()
        .zip(reference)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    let scale = reference.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    diff / scale.max(f32::MIN_POSITIVE)
}
