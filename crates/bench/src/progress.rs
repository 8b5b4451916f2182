//! A one-line progress display for people at a terminal. It writes to stderr, only when
//! stderr is a terminal and `--quiet` was not given, so scripts and pipes get clean output.

use std::io::{IsTerminal, Write};

pub struct Progress {
    enabled: bool,
    shown: bool,
}

impl Progress {
    pub fn new(quiet: bool) -> Progress {
        Progress { enabled: !quiet && std::io::stderr().is_terminal(), shown: false }
    }

    /// A silent display, for engines run inside a sweep that shows its own.
    pub fn silent() -> Progress {
        Progress { enabled: false, shown: false }
    }

    /// Replaces the current status line.
    pub fn status(&mut self, message: &str) {
        if self.enabled {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K{message}");
            let _ = err.flush();
            self.shown = true;
        }
    }

    /// Clears the status line before the results are printed.
    pub fn clear(&mut self) {
        if self.enabled && self.shown {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[K");
            self.shown = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}
