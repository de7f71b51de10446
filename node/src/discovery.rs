//! The discovery setting every tier binary and `zl up` take: `static` (peers named by flags, the default) or
//! `consul` (through the local Consul agent: `--consul-addr`, an ACL token file, a CA and client certificate for
//! an HTTPS agent, a datacenter, the TTL of the node's check).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::consul::status::DiscoveryStatus;
use crate::consul::{ConsulClient, ConsulSettings, Registration};
use crate::resolve::split_host_port;

/// How a node finds the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// Peers named by flags (`--orchestrator`).
    #[default]
    Static,
    /// Through the local Consul agent.
    Consul,
}

/// The discovery flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DiscoveryArgs {
    /// How this node finds the others: static (addresses given by flags) or consul (through the local agent).
    #[arg(long, env = "ZL_DISCOVERY", value_enum, default_value_t = Backend::Static)]
    pub discovery: Backend,
    /// The local Consul agent's HTTP API: host:port, http://host:port, or https://host:port (HTTPS needs
    /// --consul-ca-file).
    #[arg(long, env = "ZL_CONSUL_ADDR", default_value = "127.0.0.1:8500")]
    pub consul_addr: String,
    /// File holding the ACL token sent to the agent (`X-Consul-Token`).
    #[arg(long, env = "ZL_CONSUL_TOKEN_FILE")]
    pub consul_token_file: Option<PathBuf>,
    /// CA certificate (PEM) of an HTTPS agent; giving it turns HTTPS on.
    #[arg(long, env = "ZL_CONSUL_CA_FILE")]
    pub consul_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for an agent that verifies them (`verify_incoming_https`).
    #[arg(long, env = "ZL_CONSUL_CLIENT_CERT", requires = "consul_client_key")]
    pub consul_client_cert: Option<PathBuf>,
    /// Key of --consul-client-cert.
    #[arg(long, env = "ZL_CONSUL_CLIENT_KEY", requires = "consul_client_cert")]
    pub consul_client_key: Option<PathBuf>,
    /// Datacenter to discover in (default: the agent's own).
    #[arg(long, env = "ZL_CONSUL_DATACENTER")]
    pub consul_datacenter: Option<String>,
    /// TTL of this node's Consul check, passed three times per TTL: a node that stops passing it leaves every
    /// `?passing` answer (and gets no routes) within this.
    #[arg(long, env = "ZL_CONSUL_TTL_MS", default_value_t = 10_000)]
    pub consul_ttl_ms: u64,
    /// Consul deregisters a node whose check has been critical this long (Consul's own floor is one minute).
    #[arg(long, env = "ZL_CONSUL_DEREGISTER_AFTER_S", default_value_t = 60)]
    pub consul_deregister_after_s: u64,
}

/// How a worker or a frontend finds the orchestrators: a static list, or discovery.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OrchestratorArgs {
    /// Orchestrator QUIC addresses, host:port (a DNS name is resolved again every 5 s; repeatable, or
    /// comma-separated; --discovery static).
    #[arg(
        long = "orchestrator",
        env = "ZL_ORCHESTRATORS",
        value_delimiter = ',',
        value_parser = crate::resolve::parse_address
    )]
    pub orchestrators: Vec<String>,
    /// Or discovery.
    #[command(flatten)]
    pub discovery: DiscoveryArgs,
}

impl OrchestratorArgs {
    /// Check the settings without reading any file: `--orchestrator` never beside consul, and some orchestrator
    /// when `required` (a frontend needs them; a worker without any runs standalone).
    pub fn check(&self, required: bool) -> Result<()> {
        self.discovery.check()?;
        match (self.discovery.discovery, self.orchestrators.is_empty()) {
            (Backend::Consul, false) => {
                bail!("--orchestrator is for --discovery static: with consul the orchestrators are found there")
            }
            (Backend::Static, true) if required => bail!("give --orchestrator HOST:PORT (or --discovery consul)"),
            _ => Ok(()),
        }
    }

    /// [`OrchestratorArgs::check`], then the Consul backend when chosen (reading its token file).
    pub fn consul(&self, required: bool) -> Result<Option<ConsulDiscovery>> {
        self.check(required)?;
        self.discovery.consul()
    }
}

/// A node's Consul backend, ready to register and watch.
#[derive(Clone, Debug)]
pub struct ConsulDiscovery {
    /// The agent's client.
    pub client: ConsulClient,
    /// The check's TTL.
    pub ttl: Duration,
    /// Deregistration after this long critical.
    pub deregister_after: Duration,
    /// Reachability, shared by the node's loops.
    pub status: Arc<DiscoveryStatus>,
}

impl ConsulDiscovery {
    /// A registration of this node's service `name` with id `id`, dialled at `advertise` (`host:port`; a
    /// wildcard host registers no address, so consumers use the Consul node's).
    pub fn registration(&self, name: &str, id: &str, advertise: &str) -> Result<Registration> {
        let (host, port) = split_host_port(advertise)?;
        let wildcard = host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_unspecified());
        Ok(Registration {
            id: id.to_owned(),
            name: name.to_owned(),
            address: if wildcard { String::new() } else { host },
            port,
            tags: vec![],
            meta: Default::default(),
            ttl: self.ttl,
            deregister_after: self.deregister_after,
        })
    }
}

impl DiscoveryArgs {
    /// Check the settings without reading any file they name (`--check-config`).
    pub fn check(&self) -> Result<()> {
        if self.discovery == Backend::Consul {
            self.agent()?;
        }
        Ok(())
    }

    /// The agent's address without its scheme, and whether it is HTTPS.
    fn agent(&self) -> Result<(bool, &str)> {
        let (https, addr) = match self.consul_addr.split_once("://") {
            Some(("https", rest)) => (true, rest),
            Some(("http", rest)) => (false, rest),
            Some((scheme, _)) => bail!("--consul-addr {:?}: scheme {scheme} (http or https)", self.consul_addr),
            None => (self.consul_ca_file.is_some(), self.consul_addr.as_str()),
        };
        let addr = addr.trim_end_matches('/');
        split_host_port(addr).with_context(|| format!("--consul-addr {:?}", self.consul_addr))?;
        if https && self.consul_ca_file.is_none() {
            bail!("--consul-addr {:?} is HTTPS: give --consul-ca-file", self.consul_addr);
        }
        if !https && self.consul_ca_file.is_some() {
            bail!("--consul-ca-file is for an HTTPS agent, but --consul-addr {:?} says http", self.consul_addr);
        }
        if self.consul_ttl_ms < 100 {
            bail!("--consul-ttl-ms must be at least 100");
        }
        Ok((https, addr))
    }

    /// The Consul backend, when `--discovery consul` (reads the token file now).
    pub fn consul(&self) -> Result<Option<ConsulDiscovery>> {
        if self.discovery != Backend::Consul {
            return Ok(None);
        }
        let (_, addr) = self.agent()?;
        let token = match &self.consul_token_file {
            None => None,
            Some(path) => {
                let token = std::fs::read_to_string(path)
                    .with_context(|| format!("reading --consul-token-file {}", path.display()))?;
                let token = token.trim();
                if token.is_empty() || token.chars().any(|c| c.is_control()) {
                    bail!("--consul-token-file {}: not a token", path.display());
                }
                Some(token.to_owned())
            }
        };
        let client = ConsulClient::new(ConsulSettings {
            addr: addr.to_owned(),
            token,
            datacenter: self.consul_datacenter.clone(),
            ca_file: self.consul_ca_file.clone(),
            client_cert: self.consul_client_cert.clone().zip(self.consul_client_key.clone()),
        })?;
        Ok(Some(ConsulDiscovery {
            client,
            ttl: Duration::from_millis(self.consul_ttl_ms),
            deregister_after: Duration::from_secs(self.consul_deregister_after_s.max(1)),
            status: Arc::new(DiscoveryStatus::new(Instant::now())),
        }))
    }

    /// These settings as flags, for a child process (`zl up`).
    pub fn to_argv(&self) -> Vec<String> {
        if self.discovery != Backend::Consul {
            return vec![];
        }
        let mut argv = vec!["--discovery".into(), "consul".into(), "--consul-addr".into(), self.consul_addr.clone()];
        let mut path = |flag: &str, p: &Option<PathBuf>| {
            if let Some(p) = p {
                argv.push(flag.into());
                argv.push(p.to_string_lossy().into_owned());
            }
        };
        path("--consul-token-file", &self.consul_token_file);
        path("--consul-ca-file", &self.consul_ca_file);
        path("--consul-client-cert", &self.consul_client_cert);
        path("--consul-client-key", &self.consul_client_key);
        if let Some(dc) = &self.consul_datacenter {
            argv.extend(["--consul-datacenter".into(), dc.clone()]);
        }
        argv.extend([
            "--consul-ttl-ms".into(),
            self.consul_ttl_ms.to_string(),
            "--consul-deregister-after-s".into(),
            self.consul_deregister_after_s.to_string(),
        ]);
        argv
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        discovery: DiscoveryArgs,
    }

    fn parse(args: &[&str]) -> DiscoveryArgs {
        Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied())).unwrap().discovery
    }

    #[test]
    fn static_is_the_default_and_needs_no_agent() {
        let d = parse(&[]);
        assert_eq!(d.discovery, Backend::Static);
        assert!(d.consul().unwrap().is_none());
        assert!(d.to_argv().is_empty());
    }

    #[test]
    fn consul_settings_are_checked_and_pass_to_children_unchanged() {
        let d = parse(&["--discovery", "consul", "--consul-addr", "10.0.0.1:8500", "--consul-ttl-ms", "3000"]);
        let c = d.consul().unwrap().unwrap();
        assert_eq!(c.ttl, Duration::from_secs(3));
        let again = parse(&d.to_argv().iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(
            (again.discovery, again.consul_addr.as_str(), again.consul_ttl_ms),
            (Backend::Consul, "10.0.0.1:8500", 3000)
        );
        for bad in [
            &["--discovery", "consul", "--consul-addr", "https://x:8501"][..],
            &["--discovery", "consul", "--consul-addr", "ftp://x:1"],
            &["--discovery", "consul", "--consul-addr", "nohost"],
            &["--discovery", "consul", "--consul-token-file", "/nonexistent/token"],
        ] {
            assert!(parse(bad).consul().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn orchestrators_come_from_flags_or_consul_never_both() {
        #[derive(Parser, Debug)]
        struct Peers {
            #[command(flatten)]
            peers: OrchestratorArgs,
        }
        let parse =
            |args: &[&str]| Peers::try_parse_from(std::iter::once("t").chain(args.iter().copied())).unwrap().peers;
        let listed = parse(&["--orchestrator", "orch-0.orch:7000,127.0.0.1:7000"]);
        assert_eq!(listed.orchestrators, ["orch-0.orch:7000", "127.0.0.1:7000"]);
        assert!(listed.consul(true).unwrap().is_none());
        assert!(parse(&[]).consul(true).is_err(), "a frontend needs orchestrators");
        assert!(parse(&[]).consul(false).unwrap().is_none(), "a worker without any runs standalone");
        assert!(parse(&["--discovery", "consul"]).consul(true).unwrap().is_some());
        assert!(parse(&["--discovery", "consul", "--orchestrator", "a:1"]).consul(false).is_err());
        assert!(Peers::try_parse_from(["t", "--orchestrator", "no-port"]).is_err());
    }

    #[derive(Parser, Debug)]
    struct Tier {
        #[command(subcommand)]
        cmd: Sub,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Sub {
        #[command(args_override_self = true)]
        Serve {
            #[command(flatten)]
            discovery: DiscoveryArgs,
            #[arg(long)]
            config: Option<PathBuf>,
        },
    }

    #[test]
    fn the_settings_come_from_config_files_like_every_other() {
        use clap::CommandFactory;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tier.toml");
        std::fs::write(
            &path,
            "discovery = \"consul\"\nconsul-addr = \"https://10.0.0.1:8501\"\nconsul-ttl-ms = 5000\n",
        )
        .unwrap();
        let argv = ["zl-worker", "serve", "--config", path.to_str().unwrap(), "--consul-ttl-ms", "4000"];
        let argv = crate::config::expand(&Tier::command(), "serve", argv.iter().map(Into::into).collect()).unwrap();
        let Sub::Serve { discovery, .. } = Tier::try_parse_from(argv).unwrap().cmd;
        assert_eq!(discovery.discovery, Backend::Consul);
        assert_eq!(discovery.consul_addr, "https://10.0.0.1:8501");
        assert_eq!(discovery.consul_ttl_ms, 4000, "a flag beats the file");
    }

    #[test]
    fn registrations_use_the_advertised_address_and_leave_wildcards_to_consul() {
        let c = parse(&["--discovery", "consul"]).consul().unwrap().unwrap();
        let r = c.registration("zerolayer-worker", "worker-0", "10.1.2.3:7100").unwrap();
        assert_eq!((r.address.as_str(), r.port, r.id.as_str()), ("10.1.2.3", 7100, "worker-0"));
        assert_eq!(c.registration("s", "i", "0.0.0.0:7000").unwrap().address, "");
        assert_eq!(c.registration("s", "i", "[::1]:7000").unwrap().address, "::1");
        assert!(c.registration("s", "i", "7000").is_err());
    }
}
