//! `--region`: the region every tier belongs to (docs/regions.md). One Raft group per region, so a worker's region
//! is the group it registers with (the QUIC registration carries none); it is published in Consul (Meta `region`,
//! tag `region=NAME`); frontends answer with it (`x-zl-region`).

use anyhow::{Result, bail};
use clap::Args;

/// The region setting every tier binary flattens into its `serve` arguments.
#[derive(Args, Debug, Clone)]
pub struct RegionArgs {
    /// The region this node serves in (a-z, 0-9, '-', '_', '.'): a failure and latency domain with its own
    /// orchestrator group.
    #[arg(long, env = "ZL_REGION", default_value = zl_common::region::DEFAULT_REGION)]
    pub region: String,
}

impl RegionArgs {
    /// The setting's check.
    pub fn check(&self) -> Result<()> {
        if let Some(problem) = zl_common::region::region_problem(&self.region) {
            bail!("--region: {problem}");
        }
        Ok(())
    }
}
