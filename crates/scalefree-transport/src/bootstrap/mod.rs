//! Who am I, how many are we, and how do we find each other.
//!
//! [`JobInfo::from_env`] reads rank and size from whichever launcher started us
//! (`scalefree run`, Open MPI, MPICH/Hydra, Slurm, torchrun, or nothing: size 1).
//! [`rendezvous::Rendezvous`] then connects the ranks of one host through an abstract
//! Unix socket owned by local rank 0, guarded by a job token.

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
                // Slurm's per-node count; only trust it when the step is on one node.
                if var("SLURM_STEP_NUM_NODES").as_deref() == Some("1") || var("SLURM_NNODES").as_deref() == Some("1") {
                    local_size = size;
                    local_rank = rank;
                }
            }
            let ppid = parent_pid();
            let (job_id, token) = match launcher {
                Launcher::Scalefree => {
                    let id = var("SCALEFREE_JOB_ID").ok_or_else(|| {
                        Error::Bootstrap("SCALEFREE_RANK is set but SCALEFREE_JOB_ID is not".into())
                    })?;
                    let token = var("SCALEFREE_JOB_TOKEN").unwrap_or_default();
                    (id, token)
                }
                Launcher::OpenMpi => {
                    let id = var("PMIX_NAMESPACE")
                        .or_else(|| var("OMPI_MCA_ess_base_jobid"))
                        .unwrap_or_else(|| format!("ppid{ppid}"));
                    (format!("ompi-{id}"), format!("ompi:{id}:{ppid}"))
                }
                Launcher::Hydra => {
                    let id = var("PMI_KVSNAME").unwrap_or_else(|| format!("ppid{ppid}"));
                    (format!("hydra-{id}"), format!("hydra:{id}:{ppid}"))
                }
                Launcher::Slurm => {
                    let id = format!(
                        "{}.{}",
                        var("SLURM_JOB_ID").unwrap_or_default(),
                        var("SLURM_STEP_ID").unwrap_or_default()
                    );
                    (format!("slurm-{id}"), format!("slurm:{id}:{ppid}"))
                }
                Launcher::Torchrun => {
                    let id = format!(
                        "{}-{}",
                        var("TORCHELASTIC_RUN_ID").unwrap_or_default(),
                        var("MASTER_PORT").unwrap_or_default()
                    );
                    (format!("torch-{id}"), format!("torch:{id}:{ppid}"))
                }
                Launcher::Single => unreachable!(),
            };
            let master = master_from_env()?;
            if local_size < size && master.is_none() {
                return Err(Error::Bootstrap(format!(
                    "the job spans hosts ({local_size} of {size} ranks on this one) but no rendezvous address is known: \
                     set SCALEFREE_MASTER_ADDR (and SCALEFREE_MASTER_PORT) to rank 0's host on every host \
                     (with mpirun: -x SCALEFREE_MASTER_ADDR=...), or launch with `scalefree run --nnodes ... --master-addr ...`"
                )));
            }
            let token = match var("SCALEFREE_JOB_TOKEN") {
                Some(t) if launcher != Launcher::Scalefree => t,
                _ => token,
            };
            return Ok(JobInfo { rank, size, local_rank, local_size, job_id, token, launcher, master });
        }
        Ok(JobInfo::single())
    }

    /// All ranks on this host (the shared-memory backend's world).
    /// (A job with a master address may still be on one host: the rendezvous tells.)
    pub fn single_host(&self) -> bool {
        self.local_size == self.size
    }
}

/// Default port of the TCP rendezvous.
pub const DEFAULT_MASTER_PORT: u16 = 29517;

fn master_from_env() -> Result<Option<(String, u16)>> {
    let Some(addr) = var("SCALEFREE_MASTER_ADDR") else {
        return Ok(None);
    };
    let port = match var("SCALEFREE_MASTER_PORT") {
        None => DEFAULT_MASTER_PORT,
        Some(p) => p.trim().parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
            Error::Bootstrap(format!("SCALEFREE_MASTER_PORT={p:?} is not a port number"))
        })?,
    };
    Ok(Some((addr.trim().to_string(), port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_has_size_one() {
        let j = JobInfo::single();
        assert_eq!((j.rank, j.size), (0, 1));
        assert!(j.single_host());
    }
}
