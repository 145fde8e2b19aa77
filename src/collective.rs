//! The collective-communication handle, on the ground floor: a [`Group`]
//! of ranks joined through MLX's own distributed layer (`mlx_distributed_*`
//! of mlx-c: the ring backend over TCP, MPI, and NCCL on CUDA), its
//! collectives (`all_sum`, `all_gather`, `send`, `recv`), and what the
//! process environment MLX's backends read says about the launch. It names
//! nothing above it: splitting a model across the group is
//! `crate::distributed`'s, which stands on the model.

use std::ffi::CString;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use mlx_rs::Array;

/// The backends `--backend` accepts (`any` lets MLX pick the first available).
pub(crate) const BACKENDS: [&str; 4] = ["ring", "nccl", "mpi", "any"];

struct RawGroup(mlx_sys::mlx_distributed_group);

// SAFETY: an MLX group is a shared pointer to a communicator that MLX itself
// uses from its scheduler threads; the handle is only read after creation.
unsafe impl Send for RawGroup {}
unsafe impl Sync for RawGroup {}

impl Drop for RawGroup {
    fn drop(&mut self) {
        // SAFETY: the handle came from mlx_distributed_group_new and was filled
        // by mlx_distributed_init; RawGroup is not Clone and lives in one Arc,
        // so this is its only free.
        unsafe {
            mlx_sys::mlx_distributed_group_free(self.0);
        }
    }
}

/// A communication group of ranks (a cheap handle).
#[derive(Clone)]
pub struct Group {
    raw: Arc<RawGroup>,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Group(rank {} of {})", self.rank, self.size)
    }
}

/// Whether this process was started as one rank of several (by `mlx-bun
/// launch`, `mlx.launch`, or `mpirun`).
pub fn launched() -> bool {
    world_size_from_env().is_some_and(|n| n > 1)
}

fn world_size_from_env() -> Option<usize> {
    if let Ok(n) = std::env::var("MLX_WORLD_SIZE") {
        return n.parse().ok();
    }
    if let Ok(path) = std::env::var("MLX_HOSTFILE") {
        // The ring backend's host file: a JSON list with one entry per rank.
        let text = std::fs::read_to_string(path).ok()?;
        let hosts: Vec<serde_json::Value> = serde_json::from_str(&text).ok()?;
        return Some(hosts.len());
    }
    for var in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"] {
        if let Ok(n) = std::env::var(var) {
            return n.parse().ok();
        }
    }
    None
}

impl Group {
    /// Joins the group this process was launched into. `backend` is one of
    /// [`BACKENDS`]; `None` takes the settings' backend (`MLX_BUN_BACKEND`,
    /// set by `mlx-bun launch`) and falls back to `any`.
    pub fn init(backend: Option<&str>) -> Result<Self> {
        crate::mlx_ext::init_runtime();
        let backend = backend
            .or(crate::settings::get().backend.as_deref())
            .unwrap_or("any");
        if !BACKENDS.contains(&backend) {
            bail!("unknown distributed backend {backend:?} (one of {BACKENDS:?})");
        }
        let name = CString::new(backend)?;
        // SAFETY: plain calls into mlx-c with a valid C string; the group
        // handle is owned by RawGroup and freed on drop.
        unsafe {
            if !mlx_sys::mlx_distributed_is_available(name.as_ptr()) {
                bail!("MLX's {backend} distributed backend is not available in this build");
            }
            let mut raw = mlx_sys::mlx_distributed_group_new();
            let rc = mlx_sys::mlx_distributed_init(&mut raw, true, name.as_ptr());
            if rc != 0 || raw.ctx.is_null() {
                bail!(
                    "MLX could not join the {backend} group (for ring: MLX_RANK and \
                     MLX_HOSTFILE; for nccl: MLX_RANK, MLX_WORLD_SIZE, NCCL_HOST_IP, NCCL_PORT)"
                );
            }
            let rank = mlx_sys::mlx_distributed_group_rank(raw);
            let size = mlx_sys::mlx_distributed_group_size(raw);
            let raw = RawGroup(raw);
            if rank < 0 || size < 1 {
                bail!("MLX reported rank {rank} of {size}");
            }
            Ok(Self {
                raw: Arc::new(raw),
                rank: rank as usize,
                size: size as usize,
            })
        }
    }

    /// This process's rank, 0 to `size() - 1`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The element-wise sum of `x` over all ranks (lazy).
    pub(crate) fn all_sum(&self, x: &Array) -> Result<Array> {
        // SAFETY: `x` and the group handle stay alive (borrowed from `self` and the
        // caller) for the call, which only reads them; `res` is the fresh handle
        // `collective` owns, and `s` is its live stream.
        self.collective("all_sum", |res, s| unsafe {
            mlx_sys::mlx_distributed_all_sum(res, x.as_ptr(), self.raw.0, s)
        })
    }

    /// `x` of every rank concatenated along the first axis, rank order (lazy).
    pub(crate) fn all_gather(&self, x: &Array) -> Result<Array> {
        // SAFETY: `x` and the group handle stay alive (borrowed from `self` and the
        // caller) for the call, which only reads them; `res` is the fresh handle
        // `collective` owns, and `s` is its live stream.
        self.collective("all_gather", |res, s| unsafe {
            mlx_sys::mlx_distributed_all_gather(res, x.as_ptr(), self.raw.0, s)
        })
    }

    /// Sends `x` to rank `dst`; the result must be evaluated for the send to happen.
    pub(crate) fn send(&self, x: &Array, dst: usize) -> Result<Array> {
        // SAFETY: `x` and the group handle stay alive (borrowed from `self` and the
        // caller) for the call, which only reads them; `res` is the fresh handle
        // `collective` owns, and `s` is its live stream.
        self.collective("send", |res, s| unsafe {
            mlx_sys::mlx_distributed_send(res, x.as_ptr(), dst as i32, self.raw.0, s)
        })
    }

    /// Receives an array shaped like `x` from rank `src` (lazy).
    pub(crate) fn recv_like(&self, x: &Array, src: usize) -> Result<Array> {
        // SAFETY: `x` and the group handle stay alive (borrowed from `self` and the
        // caller) for the call, which only reads them; `res` is the fresh handle
        // `collective` owns, and `s` is its live stream.
        self.collective("recv", |res, s| unsafe {
            mlx_sys::mlx_distributed_recv_like(res, x.as_ptr(), src as i32, self.raw.0, s)
        })
    }

    fn collective(
        &self,
        what: &str,
        op: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
    ) -> Result<Array> {
        let stream = mlx_rs::Stream::new();
        // SAFETY: `res` is a fresh handle that `op` fills; on success its
        // ownership passes to the returned Array, on failure it is freed.
        unsafe {
            let mut res = mlx_sys::mlx_array_new();
            let rc = op(&mut res, stream.as_ptr());
            if rc != 0 {
                mlx_sys::mlx_array_free(res);
                return Err(anyhow!("distributed {what} failed (rank {})", self.rank));
            }
            Ok(Array::from_ptr(res))
        }
    }

    /// Rank 0's `payload`, on every rank (the others pass `None`): an
    /// `all_sum` in which every other rank contributes zeros, first of the
    /// length, then of the bytes. Blocks until every rank has called it.
    pub(crate) fn broadcast_bytes(&self, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        let mine = match (self.rank, payload) {
            (0, Some(p)) => p,
            (0, None) => bail!("rank 0 must give the bytes it broadcasts"),
            _ => &[],
        };
        let len = i32::try_from(mine.len())
            .map_err(|_| anyhow!("a broadcast of {} bytes is too large", mine.len()))?;
        let n = self.all_sum(&Array::from_slice(&[len], &[1]))?;
        n.eval()?;
        let n = n.as_slice::<i32>()[0];
        if n <= 0 {
            return Ok(Vec::new());
        }
        let data = if self.rank == 0 {
            Array::from_slice(mine, &[n])
        } else {
            Array::from_slice(&vec![0u8; n as usize], &[n])
        };
        let summed = self.all_sum(&data)?;
        summed.eval()?;
        Ok(summed.as_slice::<u8>().to_vec())
    }

    /// Rank 0's `seed`, known to every rank: ranks sample identically only
    /// when their random streams start from the same seed.
    pub fn agree_seed(&self, seed: Option<u64>) -> Result<u64> {
        let mine = match seed {
            Some(s) => s,
            None if self.rank == 0 => rand::random::<u32>() as u64,
            None => 0,
        };
        // Two 32-bit halves: MLX sums integers as int32 here.
        let contribution = if self.rank == 0 {
            [
                (mine & 0xffff_ffff) as u32 as i32,
                (mine >> 32) as u32 as i32,
            ]
        } else {
            [0, 0]
        };
        let summed = self.all_sum(&Array::from_slice(&contribution, &[2]))?;
        summed.eval()?;
        let parts: &[i32] = summed.as_slice();
        Ok((parts[0] as u32 as u64) | ((parts[1] as u32 as u64) << 32))
    }
}
