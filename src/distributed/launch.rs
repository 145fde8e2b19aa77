//! Starting one process per rank with the environment MLX's backends read,
//! compatible with `mlx.launch`'s host files:
//!
//! - ring: `MLX_RANK` and `MLX_HOSTFILE`, a file holding a JSON list with one
//!   entry per rank, each a list of `"ip:port"` the rank listens on;
//! - nccl: `MLX_RANK`, `MLX_WORLD_SIZE`, `NCCL_HOST_IP`, `NCCL_PORT` (rank 0's
//!   address), `CUDA_VISIBLE_DEVICES` (one GPU per rank on a host) and
//!   `NCCL_NVLS_ENABLE=0` unless given;
//! - mpi: `mpirun` with a host file of `host slots=n`.
//!
//! A host file is a JSON list of `{"ssh": name, "ips": [..]}`, or an object
//! `{"backend": .., "envs": ["K=V"], "hosts": [..]}`. Ranks on `127.0.0.1` or
//! `localhost` start here; others through `ssh`, with the same program path
//! and working directory. The supervisor forwards SIGINT/SIGTERM, and when a
//! rank fails it stops the others and reports that rank's error.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// One machine of the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// The name to `ssh` into (`127.0.0.1` for this machine).
    pub ssh: String,
    /// The addresses the ring backend listens on.
    pub ips: Vec<String>,
}

/// The ranks to start (one per entry of `hosts`).
#[derive(Clone, Debug, Default)]
pub struct HostFile {
    /// The machines, one rank each, rank 0 first.
    pub hosts: Vec<Host>,
    /// The backend the file asks for (`ring`, `nccl`, `mpi`), if any.
    pub backend: Option<String>,
    /// `NAME=VALUE` settings for every rank.
    pub envs: Vec<String>,
}

impl HostFile {
    /// `n` ranks on this machine.
    pub fn local(n: usize) -> Self {
        let host = Host {
            ssh: "127.0.0.1".into(),
            ips: vec!["127.0.0.1".into()],
        };
        Self {
            hosts: vec![host; n],
            ..Self::default()
        }
    }

    /// Reads an `mlx.launch` host file.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading host file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("host file {}", path.display()))
    }

    /// Parses a host file: a JSON list of `{"ssh", "ips"}` hosts, or an object
    /// with `hosts` and optional `backend` and `envs`.
    pub fn parse(text: &str) -> Result<Self> {
        #[derive(serde::Deserialize)]
        struct RawHost {
            ssh: String,
            #[serde(default)]
            ips: Vec<String>,
        }
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            List(Vec<RawHost>),
            Object {
                #[serde(default)]
                backend: Option<String>,
                #[serde(default)]
                envs: Vec<String>,
                hosts: Vec<RawHost>,
            },
        }
        let raw: Raw = serde_json::from_str(text).context(
            "expected a JSON list of {\"ssh\": ..., \"ips\": [...]} or an object with \"hosts\"",
        )?;
        let (hosts, backend, envs) = match raw {
            Raw::List(h) => (h, None, vec![]),
            Raw::Object {
                backend,
                envs,
                hosts,
            } => (hosts, backend.filter(|b| !b.is_empty()), envs),
        };
        if hosts.is_empty() {
            bail!("no hosts");
        }
        if let Some(e) = envs.iter().find(|e| !valid_env(e)) {
            bail!("envs: {e:?} is not NAME=VALUE");
        }
        Ok(Self {
            hosts: hosts
                .into_iter()
                .map(|h| Host {
                    ssh: h.ssh,
                    ips: h.ips,
                })
                .collect(),
            backend,
            envs,
        })
    }
}

fn valid_env(e: &str) -> bool {
    e.split_once('=').is_some_and(|(k, _)| {
        !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

fn is_local(host: &Host) -> bool {
    host.ssh == "127.0.0.1" || host.ssh == "localhost"
}

/// What to start on every rank, and how the ranks meet.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    /// The ranks' hosts.
    pub hosts: HostFile,
    /// The backend the ranks use: `ring`, `nccl`, `mpi` or `any`.
    pub backend: String,
    /// First ring port (one per rank and address); `None` picks free ports
    /// when every rank is local, else 32323 (as `mlx.launch`).
    pub starting_port: Option<u16>,
    /// The port rank 0 listens on for NCCL's rendezvous (`NCCL_PORT`).
    pub nccl_port: u16,
    /// Extra `NAME=VALUE` for every rank.
    pub env: Vec<String>,
    /// The program and its arguments.
    pub command: Vec<String>,
}

/// `NAME`, `VALUE` pairs of one rank's environment.
pub(crate) type RankEnv = Vec<(String, String)>;

/// The environment of each rank (and the ring host list, when there is one).
pub(crate) fn rank_envs(spec: &LaunchSpec) -> Result<(Vec<RankEnv>, Option<String>)> {
    let hosts = &spec.hosts.hosts;
    let n = hosts.len();
    let mut common: Vec<(String, String)> = spec
        .hosts
        .envs
        .iter()
        .chain(&spec.env)
        .map(|e| {
            if !valid_env(e) {
                bail!("--env {e:?} is not NAME=VALUE");
            }
            let (k, v) = e.split_once('=').unwrap();
            Ok((k.to_string(), v.to_string()))
        })
        .collect::<Result<_>>()?;
    common.push(("MLX_BUN_BACKEND".into(), spec.backend.clone()));
    let mut ring = None;
    match spec.backend.as_str() {
        "ring" => {
            if let Some(h) = hosts.iter().find(|h| h.ips.is_empty()) {
                bail!(
                    "the ring backend needs IP addresses: host {:?} has no \"ips\"",
                    h.ssh
                );
            }
            let ports = ring_ports(spec)?;
            let mut next = ports.into_iter();
            let list: Vec<Vec<String>> = hosts
                .iter()
                .map(|h| {
                    h.ips
                        .iter()
                        .map(|ip| format!("{ip}:{}", next.next().unwrap()))
                        .collect()
                })
                .collect();
            ring = Some(serde_json::to_string(&list)?);
        }
        "nccl" => {
            let master = hosts[0]
                .ips
                .first()
                .ok_or_else(|| anyhow!("nccl: rank 0's host needs an address in \"ips\""))?;
            common.push(("NCCL_HOST_IP".into(), master.clone()));
            common.push(("NCCL_PORT".into(), spec.nccl_port.to_string()));
            common.push(("MLX_WORLD_SIZE".into(), n.to_string()));
            // NVLink multicast (NVLS) stays off unless asked for: on a host
            // whose GPUs others share it can take them out of service.
            if !common.iter().any(|(k, _)| k == "NCCL_NVLS_ENABLE") {
                common.push(("NCCL_NVLS_ENABLE".into(), "0".into()));
            }
        }
        "mpi" | "any" => {}
        other => bail!("unknown backend {other:?} (ring, nccl or mpi)"),
    }
    let envs = (0..n)
        .map(|rank| {
            let mut env = common.clone();
            env.push(("MLX_RANK".into(), rank.to_string()));
            if spec.backend == "nccl" && !common.iter().any(|(k, _)| k == "CUDA_VISIBLE_DEVICES") {
                let local = hosts[..rank]
                    .iter()
                    .filter(|h| h.ssh == hosts[rank].ssh)
                    .count();
                env.push(("CUDA_VISIBLE_DEVICES".into(), local.to_string()));
            }
            env
        })
        .collect();
    Ok((envs, ring))
}

fn ring_ports(spec: &LaunchSpec) -> Result<Vec<u16>> {
    let count: usize = spec.hosts.hosts.iter().map(|h| h.ips.len()).sum();
    let all_local = spec.hosts.hosts.iter().all(is_local);
    match spec.starting_port {
        Some(p) => Ok((0..count).map(|i| p + i as u16).collect()),
        None if all_local => {
            // Ask the OS for free ports, all held until every one is known.
            let listeners = (0..count)
                .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
                .collect::<std::io::Result<Vec<_>>>()
                .context("finding free ports on 127.0.0.1")?;
            listeners
                .iter()
                .map(|l| Ok(l.local_addr()?.port()))
                .collect()
        }
        None => Ok((0..count).map(|i| 32323 + i as u16).collect()),
    }
}

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: i32) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// The end of a launch.
#[derive(Debug)]
pub enum Outcome {
    /// Every rank exited successfully.
    Success,
    /// A rank failed first: its number, exit status and last `error:` line.
    RankFailed {
        /// The rank that failed.
        rank: usize,
        /// Its exit status.
        status: ExitStatus,
        /// The last line it wrote starting `error:`, if any.
        error: Option<String>,
    },
    /// The launcher got this signal and passed it on.
    Interrupted(i32),
}

struct Running {
    rank: usize,
    child: Child,
    last_error: Arc<Mutex<Option<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// Starts every rank and supervises them until all end (see the module doc).
pub fn run(spec: &LaunchSpec) -> Result<Outcome> {
    if spec.command.is_empty() {
        bail!("no command to launch");
    }
    let (envs, ring) = rank_envs(spec)?;
    let ring_file = match &ring {
        Some(list) if spec.hosts.hosts.iter().any(is_local) => {
            let path =
                std::env::temp_dir().join(format!("mlx-bun-ring-{}.json", std::process::id()));
            std::fs::write(&path, list).with_context(|| format!("writing {}", path.display()))?;
            Some(path)
        }
        _ => None,
    };
    // SAFETY: the handler only stores into an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let result = if spec.backend == "mpi" {
        start_mpi(spec, &envs).and_then(|r| supervise(vec![r]))
    } else {
        start_all(spec, &envs, ring.as_deref(), ring_file.as_deref()).and_then(supervise)
    };
    if let Some(path) = ring_file {
        let _ = std::fs::remove_file(path);
    }
    result
}

fn start_all(
    spec: &LaunchSpec,
    envs: &[Vec<(String, String)>],
    ring: Option<&str>,
    ring_file: Option<&Path>,
) -> Result<Vec<Running>> {
    let mut running = Vec::new();
    for (rank, (host, env)) in spec.hosts.hosts.iter().zip(envs).enumerate() {
        let mut cmd = if is_local(host) {
            let mut c = Command::new(&spec.command[0]);
            c.args(&spec.command[1..]).envs(env.iter().cloned());
            if let Some(f) = ring_file {
                c.env("MLX_HOSTFILE", f);
            }
            c
        } else {
            let mut c = Command::new("ssh");
            c.args(["-tt", "-o", "LogLevel=QUIET", &host.ssh])
                .arg(remote_script(&spec.command, env, ring)?);
            c
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped());
        // Each rank leads its own process group, so stopping it stops what it started.
        cmd.process_group(0);
        match cmd.spawn() {
            Ok(child) => running.push(watch(rank, child)),
            Err(e) => {
                stop(&mut running, libc::SIGKILL);
                return Err(anyhow!("starting rank {rank} ({}): {e}", spec.command[0]));
            }
        }
    }
    Ok(running)
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The shell line a remote rank runs: the working directory, the
/// environment, the ring host list in a temporary file, then the program.
fn remote_script(
    command: &[String],
    env: &[(String, String)],
    ring: Option<&str>,
) -> Result<String> {
    let cwd = std::env::current_dir()?;
    let mut s = format!("cd {} 2>/dev/null; ", shell_quote(&cwd.to_string_lossy()));
    for (k, v) in env {
        s += &format!("export {k}={}; ", shell_quote(v));
    }
    if let Some(list) = ring {
        s += &format!(
            "f=$(mktemp); printf %s {} > $f; export MLX_HOSTFILE=$f; ",
            shell_quote(list)
        );
    }
    s += "exec";
    for a in command {
        s += " ";
        s += &shell_quote(a);
    }
    Ok(s)
}

fn start_mpi(spec: &LaunchSpec, envs: &[Vec<(String, String)>]) -> Result<Running> {
    let mut slots: Vec<(String, usize)> = Vec::new();
    for h in &spec.hosts.hosts {
        match slots.iter_mut().find(|(name, _)| *name == h.ssh) {
            Some((_, n)) => *n += 1,
            None => slots.push((h.ssh.clone(), 1)),
        }
    }
    let path = std::env::temp_dir().join(format!("mlx-bun-mpi-{}.hosts", std::process::id()));
    let mut f =
        std::fs::File::create(&path).with_context(|| format!("writing {}", path.display()))?;
    for (name, n) in &slots {
        writeln!(f, "{name} slots={n}")?;
    }
    let mut cmd = Command::new("mpirun");
    cmd.args(["--output", ":raw", "--hostfile"]).arg(&path);
    // The rank comes from MPI itself; pass the shared variables only.
    for (k, v) in envs[0].iter().filter(|(k, _)| k != "MLX_RANK") {
        cmd.arg("-x").arg(format!("{k}={v}"));
    }
    cmd.arg("--").args(&spec.command);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    cmd.process_group(0);
    let child = cmd
        .spawn()
        .map_err(|e| anyhow!("starting mpirun: {e} (is MPI installed?)"))?;
    Ok(watch(0, child))
}

/// Forwards a rank's standard error (prefixed with its rank) and keeps its
/// last `error:` line.
fn watch(rank: usize, mut child: Child) -> Running {
    let last_error = Arc::new(Mutex::new(None));
    let stderr = child.stderr.take();
    let keep = last_error.clone();
    let reader = stderr.map(|stderr| {
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(msg) = line.trim_start().strip_prefix("error:") {
                    *keep.lock().unwrap() = Some(msg.trim().to_string());
                }
                let mut err = std::io::stderr().lock();
                let _ = if rank == 0 {
                    writeln!(err, "{line}")
                } else {
                    writeln!(err, "[rank {rank}] {line}")
                };
            }
        })
    });
    Running {
        rank,
        child,
        last_error,
        reader,
    }
}

fn stop(running: &mut [Running], sig: i32) {
    for r in running.iter_mut() {
        if matches!(r.child.try_wait(), Ok(None)) {
            // SAFETY: signals the process group of a child this process
            // started (its leader) and has not reaped.
            unsafe {
                libc::kill(-(r.child.id() as i32), sig);
            }
        }
    }
}

fn supervise(mut running: Vec<Running>) -> Result<Outcome> {
    let mut outcome = Outcome::Success;
    let mut deadline: Option<Instant> = None;
    let mut done = vec![false; running.len()];
    loop {
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            stop(&mut running, sig);
            if matches!(outcome, Outcome::Success) {
                outcome = Outcome::Interrupted(sig);
            }
            deadline.get_or_insert(Instant::now() + Duration::from_secs(10));
        }
        for (i, r) in running.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            let Some(status) = r.child.try_wait()? else {
                continue;
            };
            done[i] = true;
            if !status.success() && matches!(outcome, Outcome::Success) {
                if let Some(h) = r.reader.take() {
                    let _ = h.join();
                }
                outcome = Outcome::RankFailed {
                    rank: r.rank,
                    status,
                    error: r.last_error.lock().unwrap().clone(),
                };
                deadline = Some(Instant::now() + Duration::from_secs(5));
            }
        }
        if done.iter().all(|&d| d) {
            break;
        }
        if matches!(outcome, Outcome::RankFailed { .. }) {
            stop(&mut running, libc::SIGTERM);
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            stop(&mut running, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for r in &mut running {
        if let Some(h) = r.reader.take() {
            let _ = h.join();
        }
    }
    Ok(outcome)
}

/// The program a launched subcommand runs: this executable.
pub fn current_program() -> Result<PathBuf> {
    std::env::current_exe().context("finding the mlx-bun executable")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_files_in_both_layouts() {
        let list = HostFile::parse(r#"[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b"}]"#).unwrap();
        assert_eq!(list.hosts.len(), 2);
        assert!(list.hosts[1].ips.is_empty());
        let obj = HostFile::parse(
            r#"{"backend": "nccl", "envs": ["A=1"], "hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}]}"#,
        )
        .unwrap();
        assert_eq!(obj.backend.as_deref(), Some("nccl"));
        assert_eq!(obj.envs, vec!["A=1"]);
        assert!(HostFile::parse("[]").is_err());
        assert!(HostFile::parse(r#"{"envs": ["bad"], "hosts": [{"ssh": "a"}]}"#).is_err());
    }

    #[test]
    fn the_remote_shell_line_sets_the_environment_and_the_ring_file() {
        let env = vec![
            ("MLX_RANK".to_string(), "1".to_string()),
            ("Q".into(), "it's".into()),
        ];
        let command = [
            "/bin/sh",
            "-c",
            r#"echo "$MLX_RANK $Q $(cat "$MLX_HOSTFILE")""#,
        ]
        .map(String::from);
        let line = remote_script(&command, &env, Some(r#"[["10.0.0.1:5000"]]"#)).unwrap();
        let out = Command::new("bash").arg("-c").arg(&line).output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            r#"1 it's [["10.0.0.1:5000"]]"#
        );
    }

    #[test]
    fn ring_and_nccl_environments() {
        let mut spec = LaunchSpec {
            hosts: HostFile::local(2),
            backend: "ring".into(),
            starting_port: Some(5000),
            nccl_port: 12345,
            env: vec!["X=1".into()],
            command: vec!["true".into()],
        };
        let (envs, ring) = rank_envs(&spec).unwrap();
        assert_eq!(ring.unwrap(), r#"[["127.0.0.1:5000"],["127.0.0.1:5001"]]"#);
        assert!(envs[1].contains(&("MLX_RANK".into(), "1".into())));
        assert!(envs[0].contains(&("X".into(), "1".into())));
        spec.backend = "nccl".into();
        let (envs, ring) = rank_envs(&spec).unwrap();
        assert!(ring.is_none());
        assert!(envs[1].contains(&("CUDA_VISIBLE_DEVICES".into(), "1".into())));
        assert!(envs[1].contains(&("MLX_WORLD_SIZE".into(), "2".into())));
        assert!(envs[1].contains(&("NCCL_NVLS_ENABLE".into(), "0".into())));
        assert!(envs[0].contains(&("NCCL_HOST_IP".into(), "127.0.0.1".into())));
    }
}
