//! `tandem-operator`: runs the InferenceService controller, or prints what the chart ships.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tandem-operator",
    version,
    about = "Kubernetes operator for Tandem InferenceService resources"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Reconcile InferenceService resources (in-cluster or from the kubeconfig).
    Run {
        /// Watch only this namespace (default: all).
        #[arg(long, env = "TANDEM_WATCH_NAMESPACE")]
        namespace: Option<String>,
        /// `json` for structured logs.
        #[arg(long, default_value = "text")]
        log_format: String,
        /// Where the liveness (`/healthz`) and readiness (`/readyz`) probes are served.
        #[arg(long, env = "TANDEM_OPERATOR_HEALTH_LISTEN", default_value = "0.0.0.0:8081")]
        health_listen: std::net::SocketAddr,
    },
    /// Print the CustomResourceDefinition as YAML.
    Crd,
    /// Write the chart's generated files (CRD, dashboards) under the chart directory.
    Generate {
        /// The chart directory.
        #[arg(long, default_value = "charts/tandem")]
        chart: std::path::PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { namespace, log_format, health_listen } => {
            let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info".into());
            if log_format == "json" {
                tracing_subscriber::fmt().json().with_env_filter(filter).init();
            } else {
                tracing_subscriber::fmt().with_env_filter(filter).init();
            }
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async {
                let ready = std::sync::Arc::new(tandem_operator::health::Readiness::default());
                let probes =
                    tokio::spawn(tandem_operator::health::serve(health_listen, ready.clone()));
                let client = kube::Client::try_default().await?;
                tokio::select! {
                    r = tandem_operator::controller::run(client, namespace, ready) => r,
                    r = probes => r?.and(Err(anyhow::anyhow!("the probe server stopped"))),
                }
            })
        }
        Command::Crd => {
            print!("{}", tandem_operator::crd::crd_yaml());
            Ok(())
        }
        Command::Generate { chart } => {
            for (path, text) in tandem_operator::dashboards::generated_files() {
                let p = chart.join(path);
                std::fs::create_dir_all(p.parent().expect("parent"))?;
                std::fs::write(&p, text)?;
                println!("wrote {}", p.display());
            }
            Ok(())
        }
    }
}
