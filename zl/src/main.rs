//! `zl`: zerolayer's command for operators and users.
//!
//! Today it generates the cluster CA and node certificates (`zl certs`), administers orchestrators (`zl admin`)
//! and prints its version (`zl version`). It owns argument parsing and output only; certificate logic lives in
//! `zl_proto::tls`, the admin API in `zl_admin`.

mod admin;
mod certs;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// zerolayer: a self-hosted, distributed LLM inference cluster.
#[derive(Parser, Debug)]
#[command(name = "zl", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create the cluster CA and node certificates for mutual TLS between tiers.
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// Administer the cluster through an orchestrator: workers, drains, aliases, canaries, keys, quotas, policy.
    Admin(admin::AdminArgs),
    /// Print the version of this build and of its wire protocol.
    Version,
}

fn main() -> ExitCode {
    zl_proto::tls::install_default_provider();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Certs(cmd) => certs::run(cmd),
        Command::Admin(args) => admin::run(args),
        Command::Version => {
            println!(
                "zl {} (wire protocol {}.{})",
                env!("CARGO_PKG_VERSION"),
                zl_proto::quic::PROTOCOL_MAJOR,
                zl_proto::quic::PROTOCOL_MINOR
            );
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(1)
        }
    }
}
