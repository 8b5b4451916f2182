//! Tasks as OS processes, the way MPI ranks run IOR and mdtest. The driver starts N copies of
//! the current executable as `bench worker`, hands each its job as one JSON line on stdin, and
//! then runs the phases in lock step: it sends every task a [`PhaseOrder`] (the barrier
//! release) and waits until every task has answered with a [`PhaseResult`] (the barrier).
//! Each result carries the task's start and end on the system-wide monotonic clock, so the
//! driver computes aggregate bandwidth from the first start to the last end.
//!
//! Pipes are the whole protocol: one line per message, small typed JSON (control plane only;
//! the measured bytes never cross it). A task that fails answers [`TaskReply::Failed`] and the
//! driver stops the run; when the driver closes stdin the tasks exit.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::backend::NativeConnect;
use crate::error::{BenchError, Result};
use crate::{ior, mdtest};

/// Everything one task needs to know before the first phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TaskJob {
    Ior(ior::IorTaskJob),
    Mdtest(mdtest::MdtestTaskJob),
}

/// The phases engines run; the driver names one per barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Write,
    Read,
    TreeCreate,
    DirCreate,
    DirStat,
    DirRemove,
    FileCreate,
    FileStat,
    FileRead,
    FileRemove,
    TreeRemove,
}

impl Phase {
    /// The operation name IOR (`write`, `read`) or mdtest (`File creation`) prints.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Write => "write",
            Phase::Read => "read",
            Phase::TreeCreate => "Tree creation",
            Phase::DirCreate => "Directory creation",
            Phase::DirStat => "Directory stat",
            Phase::DirRemove => "Directory removal",
            Phase::FileCreate => "File creation",
            Phase::FileStat => "File stat",
            Phase::FileRead => "File read",
            Phase::FileRemove => "File removal",
            Phase::TreeRemove => "Tree removal",
        }
    }
}

/// The barrier release: run `phase` of `iteration` now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseOrder {
    pub phase: Phase,
    pub iteration: u32,
    /// Stonewall: stop issuing transfers at this monotonic instant (IOR `-D`).
    pub deadline_ns: Option<u64>,
    /// Read at most this many transfers (what the writer got done before a stonewall).
    pub transfer_limit: Option<u64>,
}

/// One task's account of one phase.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PhaseResult {
    pub rank: usize,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Data bytes moved (IOR) or read/written in files (mdtest).
    pub bytes: u64,
    /// Transfers (IOR) or items (mdtest) completed.
    pub ops: u64,
    /// Bytes that differed from what was written (IOR `-R`).
    pub verify_errors: u64,
    /// The first mismatch, in words, with task and offset.
    pub first_verify_error: Option<String>,
    /// Requests the task's client sent to MDTs and to OSTs during the phase, when its
    /// backend counts them (the native braid client).
    pub rpcs: Option<crate::backend::RpcTally>,
}

/// What a task sends back: once `Ready` after setup, then one reply per order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TaskReply {
    Ready,
    Done(PhaseResult),
    Failed(String),
}

/// A task's side of a phase: engines implement this for their per-task state.
pub trait TaskRunner {
    fn run_phase(&mut self, order: &PhaseOrder) -> Result<PhaseResult>;
}

/// The driver's handle on N running task processes.
pub struct TaskGroup {
    tasks: Vec<TaskProcess>,
}

struct TaskProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl TaskGroup {
    /// Starts `count` tasks and waits until each has opened its backend and is ready.
    pub fn spawn(count: usize, job_for_rank: impl Fn(usize) -> TaskJob) -> Result<TaskGroup> {
        let exe = std::env::current_exe()
            .map_err(|e| BenchError::Other(format!("cannot find the current executable: {e}")))?;
        let mut group = TaskGroup { tasks: Vec::with_capacity(count) };
        for rank in 0..count {
            let mut child = Command::new(&exe)
                .args(["bench", "worker"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| BenchError::Other(format!("starting task {rank} ({}): {e}", exe.display())))?;
            let stdin = child.stdin.take().expect("piped stdin");
            let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
            group.tasks.push(TaskProcess { child, stdin: Some(stdin), stdout });
            group.send(rank, &job_for_rank(rank))?;
        }
        for rank in 0..count {
            match group.receive(rank)? {
                TaskReply::Ready => {}
                other => return Err(unexpected(rank, &other)),
            }
        }
        Ok(group)
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Runs one phase on every task: releases them all, then waits for all of them.
    pub fn run_phase(&mut self, order_for_rank: impl Fn(usize) -> PhaseOrder) -> Result<Vec<PhaseResult>> {
        for rank in 0..self.tasks.len() {
            self.send(rank, &order_for_rank(rank))?;
        }
        let mut results = Vec::with_capacity(self.tasks.len());
        let mut failure = None;
        for rank in 0..self.tasks.len() {
            match self.receive(rank) {
                Ok(TaskReply::Done(mut result)) => {
                    result.rank = rank;
                    results.push(result);
                }
                Ok(other) => failure = failure.or(Some(unexpected(rank, &other))),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(results),
        }
    }

    /// Closes the tasks' stdin and waits for them to exit.
    pub fn finish(mut self) -> Result<()> {
        let mut failure = None;
        for (rank, task) in self.tasks.iter_mut().enumerate() {
            task.stdin.take();
            match task.child.wait() {
                Ok(status) if status.success() => {}
                Ok(status) => {
                    failure =
                        failure.or(Some(BenchError::Task { task: rank, message: format!("exited with {status}") }))
                }
                Err(e) => failure = failure.or(Some(BenchError::Task { task: rank, message: format!("wait: {e}") })),
            }
        }
        self.tasks.clear();
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn send(&mut self, rank: usize, message: &impl Serialize) -> Result<()> {
        let task = &mut self.tasks[rank];
        let mut line = serde_json::to_vec(message).expect("task messages serialize");
        line.push(b'\n');
        let stdin = task.stdin.as_mut().expect("stdin open while running");
        stdin.write_all(&line).and_then(|()| stdin.flush()).map_err(|e| BenchError::Task {
            task: rank,
            message: format!("sending order: {e} (the task exited; see its error above)"),
        })
    }

    fn receive(&mut self, rank: usize) -> Result<TaskReply> {
        let mut line = String::new();
        let read = self.tasks[rank]
            .stdout
            .read_line(&mut line)
            .map_err(|e| BenchError::Task { task: rank, message: format!("reading reply: {e}") })?;
        if read == 0 {
            return Err(BenchError::Task {
                task: rank,
                message: "exited without replying (see its error above)".into(),
            });
        }
        let reply: TaskReply = serde_json::from_str(&line)
            .map_err(|e| BenchError::Task { task: rank, message: format!("bad reply {:?}: {e}", line.trim_end()) })?;
        match reply {
            TaskReply::Failed(message) => Err(BenchError::Task { task: rank, message }),
            other => Ok(other),
        }
    }
}

impl Drop for TaskGroup {
    /// On an error path the group is dropped with tasks still running: stop exactly those
    /// processes (the children this group started) so nothing is left behind.
    fn drop(&mut self) {
        for task in &mut self.tasks {
            task.stdin.take();
            let _ = task.child.kill();
            let _ = task.child.wait();
        }
    }
}

fn unexpected(rank: usize, reply: &TaskReply) -> BenchError {
    BenchError::Task { task: rank, message: format!("unexpected reply {reply:?}") }
}

/// The body of `bench worker`: read the job, set up, then serve phase orders until stdin
/// closes. Errors are reported to the driver as `Failed` and end the process with status 1.
pub fn worker_main(native: Option<NativeConnect>) -> Result<()> {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut output = protocol_output()?;
    let reply = |output: &mut std::fs::File, message: &TaskReply| -> Result<()> {
        let mut line = serde_json::to_vec(message).expect("task replies serialize");
        line.push(b'\n');
        output
            .write_all(&line)
            .and_then(|()| output.flush())
            .map_err(|e| BenchError::Other(format!("worker: writing to the driver: {e}")))
    };
    let mut line = String::new();
    let read = input.read_line(&mut line).map_err(|e| BenchError::Other(format!("worker: reading the job: {e}")))?;
    if read == 0 {
        return Err(BenchError::Other("worker: no job on stdin (bench worker is started by the bench driver)".into()));
    }
    let job: TaskJob = serde_json::from_str(&line).map_err(|e| BenchError::Other(format!("worker: bad job: {e}")))?;
    let runner: Result<Box<dyn TaskRunner>> = match job {
        TaskJob::Ior(job) => ior::IorTask::new(job, native).map(|t| Box::new(t) as _),
        TaskJob::Mdtest(job) => mdtest::MdtestTask::new(job, native).map(|t| Box::new(t) as _),
    };
    let mut runner = match runner {
        Ok(runner) => runner,
        Err(e) => {
            reply(&mut output, &TaskReply::Failed(e.to_string()))?;
            return Err(e);
        }
    };
    reply(&mut output, &TaskReply::Ready)?;
    loop {
        line.clear();
        let read =
            input.read_line(&mut line).map_err(|e| BenchError::Other(format!("worker: reading an order: {e}")))?;
        if read == 0 {
            return Ok(());
        }
        let order: PhaseOrder =
            serde_json::from_str(&line).map_err(|e| BenchError::Other(format!("worker: bad order: {e}")))?;
        match runner.run_phase(&order) {
            Ok(result) => reply(&mut output, &TaskReply::Done(result))?,
            Err(e) => {
                reply(&mut output, &TaskReply::Failed(e.to_string()))?;
                return Err(e);
            }
        }
    }
}

/// Takes the pipe to the driver out of fd 1 and points fd 1 at stderr: a backend or library
/// that prints to stdout in a task process would otherwise corrupt the replies.
fn protocol_output() -> Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    // SAFETY: dup and dup2 on the process's own standard descriptors; the duplicate is a
    // fresh descriptor that nothing else owns, so the File below may own and close it.
    unsafe {
        let protocol_fd = libc::dup(libc::STDOUT_FILENO);
        if protocol_fd < 0 || libc::dup2(libc::STDERR_FILENO, libc::STDOUT_FILENO) < 0 {
            return Err(BenchError::Other(format!("worker: redirecting stdout: {}", std::io::Error::last_os_error())));
        }
        Ok(std::fs::File::from_raw_fd(protocol_fd))
    }
}
