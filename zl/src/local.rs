//! The cluster `zl up` is running, as its `cluster.json` in the data dir describes it: what `zl chat` and `zl
//! admin` fall back on when no address, key or certificate is given. Explicit flags and `ZL_*` variables win.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

/// The admin certificate's node id `zl up` issues for itself (and for `zl admin` on the same machine).
pub(crate) const ADMIN_ID: &str = "zl-up";

/// A local cluster's `cluster.json`, or nothing where there is none (or it does not parse).
#[derive(Debug)]
pub(crate) struct LocalCluster {
    path: PathBuf,
    state: Value,
}

impl LocalCluster {
    /// Read `cluster.json` from `data_dir` (default: `zl up`'s default data dir).
    pub(crate) fn read(data_dir: Option<&Path>) -> LocalCluster {
        let dir = data_dir.map_or_else(crate::up::default_data_dir, Path::to_path_buf);
        let path = dir.join("cluster.json");
        let state = std::fs::read_to_string(&path).ok().and_then(|s| serde_json::from_str(&s).ok());
        LocalCluster { path, state: state.unwrap_or(Value::Null) }
    }

    /// `given`, or the cluster's string `field`; an error naming `flag` when neither exists.
    pub(crate) fn pick(&self, given: Option<&str>, field: &str, flag: &str) -> Result<String> {
        given.map(str::to_owned).or_else(|| self.field(field)).with_context(|| self.missing(flag))
    }

    /// The cluster's string `field`, if it has one.
    pub(crate) fn field(&self, field: &str) -> Option<String> {
        self.state[field].as_str().map(str::to_owned)
    }

    /// The first worker's QUIC address.
    pub(crate) fn first_worker(&self) -> Option<String> {
        self.state["workers"][0]["quic"].as_str().map(str::to_owned)
    }

    /// The orchestrators' admin API addresses, in the order `zl up` started them.
    pub(crate) fn admin_addrs(&self) -> Vec<SocketAddr> {
        let orchestrators = self.state["orchestrators"].as_array().map(Vec::as_slice).unwrap_or_default();
        orchestrators.iter().filter_map(|o| o["admin"].as_str()?.parse().ok()).collect()
    }

    /// The error for a setting that is neither given nor in `cluster.json`.
    pub(crate) fn missing(&self, flag: &str) -> String {
        format!(
            "no {flag}: pass it, or start a cluster with `zl up` (its {} was not found; a cluster in another data \
             dir: --data-dir DIR or ZL_DATA_DIR=DIR)",
            self.path.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_and_the_file_fills_in() {
        let dir = tempfile::tempdir().unwrap();
        let state = r#"{"http": "http://127.0.0.1:8080", "tls_dir": "/x/certs",
            "orchestrators": [{"admin": "127.0.0.1:7001"}, {"admin": "bad"}, {"admin": "127.0.0.1:7011"}]}"#;
        std::fs::write(dir.path().join("cluster.json"), state).unwrap();
        let local = LocalCluster::read(Some(dir.path()));
        assert_eq!(local.pick(None, "http", "--url").unwrap(), "http://127.0.0.1:8080");
        assert_eq!(local.pick(Some("http://other"), "http", "--url").unwrap(), "http://other");
        assert_eq!(local.admin_addrs(), vec!["127.0.0.1:7001".parse().unwrap(), "127.0.0.1:7011".parse().unwrap()]);
        let err = local.pick(None, "api_key", "--api-key").unwrap_err().to_string();
        assert!(err.contains("--api-key") && err.contains("cluster.json"), "{err}");
        let none = LocalCluster::read(Some(&dir.path().join("absent")));
        assert!(none.admin_addrs().is_empty());
        assert_eq!(none.first_worker(), None);
    }
}
