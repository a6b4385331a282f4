//! `tandem`: the command-line entry point (generate, bench).

mod bench;
mod engine_args;
mod generate_cmd;

use clap::{Parser, Subcommand};

/// Tandem: disaggregated LLM serving.
#[derive(Parser)]
#[command(name = "tandem", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt with a local model.
    Generate(generate_cmd::GenerateArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => generate_cmd::run(a),
        Command::Bench(b) => bench::run(b),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
