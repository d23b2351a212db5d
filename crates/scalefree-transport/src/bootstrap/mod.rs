//! Who am I, how many are we, and how do we find each other.
//!
//! [`JobInfo::from_env`] reads rank and size from whichever launcher started us
//! (`scalefree run`, Open MPI, MPICH/Hydra, Slurm, torchrun, or nothing: size 1).
//! [`rendezvous::Rendezvous`] then connects the ranks of one host through an abstract
//! Unix socket owned by local rank 0, guarded by a job token.

mod frames;
pub mod rendezvous;

use crate::error::{Error, Result};

/// Which launcher's environment the rank and size came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    Scalefree,
    OpenMpi,
    Hydra,
    Slurm,
    Torchrun,
    Single,
}

impl Launcher {
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Scalefree => "scalefree",
            Launcher::OpenMpi => "openmpi",
            Launcher::Hydra => "mpich-hydra",
            Launcher::Slurm => "slurm",
            Launcher::Torchrun => "torchrun",
            Launcher::Single => "single",
        }
    }
}

/// The identity of this rank within its job.
#[derive(Clone, Debug)]
pub struct JobInfo {
    pub rank: u32,
    pub size: u32,
    pub local_rank: u32,
    pub local_size: u32,
    /// Names the rendezvous point; the same for every rank of the job.
    pub job_id: String,
    /// Shared secret a rank must present to join.
    pub token: String,
    pub launcher: Launcher,
    /// Where rank 0 hosts the rendezvous over TCP (`SCALEFREE_MASTER_ADDR`, and
    /// `SCALEFREE_MASTER_PORT`, default [`DEFAULT_MASTER_PORT`]): needed when the job spans
    /// hosts.
    pub master: Option<(String, u16)>,
    /// Seal every connection between hosts (the rendezvous over TCP, the TCP lanes):
    /// `SCALEFREE_ENCRYPT=1` (see [`crate::seal`]).
    pub sealed: bool,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn num(name: &str) -> Result<Option<u32>> {
    match var(name) {
        None => Ok(None),
        Some(v) => v.trim().parse::<u32>().map(Some).map_err(|_| {
            Error::Bootstrap(format!("environment variable {name}={v:?} is not a non-negative integer"))
        }),
    }
}

fn parent_pid() -> u32 {
    unsafe { libc::getppid() as u32 }
}

impl JobInfo {
    /// A job of one rank.
    pub fn single() -> Self {
        JobInfo {
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: 1,
            job_id: format!("single-{}", std::process::id()),
            token: String::new(),
            launcher: Launcher::Single,
            master: None,
            sealed: false,
        }
    }

    /// Reads the environment of the launcher that started this process.
    pub fn from_env() -> Result<Self> {
        // (launcher, rank, size, local rank, local size, job id variables)
        let table: [(Launcher, &str, &str, &str, &str); 5] = [
            (Launcher::Scalefree, "SCALEFREE_RANK", "SCALEFREE_WORLD_SIZE", "SCALEFREE_LOCAL_RANK", "SCALEFREE_LOCAL_SIZE"),
            (Launcher::OpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
            (Launcher::Hydra, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
            (Launcher::Slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS"),
            (Launcher::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        ];
        for (launcher, rank_v, size_v, lrank_v, lsize_v) in table {
            let (Some(rank), Some(size)) = (num(rank_v)?, num(size_v)?) else {
                continue;
            };
            if size == 0 || rank >= size {
                return Err(Error::Bootstrap(format!(
                    "{rank_v}={rank} is not below {size_v}={size}"
                )));
            }
            let mut local_rank = num(lrank_v)?.unwrap_or(rank);
            let mut local_size = num(lsize_v)?.unwrap_or(size);
            if launcher == Launcher::Slurm {
                if var("SLURM_STEP_NUM_NODES").as_deref() == Some("1") || var("SLURM_NNODES").as_deref() == Some("1") {
                    local_size = size;
                    local_rank = rank;
                } else if let (Some(per_node), Some(node)) = (var("SLURM_STEP_TASKS_PER_NODE"), num("SLURM_NODEID")?) {
                    // "2(x3),1": two tasks on each of the first three nodes, then one.
                    local_size = tasks_on_node(&per_node, node).ok_or_else(|| Error::Bootstrap(format!(
                        "cannot read SLURM_STEP_TASKS_PER_NODE={per_node:?} for node {node}"
                    )))?;
                }
            }
            let ppid = parent_pid();
            // The launcher's local parent pins the token to this host's ranks; a job across
            // hosts shares only the launcher's job id.
            let local = if local_size < size { String::new() } else { format!(":{ppid}") };
            let (job_id, token) = match launcher {
                Launcher::Scalefree => {
                    let id = var("SCALEFREE_JOB_ID").ok_or_else(|| {
                        Error::Bootstrap("SCALEFREE_RANK is set but SCALEFREE_JOB_ID is not".into())
                    })?;
                    (id, String::new())
                }
                Launcher::OpenMpi => {
                    let id = var("PMIX_NAMESPACE")
                        .or_else(|| var("OMPI_MCA_ess_base_jobid"))
                        .unwrap_or_else(|| format!("ppid{ppid}"));
                    (format!("ompi-{id}"), format!("ompi:{id}{local}"))
                }
                Launcher::Hydra => {
                    let id = var("PMI_KVSNAME").unwrap_or_else(|| format!("ppid{ppid}"));
                    (format!("hydra-{id}"), format!("hydra:{id}{local}"))
                }
                Launcher::Slurm => {
                    let id = format!(
                        "{}.{}",
                        var("SLURM_JOB_ID").unwrap_or_default(),
                        var("SLURM_STEP_ID").unwrap_or_default()
                    );
                    (format!("slurm-{id}"), format!("slurm:{id}{local}"))
                }
                Launcher::Torchrun => {
                    let id = format!(
                        "{}-{}",
                        var("TORCHELASTIC_RUN_ID").unwrap_or_default(),
                        var("MASTER_PORT").unwrap_or_default()
                    );
                    (format!("torch-{id}"), format!("torch:{id}{local}"))
                }
                Launcher::Single => unreachable!(),
            };
            // A job on one host meets on the local socket (same user only), whatever address
            // the environment names; only the launchers that say so (scalefree run) use TCP
            // on one host.
            let master = if launcher != Launcher::Scalefree && local_size == size { None } else { master_from_env(launcher, local_size < size)? };
            if local_size < size && master.is_none() {
                return Err(Error::Bootstrap(format!(
                    "the job spans hosts ({local_size} of {size} ranks on this one) but no rendezvous address is known: \
                     set SCALEFREE_MASTER_ADDR (and SCALEFREE_MASTER_PORT) to rank 0's host on every host \
                     (with mpirun: -x SCALEFREE_MASTER_ADDR=..., or install mpi4py so that scalefree asks MPI), \
                     or launch with `scalefree run --nnodes ... --master-addr ...`"
                )));
            }
            let secret = job_secret()?;
            let token = match (secret, master.is_some()) {
                (Some(t), _) => t,
                // The local socket admits only this user's processes, and the launcher's
                // token (its job id and our parent's pid) keeps their other jobs apart.
                (None, false) => token,
                (None, true) if insecure_no_token() => {
                    eprintln!(
                        "scalefree: warning: rank {rank} joins a job across hosts without a secret \
                         (SCALEFREE_INSECURE_NO_TOKEN): anyone who can reach {}:{} can join it",
                        master.as_ref().unwrap().0, master.as_ref().unwrap().1
                    );
                    format!("insecure:{job_id}")
                }
                (None, true) => return Err(Error::Bootstrap(NO_SECRET.into())),
            };
            return Ok(JobInfo { rank, size, local_rank, local_size, job_id, token, launcher, master, sealed: crate::seal::enabled() });
        }
        Ok(JobInfo::single())
    }

    /// All ranks on this host (the shared-memory backend's world).
    /// (A job with a master address may still be on one host: the rendezvous tells.)
    pub fn single_host(&self) -> bool {
        self.local_size == self.size
    }
}

/// Why a job across hosts cannot start without a secret.
pub const NO_SECRET: &str = "a job across hosts needs a secret shared by its hosts, so that nobody else can join it: \
set SCALEFREE_JOB_TOKEN to the same random value on every host (e.g. `export SCALEFREE_JOB_TOKEN=$(openssl rand -hex 16)` \
before srun, or `mpirun -x SCALEFREE_JOB_TOKEN`), or SCALEFREE_JOB_TOKEN_FILE to a file only you can read; \
on a closed network, SCALEFREE_INSECURE_NO_TOKEN=1 (see docs/security.md)";

fn insecure_no_token() -> bool {
    matches!(var("SCALEFREE_INSECURE_NO_TOKEN").as_deref().map(str::trim), Some("1") | Some("yes") | Some("true"))
}

/// The job's secret: `SCALEFREE_JOB_TOKEN`, else the first line of `SCALEFREE_JOB_TOKEN_FILE`
/// (a file nobody but its owner may read or write), else none.
pub fn job_secret() -> Result<Option<String>> {
    if let Some(t) = var("SCALEFREE_JOB_TOKEN") {
        return Ok(Some(t));
    }
    let Some(path) = var("SCALEFREE_JOB_TOKEN_FILE") else { return Ok(None) };
    Ok(Some(read_token_file(std::path::Path::new(&path))?))
}

/// Reads a token file: refused when its group or others may read or write it, or when it
/// belongs to another user, or when it holds no token.
pub fn read_token_file(path: &std::path::Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| Error::Bootstrap(format!("token file {shown}: {e}")))?;
    if meta.mode() & 0o077 != 0 {
        return Err(Error::Bootstrap(format!(
            "token file {shown} has mode {:o}: others may read it; `chmod 600 {shown}`",
            meta.mode() & 0o777
        )));
    }
    if meta.uid() != unsafe { libc::getuid() } {
        return Err(Error::Bootstrap(format!("token file {shown} belongs to another user")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::Bootstrap(format!("token file {shown}: {e}")))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        return Err(Error::Bootstrap(format!("token file {shown} is empty")));
    }
    Ok(token)
}

/// Default port of the TCP rendezvous.
pub const DEFAULT_MASTER_PORT: u16 = 29517;

/// The rendezvous address: `SCALEFREE_MASTER_ADDR` (and `SCALEFREE_MASTER_PORT`) when set;
/// else what the launcher tells: under Slurm the first host of the step's node list (where
/// rank 0 runs under Slurm's default block distribution), under torchrun its `MASTER_ADDR`
/// (port `MASTER_PORT + 1`: torchrun's own store holds `MASTER_PORT`). Open MPI and MPICH do
/// not say where rank 0 runs: pass `-x SCALEFREE_MASTER_ADDR=...` to `mpirun`, or let the
/// Python front ask MPI (`scalefree/launch/mpi_master.py`, with mpi4py).
fn master_from_env(launcher: Launcher, spans_hosts: bool) -> Result<Option<(String, u16)>> {
    let port_var = || -> Result<Option<u16>> {
        match var("SCALEFREE_MASTER_PORT") {
            None => Ok(None),
            Some(p) => p.trim().parse::<u16>().ok().filter(|p| *p > 0).map(Some).ok_or_else(|| {
                Error::Bootstrap(format!("SCALEFREE_MASTER_PORT={p:?} is not a port number"))
            }),
        }
    };
    if let Some(addr) = var("SCALEFREE_MASTER_ADDR") {
        return Ok(Some((addr.trim().to_string(), port_var()?.unwrap_or(DEFAULT_MASTER_PORT))));
    }
    if !spans_hosts {
        return Ok(None);
    }
    match launcher {
        Launcher::Slurm => {
            let Some(list) = var("SLURM_STEP_NODELIST").or_else(|| var("SLURM_JOB_NODELIST")) else { return Ok(None) };
            let host = first_host(&list).ok_or_else(|| Error::Bootstrap(format!("cannot read the Slurm node list {list:?}")))?;
            // One port per job step, the same on every rank, so steps of a job can overlap.
            let step = format!("{}.{}", var("SLURM_JOB_ID").unwrap_or_default(), var("SLURM_STEP_ID").unwrap_or_default());
            let derived = DEFAULT_MASTER_PORT + (step.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32)) % 2000) as u16;
            Ok(Some((host, port_var()?.unwrap_or(derived))))
        }
        Launcher::Torchrun => {
            let Some(addr) = var("MASTER_ADDR") else { return Ok(None) };
            let derived = match var("MASTER_PORT").and_then(|p| p.trim().parse::<u16>().ok()) {
                Some(p) if p < u16::MAX => p + 1,
                _ => DEFAULT_MASTER_PORT,
            };
            Ok(Some((addr.trim().to_string(), port_var()?.unwrap_or(derived))))
        }
        _ => Ok(None),
    }
}

/// Tasks on node `node` of a Slurm tasks-per-node list such as `2(x3),1`.
fn tasks_on_node(list: &str, node: u32) -> Option<u32> {
    let mut seen = 0u32;
    for item in list.split(',') {
        let item = item.trim();
        let (n, reps) = match item.split_once("(x") {
            Some((n, r)) => (n.parse::<u32>().ok()?, r.strip_suffix(')')?.parse::<u32>().ok()?),
            None => (item.parse::<u32>().ok()?, 1),
        };
        seen = seen.checked_add(reps)?;
        if node < seen {
            return Some(n);
        }
    }
    None
}

/// The first host of a Slurm host list: `node[01-04,07],gpu3` → `node01`,
/// `rack[1-2]-n[3-4]` → `rack1-n3`, `a,b` → `a`.
fn first_host(list: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = list.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break,
            '[' => {
                let inner: String = chars.by_ref().take_while(|&c| c != ']').collect();
                let first = inner.split([',', '-']).next()?.trim();
                if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                out.push_str(first);
            }
            ']' => return None,
            c => out.push(c),
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_tasks_per_node() {
        assert_eq!(tasks_on_node("2(x3),1", 0), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 2), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 3), Some(1));
        assert_eq!(tasks_on_node("2(x3),1", 4), None);
        assert_eq!(tasks_on_node("4", 0), Some(4));
        assert_eq!(tasks_on_node("x", 0), None);
    }

    #[test]
    fn first_host_of_slurm_lists() {
        assert_eq!(first_host("node[01-04,07],gpu3").as_deref(), Some("node01"));
        assert_eq!(first_host("rack[1-2]-n[3-4]").as_deref(), Some("rack1-n3"));
        assert_eq!(first_host("a,b").as_deref(), Some("a"));
        assert_eq!(first_host("solo").as_deref(), Some("solo"));
        assert_eq!(first_host("n[007]").as_deref(), Some("n007"));
        assert_eq!(first_host(""), None);
        assert_eq!(first_host("n[x-y]"), None);
    }

    #[test]
    fn single_has_size_one() {
        let j = JobInfo::single();
        assert_eq!((j.rank, j.size), (0, 1));
        assert!(j.single_host());
    }
}
