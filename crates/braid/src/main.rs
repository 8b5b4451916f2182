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
enum Command {}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {}
}
