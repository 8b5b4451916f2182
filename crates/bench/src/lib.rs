//! braid bench: the benchmark method of the seeds (IOR, mdtest, IOzone; seed 000 chapter 3,
//! seed 002 section V, seed 003 section 4) shipped as `braid bench`, so anyone can measure
//! braid and the systems they compare it with in one run and see the result as a picture.
//!
//! - [`ior`], [`mdtest`], [`iozone`]: the engines, with the option names of the real tools.
//! - [`task`]: tasks as OS processes with barriers between phases, as MPI ranks run IOR.
//! - [`backend`]: the storage they measure, a small [`FileBackend`] trait with a POSIX
//!   implementation; `cli::native_bench` adds the native client through [`NativeConnect`].
//! - [`sweep`]: named experiments over several targets, with [`svg`] plots and a Markdown
//!   report; [`nbd`] is its preset measuring NBD exports (seed 004).
//!
//! The binary mounts [`BenchCommand`] as `braid bench` and calls [`run`].

pub mod backend;
pub mod clock;
pub mod error;
pub mod figures;
pub mod ior;
pub mod iozone;
pub mod machine;
pub mod mdtest;
pub mod nbd;
pub mod offsets;
pub mod progress;
pub mod stats;
pub mod svg;
pub mod sweep;
pub mod task;
pub mod units;

pub use backend::{FileBackend, FileHandle, FileStat, NativeConnect, OpenFlags, PosixBackend, RpcTally};
pub use error::BenchError;

use progress::Progress;

/// Parses `args` as the options of the engine `T` (named `name` in messages):
/// what each engine's unit tests start from.
#[cfg(test)]
pub(crate) fn parse_options<T: clap::Parser>(name: &str, args: &[&str]) -> T {
    T::try_parse_from(std::iter::once(name).chain(args.iter().copied())).expect("options parse")
}

/// `braid bench <command>`.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// IOR-style bandwidth: shared file or file per process, sequential/strided/random.
    Ior(ior::IorArgs),
    /// mdtest-style metadata rates: create, stat, read, remove; shared or unique directory.
    Mdtest(mdtest::MdtestArgs),
    /// IOzone-style grid of file size x record size.
    Iozone(iozone::IozoneArgs),
    /// A named experiment against several targets, with SVG plots and a Markdown report.
    Sweep(sweep::SweepArgs),
    /// One task process of ior or mdtest; started by the bench driver, not by people.
    #[command(hide = true)]
    Worker,
}

/// Runs one bench command. `native` opens the native braid client for `-a native`; pass
/// `None` where the binary has none and `-a native` is refused with a clear message.
pub fn run(cmd: BenchCommand, native: Option<NativeConnect>) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Ior(args) => {
            let report = ior::execute(&args, native, &mut Progress::new(args.quiet))?;
            if args.json {
                println!("{}", to_json(&report));
            } else {
                print!("{}", ior::render_text(&report));
            }
            if report.verify_errors > 0 {
                return Err(BenchError::Verify(format!(
                    "{} corrupted bytes; {}",
                    report.verify_errors,
                    report.verify_messages.join("; ")
                ))
                .into());
            }
        }
        BenchCommand::Mdtest(args) => {
            let report = mdtest::execute(&args, native, &mut Progress::new(args.quiet))?;
            if args.json {
                println!("{}", to_json(&report));
            } else {
                print!("{}", mdtest::render_text(&report));
            }
        }
        BenchCommand::Iozone(args) => {
            let report = iozone::execute(&args, native, &mut Progress::new(args.quiet))?;
            if args.json {
                println!("{}", to_json(&report));
            } else {
                print!("{}", iozone::render_text(&report));
            }
        }
        BenchCommand::Sweep(args) => {
            let report = sweep::execute(&args, native)?;
            if !args.quiet {
                println!(
                    "wrote {}/report.md, {} SVG figure(s) and results.json ({} runs)",
                    args.out,
                    report.figures.len(),
                    report.runs.len()
                );
            }
        }
        BenchCommand::Worker => {
            if let Err(e) = task::worker_main(native) {
                // The driver also reports it with the task number; exit without anyhow's
                // backtrace noise.
                eprintln!("braid bench worker: {e}");
                std::process::exit(1);
            }
        }
    }
    Ok(())
}

fn to_json(value: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(value).expect("reports serialize")
}
