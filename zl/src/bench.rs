//! `zl bench`: the load generator of `zl_loadgen`, with the running `zl up`'s URL, key, model, certificates and
//! first worker as defaults (see docs/benchmarks.md).

use anyhow::Result;
use zl_loadgen::cli::{BenchArgs, Defaults};

use crate::local::LocalCluster;

pub(crate) fn run(args: BenchArgs, data_dir: Option<&std::path::Path>) -> Result<()> {
    let local = LocalCluster::read(data_dir);
    let defaults = Defaults {
        url: local.field("http"),
        api_key: local.field("api_key"),
        model: local.field("model"),
        tls_dir: local.field("tls_dir").map(Into::into),
        worker: local.first_worker(),
        missing: local.missing("it"),
        // Results and plots go to the data dir, never the working directory, unless --out says otherwise.
        bench_dir: data_dir.map_or_else(crate::up::default_data_dir, std::path::Path::to_path_buf).join("bench"),
    };
    zl_loadgen::cli::main(args, defaults)
}
