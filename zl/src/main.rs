//! `zl`: zerolayer's command for operators and users.
//!
//! `zl up` runs a whole cluster on this machine, `zl chat` talks to one, `zl certs` makes the cluster CA and node
//! certificates, `zl admin` administers orchestrators, `zl audit` checks and exports audit logs, `zl bench` measures an endpoint, `zl version` prints the build. Certificate logic lives in
//! `zl_tls`, the admin API in `zl_admin`; this crate owns argument parsing, processes and output.

mod admin;
mod audit;
mod bench;
mod certs;
mod chat;
mod local;
mod supervise;
mod up;
mod up_state;

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
    /// Run the whole cluster on this machine (orchestrator, worker, frontend as separate processes) with the
    /// bundled default model; Ctrl-C stops it.
    Up(up::UpArgs),
    /// Chat with a running cluster in this terminal, streaming tokens as they come.
    Chat(chat::ChatArgs),
    /// Create the cluster CA and node certificates for mutual TLS between tiers.
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// Administer the cluster through an orchestrator: workers, drains, aliases, canaries, keys, quotas, policy.
    Admin(admin::AdminArgs),
    /// Audit logs: verify chains against the heads committed to the orchestrators, export records.
    Audit(audit::AuditArgs),
    /// Load-test any Anthropic- or OpenAI-compatible endpoint (a `zl up` cluster by default), or one worker
    /// directly; `zl bench compare A.json B.json` puts two runs side by side.
    Bench {
        #[command(flatten)]
        args: zl_loadgen::cli::BenchArgs,
        /// `zl up`'s data dir, to find its cluster.json; results go to its `bench/` unless `--out` says otherwise.
        #[arg(long, env = "ZL_DATA_DIR", global = true)]
        data_dir: Option<std::path::PathBuf>,
    },
    /// Print the version of this build and of its wire protocol.
    Version,
}

fn main() -> ExitCode {
    zl_tls::install_default_provider();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Up(args) => up::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Certs(cmd) => certs::run(cmd),
        Command::Admin(args) => admin::run(args),
        Command::Audit(args) => audit::run(args),
        Command::Bench { args, data_dir } => bench::run(args, data_dir.as_deref()),
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::CommandFactory;

    #[test]
    fn admin_help_lists_a_commands_own_flags_before_the_ones_every_admin_command_takes() {
        let mut cli = super::Cli::command();
        cli.build();
        let admin = cli.find_subcommand_mut("admin").unwrap();
        let help = admin.find_subcommand_mut("budget").unwrap().render_help().to_string();
        let at = |flag: &str| help.find(flag).unwrap_or_else(|| panic!("{flag} missing:\n{help}"));
        assert!(at("--limit") < at("Which cluster"), "{help}");
        assert!(at("Which cluster") < at("--orchestrator") && at("Which cluster") < at("--data-dir"), "{help}");
    }
}
