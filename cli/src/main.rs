//! `tandem`: the command-line entry point (up, generate, bench, and the services: router,
//! prefill, decode).

mod bench;
mod bench_serve;
mod bench_soak;
mod bench_steps;
mod engine_args;
mod generate_cmd;
mod serve_cmd;
mod up_cmd;

use clap::{Parser, Subcommand};

/// Tandem: disaggregated LLM serving.
#[derive(Parser)]
#[command(name = "tandem", version, about)]
struct Cli {
    /// Log format on standard error.
    #[arg(long, global = true, env = "TANDEM_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (structured fields, request ids).
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI API on 127.0.0.1 with a router, a prefill and a decode worker on CPU.
    Up(up_cmd::UpArgs),
    /// Generate text from a prompt with a local model.
    Generate(generate_cmd::GenerateArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Run the OpenAI-compatible router.
    Router(serve_cmd::RouterArgs),
    /// Run a prefill worker.
    Prefill(serve_cmd::PrefillArgs),
    /// Run a decode worker.
    Decode(serve_cmd::DecodeArgs),
}

fn main() {
    let cli = Cli::parse();
    let server = matches!(
        cli.command,
        Command::Up(_) | Command::Router(_) | Command::Prefill(_) | Command::Decode(_)
    );
    let default_filter = if server { "info,h2=warn,tower=warn,hyper=warn" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_filter.into());
    let fmt = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter);
    match cli.log_format {
        LogFormat::Text => fmt.init(),
        LogFormat::Json => fmt.json().with_current_span(true).init(),
    }
    if let Err(name) = tandem_engine::backend::cpu::quant::QKernel::requested() {
        eprintln!(
            "error: TANDEM_CPU_KERNEL={name}: expected auto, scalar, avx2, avxvnni or avx512"
        );
        std::process::exit(2);
    }
    let result = match cli.command {
        Command::Up(a) => up_cmd::run(a, matches!(cli.log_format, LogFormat::Json)),
        Command::Generate(a) => generate_cmd::run(a),
        Command::Bench(b) => bench::run(b),
        Command::Router(a) => serve_cmd::run_router(a),
        Command::Prefill(a) => serve_cmd::run_prefill(a),
        Command::Decode(a) => serve_cmd::run_decode(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every subcommand's flags are consistent (clap checks names, groups and defaults only
    /// when a command is built in a debug build; this builds them all).
    #[test]
    fn every_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
