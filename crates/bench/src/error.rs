//! The one error type of the bench crate. Every variant says what failed and where (task,
//! path, option), so a benchmark that stops tells the user why without a backtrace.

use std::io;

/// Everything that can stop a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Options that cannot describe a run (block not a multiple of transfer, zero tasks, ...).
    #[error("invalid options: {0}")]
    Usage(String),
    /// A storage operation failed; carries the operation and the path. The cause is
    /// part of the message and not also a `source`, or an error chain prints it twice.
    #[error("{op} {path}: {cause}")]
    Io { op: &'static str, path: String, cause: io::Error },
    /// A task process failed or broke the driver protocol.
    #[error("task {task}: {message}")]
    Task { task: usize, message: String },
    /// `-R` found data that differs from what was written.
    #[error("data check failed: {0}")]
    Verify(String),
    /// Anything else (spawning processes, writing reports, the native client).
    #[error("{0}")]
    Other(String),
}

impl BenchError {
    pub fn io(op: &'static str, path: impl Into<String>, source: io::Error) -> Self {
        BenchError::Io { op, path: path.into(), cause: source }
    }
}

pub type Result<T> = std::result::Result<T, BenchError>;

/// Shorthand for `Err(BenchError::Usage(..))` with `format!` arguments.
macro_rules! usage {
    ($($arg:tt)*) => {
        return Err($crate::error::BenchError::Usage(format!($($arg)*)))
    };
}
pub(crate) use usage;
