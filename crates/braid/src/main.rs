//! The `braid` binary: one executable for every server role and every tool.
//! It only parses the command line and wires crates together.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "braid", version, about = "braid parallel file system")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks: IOR, mdtest and IOzone-style runs, sweeps, plots and reports.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(cmd) => bench::run(cmd, None),
    }
}
