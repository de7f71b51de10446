//! `zl admin adapters`: the LoRA adapter registry (docs/adapters.md).

use anyhow::{Context, Result};
use clap::Subcommand;
use tonic::transport::Channel;
use zl_admin::pb;
use zl_admin::pb::admin_client::AdminClient;

use super::{call, written};

#[derive(Subcommand, Debug)]
pub(crate) enum AdaptersCommand {
    /// List the registered adapters and the workers where each is loaded now.
    List,
    /// Register an adapter over a model: served as NAME and BASE:NAME to the projects that may use it.
    Add {
        /// Its name as clients ask for it (no ':').
        name: String,
        /// The model id it applies to.
        #[arg(long)]
        base: String,
        /// A PEFT directory (adapter_config.json, adapter_model.safetensors) or a GGUF adapter file, on the
        /// workers' adapter volume: relative to their --adapter-root, or absolute inside it.
        #[arg(long)]
        path: String,
        /// SHA-256 of its weights file (adapter_model.safetensors, or the .gguf): `sha256sum FILE`. Workers refuse
        /// a file that does not match.
        #[arg(long)]
        sha256: String,
        /// The project that owns it (only it may use the adapter, unless --shared). Default: every project.
        #[arg(long, default_value = "")]
        project: String,
        /// Let every project use it although a project owns it.
        #[arg(long)]
        shared: bool,
    },
    /// Remove an adapter: new requests no longer find it; running ones finish.
    Remove {
        /// Its name.
        name: String,
    },
}

/// Run one `adapters` command against `c`.
pub(super) async fn run(c: &mut AdminClient<Channel>, command: AdaptersCommand) -> Result<()> {
    match command {
        AdaptersCommand::List => {
            let r = c.list_adapters(pb::ListAdaptersRequest {}).await.map_err(call)?.into_inner();
            println!("{:<24} {:<28} {:<16} {:<14} LOADED ON", "NAME", "BASE", "PROJECT", "SHA-256");
            for a in r.adapters {
                let project = match (a.project.as_str(), a.shared) {
                    ("", _) => "(all)".to_owned(),
                    (p, true) => format!("{p} (shared)"),
                    (p, false) => p.to_owned(),
                };
                let loaded = if a.resident_on.is_empty() { "-".to_owned() } else { a.resident_on.join(",") };
                let sha = a.sha256.get(..12).unwrap_or(&a.sha256);
                println!("{:<24} {:<28} {project:<16} {sha:<14} {loaded}", a.name, a.base);
            }
            Ok(())
        }
        AdaptersCommand::Add { name, base, path, sha256, project, shared } => {
            let what = format!("adapter {name} registered over {base}");
            let info = pb::AdapterInfo { name, base, path, sha256, project, shared, resident_on: vec![] };
            written(&what, c.add_adapter(info).await.map_err(call).context("adding the adapter")?.into_inner());
            Ok(())
        }
        AdaptersCommand::Remove { name } => {
            let what = format!("adapter {name} removed");
            written(&what, c.remove_adapter(pb::RemoveAdapterRequest { name }).await.map_err(call)?.into_inner());
            Ok(())
        }
    }
}
