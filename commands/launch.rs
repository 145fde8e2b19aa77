//! `mlx-bun launch`: start one process per rank for MLX's distributed
//! backends (as `mlx.launch`), e.g. `mlx-bun launch -n 2 -- generate …`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use mlx_bun::collective::Group;
use mlx_bun::distributed::launch::{self, HostFile, LaunchSpec, Outcome};
use mlx_bun::distributed::Parallelism;
use mlx_bun::model::Model;

#[derive(clap::Args)]
pub struct Args {
    /// Distributed backend: ring (TCP), nccl (CUDA GPUs) or mpi. Default: the
    /// host file's, else nccl on a GPU build, else ring.
    #[arg(long, value_parser = ["ring", "nccl", "mpi"])]
    backend: Option<String>,
    /// An `mlx.launch` host file (JSON list of {"ssh", "ips"}, or an object
    /// with "backend", "envs" and "hosts").
    #[arg(long, visible_alias = "hostfile", conflicts_with = "n")]
    hosts: Option<PathBuf>,
    /// Run N ranks on this machine.
    #[arg(short = 'n', long = "num-ranks", visible_alias = "repeat-hosts", value_parser = crate::validate::at_least_one)]
    n: Option<usize>,
    /// Ring backend: first port (one per rank and address). Default: free
    /// ports when every rank is local, else 32323.
    #[arg(long, short = 'p')]
    starting_port: Option<u16>,
    /// NCCL backend: the port rank 0 listens on.
    #[arg(long, default_value_t = 12345)]
    nccl_port: u16,
    /// Extra NAME=VALUE environment for every rank (repeatable).
    #[arg(long)]
    env: Vec<String>,
    /// The mlx-bun subcommand and its flags (`generate --prompt …`), or a
    /// program given by its path (`/bin/sh -c …`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub fn run(args: Args) -> Result<()> {
    let hosts = match (&args.hosts, args.n) {
        (Some(path), _) => HostFile::read(path)?,
        (None, Some(n)) => HostFile::local(n),
        (None, None) => bail!("give the ranks: -n N (this machine) or --hosts FILE"),
    };
    let backend = args
        .backend
        .clone()
        .or_else(|| hosts.backend.clone())
        .unwrap_or_else(|| {
            if mlx_bun::mlx_ext::on_gpu() {
                "nccl".into()
            } else {
                "ring".into()
            }
        });
    let first = &args.command[0];
    let command = if first.contains('/') {
        args.command.clone()
    } else {
        let exe = launch::current_program()?.to_string_lossy().into_owned();
        std::iter::once(exe)
            .chain(args.command.iter().cloned())
            .collect()
    };
    let spec = LaunchSpec {
        hosts,
        backend,
        starting_port: args.starting_port,
        nccl_port: args.nccl_port,
        env: args.env,
        command,
    };
    match launch::run(&spec)? {
        Outcome::Success => Ok(()),
        Outcome::RankFailed {
            rank,
            status,
            error,
        } => match error {
            Some(e) => bail!("rank {rank} failed ({status}): {e}"),
            None => bail!("rank {rank} failed ({status})"),
        },
        Outcome::Interrupted(sig) => bail!("interrupted (signal {sig}); all ranks stopped"),
    }
}

/// This process's rank group when it was launched as one rank of several;
/// `None` for a single process (which then behaves exactly as without launch).
pub fn join_group() -> Result<Option<Group>> {
    if !mlx_bun::collective::launched() {
        return Ok(None);
    }
    Ok(Some(Group::init(None)?))
}

/// Splits `model` across `group` (`--pipeline`: layers, else tensors).
pub fn shard(model: &mut Model, group: &Group, pipeline: bool) -> Result<()> {
    let mode = if pipeline {
        Parallelism::Pipeline
    } else {
        Parallelism::Tensor
    };
    mlx_bun::distributed::shard_model(model, group, mode)
}

/// Refuses the flags a sharded run does not support yet, naming the flag.
pub fn refuse_sharded(flags: &[(&str, bool)]) -> Result<()> {
    if let Some((name, _)) = flags.iter().find(|(_, set)| *set) {
        bail!("{name} is not supported when the model is sharded across ranks (see docs/distributed.md)");
    }
    Ok(())
}
