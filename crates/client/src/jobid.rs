//! Which batch job a process belongs to (Lustre's jobid): what a mount's requests
//! carry, so that servers count operations and bytes per job (`rpc::stats`), and
//! what the tracer's records name.
//!
//! `jobid_var` names the environment variable that holds the job id
//! (`SLURM_JOB_ID` by default), or is `procname_uid` (the program's name and the
//! caller's uid, `dd.1000`) or `disable`. As Lustre's default `jobid_name` (`%e.%u`),
//! a process without the variable is named by its program and uid.
//!
//! The environment is read by a thread of its own, and a request waits for it at
//! most [`JOB_WAIT`] (see [`JobReader`]); answers are remembered per pid for
//! [`JOB_TTL`].

pub use rpc::stats::{current_job, set_process_job, with_job};

use std::collections::HashMap;
use std::sync::mpsc::{channel, sync_channel, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The environment variable naming a process's job, as Lustre's `jobid_var` default.
pub const DEFAULT_JOBID_VAR: &str = "SLURM_JOB_ID";
/// A process's job is looked up again after this long (a pid may be reused).
pub(crate) const JOB_TTL: Duration = Duration::from_secs(10);
/// Most processes whose job is remembered.
pub(crate) const JOBS_CACHED: usize = 4096;
/// How long an operation waits for its process's job.
const JOB_WAIT: Duration = Duration::from_millis(20);
/// Most lookups queued for the reader; past it, an operation goes without a job.
const JOB_ASKS_MAX: usize = 256;

/// How a process's job id is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobVar {
    /// No job ids.
    Disabled,
    /// The program's name and the caller's uid.
    ProcnameUid,
    /// This environment variable, or the program's name and uid without it.
    Env(String),
}

impl JobVar {
    /// `disable`, `procname_uid` or a variable's name, as Lustre's `jobid_var`.
    pub fn parse(s: &str) -> Result<JobVar, String> {
        match s {
            "disable" => Ok(JobVar::Disabled),
            "procname_uid" => Ok(JobVar::ProcnameUid),
            v if !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {
                Ok(JobVar::Env(v.to_string()))
            }
            v => Err(format!(
                "jobid_var {v:?}: give an environment variable's name (e.g. SLURM_JOB_ID), procname_uid or disable"
            )),
        }
    }
}

/// Reads what a lookup function finds about processes on a thread of its own; an
/// operation waits for the answer at most [`JOB_WAIT`].
///
/// Why: reading a process's environment waits while that process is in `execve` (the
/// kernel's `exec_update_lock`), and `execve` closes the close-on-exec files first. A
/// file on this mount sends a FLUSH, whose lookup came before the answer went back:
/// the exec waited for the mount and the mount for the exec, for good (a traced mount
/// hung any fork and exec of a process holding a file open on it). Now the FLUSH
/// goes without a job after the wait, the exec goes on, and the reader with it.
pub(crate) struct JobReader<T> {
    asks: Option<SyncSender<(u32, Sender<T>)>>,
}

impl<T: Send + 'static> JobReader<T> {
    pub(crate) fn start(lookup: impl Fn(u32) -> T + Send + 'static) -> JobReader<T> {
        let (tx, rx) = sync_channel::<(u32, Sender<T>)>(JOB_ASKS_MAX);
        let started = std::thread::Builder::new().name("braid-jobs".into()).spawn(move || {
            for (pid, answer) in rx {
                let _ = answer.send(lookup(pid));
            }
        });
        if let Err(e) = &started {
            tracing::warn!("requests will name no jobs: cannot start the job reader: {e}");
        }
        JobReader { asks: started.ok().map(|_| tx) }
    }

    /// What the lookup found for `pid`; `Err` when the reader did not answer in time
    /// (or cannot run).
    pub(crate) fn read(&self, pid: u32) -> Result<T, ()> {
        let asks = self.asks.as_ref().ok_or(())?;
        let (tx, rx) = channel();
        asks.try_send((pid, tx)).map_err(|_| ())?;
        rx.recv_timeout(JOB_WAIT).map_err(|_| ())
    }
}

/// The value of `var` in the environment process `pid` started with.
pub(crate) fn read_job(pid: u32, var: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{var}=");
    env.split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .filter(|v| !v.is_empty())
}

/// The program name of process `pid` (`/proc/PID/comm`).
fn read_procname(pid: u32) -> Option<String> {
    let comm = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    let name = String::from_utf8_lossy(&comm).trim_end().to_string();
    (!name.is_empty()).then_some(name)
}

/// The job id of this very process as `var` finds it (a native client's own job:
/// its requests are all made for it): the variable, else the program's name and
/// the uid; `None` when job ids are disabled.
pub fn own_job(var: &JobVar) -> Option<String> {
    // SAFETY: getuid(2) has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let named = || read_procname(std::process::id()).map(|name| format!("{name}.{uid}"));
    match var {
        JobVar::Disabled => None,
        JobVar::ProcnameUid => named(),
        JobVar::Env(name) => std::env::var(name).ok().filter(|v| !v.is_empty()).or_else(named),
    }
}

/// A process's job id, and when it was looked up.
type Known = (Instant, Option<Arc<str>>);

/// Finds and remembers the job ids of the processes a mount serves.
pub struct JobIds {
    var: JobVar,
    /// pid -> (the variable's value, the program's name).
    reader: Option<JobReader<(Option<String>, Option<String>)>>,
    /// (pid, uid) -> (looked up at, job id).
    cache: Mutex<HashMap<(u32, u32), Known>>,
}

impl JobIds {
    pub fn new(var: JobVar) -> JobIds {
        let reader = match &var {
            JobVar::Disabled => None,
            JobVar::ProcnameUid => Some(JobReader::start(|pid| (None, read_procname(pid)))),
            JobVar::Env(name) => {
                let name = name.clone();
                Some(JobReader::start(move |pid| match read_job(pid, &name) {
                    Some(job) => (Some(job), None),
                    None => (None, read_procname(pid)),
                }))
            }
        };
        JobIds { var, reader, cache: Mutex::default() }
    }

    pub fn var(&self) -> &JobVar {
        &self.var
    }

    /// The job id of process `pid` of user `uid`; `None` when job ids are disabled or
    /// the process could not be read in time (asked again next time).
    pub fn of(&self, pid: u32, uid: u32) -> Option<Arc<str>> {
        let reader = self.reader.as_ref()?;
        if let Some((at, job)) = self.cache.lock().expect("job ids").get(&(pid, uid)) {
            if at.elapsed() < JOB_TTL {
                return job.clone();
            }
        }
        let (env, procname) = reader.read(pid).ok()?;
        let job: Option<Arc<str>> = match (env, procname) {
            (Some(job), _) => Some(job.into()),
            (None, Some(name)) => Some(format!("{name}.{uid}").into()),
            (None, None) => None,
        };
        let mut cache = self.cache.lock().expect("job ids");
        if cache.len() >= JOBS_CACHED {
            cache.clear();
        }
        cache.insert((pid, uid), (Instant::now(), job.clone()));
        job
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_comes_from_the_process_environment_or_its_name_and_uid() {
        // This test process: its environment as it started.
        let me = std::process::id();
        let env = std::fs::read(format!("/proc/{me}/environ")).unwrap();
        let first = env.split(|&b| b == 0).find_map(|kv| {
            let s = std::str::from_utf8(kv).ok()?;
            let (k, v) = s.split_once('=')?;
            (!v.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
                .then(|| (k.to_string(), v.to_string()))
        });
        if let Some((k, v)) = first {
            assert_eq!(read_job(me, &k), Some(v.clone()));
            assert_eq!(JobIds::new(JobVar::Env(k)).of(me, 7).as_deref(), Some(&v[..]));
        }
        assert_eq!(read_job(me, "BRAID_NO_SUCH_VARIABLE_EVER"), None);
        assert_eq!(read_job(u32::MAX, "PATH"), None);
        let name = read_procname(me).unwrap();
        let by_name = JobIds::new(JobVar::Env("BRAID_NO_SUCH_VARIABLE_EVER".into()));
        assert_eq!(by_name.of(me, 1000).as_deref(), Some(&format!("{name}.1000")[..]));
        assert_eq!(JobIds::new(JobVar::ProcnameUid).of(me, 0).as_deref(), Some(&format!("{name}.0")[..]));
        assert_eq!(JobIds::new(JobVar::Disabled).of(me, 0), None);
        assert_eq!(by_name.of(u32::MAX, 0), None, "a process that is gone has no job");
    }

    #[test]
    fn a_process_finds_its_own_job() {
        // SAFETY: getuid(2) has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        assert_eq!(own_job(&JobVar::Disabled), None);
        let named = own_job(&JobVar::ProcnameUid).expect("a program name");
        assert!(named.ends_with(&format!(".{uid}")), "{named}");
        // PATH is set in any test's environment; a variable that is not, names the program.
        assert_eq!(own_job(&JobVar::Env("PATH".into())), std::env::var("PATH").ok());
        assert_eq!(own_job(&JobVar::Env("BRAID_NO_SUCH_VARIABLE".into())), Some(named));
    }

    #[test]
    fn jobid_var_takes_a_name_or_a_keyword() {
        assert_eq!(JobVar::parse("disable"), Ok(JobVar::Disabled));
        assert_eq!(JobVar::parse("procname_uid"), Ok(JobVar::ProcnameUid));
        assert_eq!(JobVar::parse("PBS_JOBID"), Ok(JobVar::Env("PBS_JOBID".into())));
        assert!(JobVar::parse("a=b").is_err());
        assert!(JobVar::parse("").is_err());
    }
}
