//! `mlx-bun upload`: a model folder to a Hub repository (as `mlx_lm.upload`),
//! with a progress bar; also used by `convert --upload-repo` and
//! `train fuse --upload-repo`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use mlx_bun::upload::{self, Hub, UploadEvent};

#[derive(clap::Args)]
pub struct Args {
    /// The model folder to upload.
    #[arg(long, default_value = "mlx_model")]
    path: PathBuf,
    /// The Hub repo to upload to (user/name); created when missing.
    #[arg(long)]
    upload_repo: String,
    /// Create the repo as private.
    #[arg(long)]
    private: bool,
}

pub fn run(args: Args) -> Result<()> {
    upload_with_progress(&args.path, &args.upload_repo, args.private)
}

/// Fills in the model card, then uploads `dir` to `repo` under a progress bar.
pub fn upload_with_progress(dir: &Path, repo: &str, private: bool) -> Result<()> {
    upload::validate_repo_id(repo)?;
    let hub = Hub::from_env()?;
    if !dir.is_dir() {
        anyhow::bail!("{} is not a directory", dir.display());
    }
    upload::fill_model_card(dir, repo, &hub.endpoint)?;
    let bar = crate::progress::bar(
        "uploading [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}) {msg}",
        0,
        true,
    );
    let summary = upload::upload_folder(&hub, dir, repo, private, &mut |event| match event {
        UploadEvent::Start { bytes, .. } => bar.set_length(bytes),
        UploadEvent::Sent { path, bytes } => {
            bar.set_message(path.to_string());
            bar.inc(bytes);
        }
        UploadEvent::Retry { what, error } => bar.suspend(|| eprintln!("retrying {what}: {error}")),
    })?;
    bar.finish_and_clear();
    eprintln!(
        "uploaded {} files to {} ({} through LFS, {} already there, {:.1} MB sent){}",
        summary.files,
        summary.repo_url,
        summary.lfs_files,
        summary.lfs_skipped,
        summary.bytes_sent as f64 / 1e6,
        summary
            .commit
            .map(|c| format!(", commit {c}"))
            .unwrap_or_default()
    );
    Ok(())
}
