//! What travels to and from a Consul agent, without the I/O: a service registration with its TTL check (`PUT
//! /v1/agent/service/register`), the healthy instances of a service (`GET /v1/health/service/NAME?passing`), and
//! the blocking-query index that a watch loop carries from one answer to the next.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::meta::{self, MetaError};

/// Service names of the three tiers.
pub const WORKER_SERVICE: &str = "zerolayer-worker";
/// The orchestrators' service name.
pub const ORCHESTRATOR_SERVICE: &str = "zerolayer-orchestrator";
/// The frontends' service name.
pub const FRONTEND_SERVICE: &str = "zerolayer-frontend";

/// The largest health answer a watch accepts (a 10,000-worker fleet with full Meta is about 10 MiB).
pub const MAX_HEALTH_BODY: usize = 32 << 20;

/// A service as a node registers it with its local agent, with a TTL check the node passes on a timer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// Service id: the node id (unique per agent).
    pub id: String,
    /// Service name ([`WORKER_SERVICE`], ...).
    pub name: String,
    /// Address other tiers dial.
    pub address: String,
    /// Port other tiers dial.
    pub port: u16,
    /// Tags (device class, region, model ids, ...).
    pub tags: Vec<String>,
    /// Meta, within Consul's limits.
    pub meta: BTreeMap<String, String>,
    /// The check's TTL: the node passes it more often than this.
    pub ttl: Duration,
    /// Consul removes the service once its check has been critical this long.
    pub deregister_after: Duration,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Body<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    name: &'a str,
    address: &'a str,
    port: u16,
    tags: &'a [String],
    meta: &'a BTreeMap<String, String>,
    check: Check,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Check {
    #[serde(rename = "CheckID")]
    check_id: String,
    name: String,
    #[serde(rename = "TTL")]
    ttl: String,
    deregister_critical_service_after: String,
    /// Registered passing: a node registers once it serves, and a re-registration (after the agent lost its
    /// state) must not take a serving node out of the passing answers until its next pass.
    status: &'static str,
}

impl Registration {
    /// The check's id (`service:ID`, as Consul names a service's own check); `PUT
    /// /v1/agent/check/update/CHECK` passes it.
    pub fn check_id(&self) -> String {
        format!("service:{}", self.id)
    }

    /// The JSON body of `PUT /v1/agent/service/register`; an error when the Meta breaks Consul's limits.
    pub fn body(&self) -> Result<Vec<u8>, MetaError> {
        meta::check(&self.meta)?;
        let body = Body {
            id: &self.id,
            name: &self.name,
            address: &self.address,
            port: self.port,
            tags: &self.tags,
            meta: &self.meta,
            check: Check {
                check_id: self.check_id(),
                name: format!("{} TTL", self.name),
                ttl: go_duration(self.ttl),
                deregister_critical_service_after: go_duration(self.deregister_after),
                status: "passing",
            },
        };
        serde_json::to_vec(&body).map_err(|e| MetaError(e.to_string()))
    }
}

/// A duration as Go's `time.ParseDuration` reads it, in whole milliseconds (at least 1 ms).
pub fn go_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

/// One instance of a service in a health answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// Service id.
    pub id: String,
    /// Address to dial (the service's, else its node's).
    pub address: String,
    /// Port to dial.
    pub port: u16,
    /// Tags.
    pub tags: Vec<String>,
    /// Meta.
    pub meta: BTreeMap<String, String>,
    /// Consul node the instance runs on.
    pub node: String,
    /// Every check of it (its own, its node's, maintenance) passes: what `?passing` keeps.
    pub passing: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Entry {
    node: Node,
    service: Service,
    #[serde(default)]
    checks: Option<Vec<CheckStatus>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CheckStatus {
    #[serde(default)]
    status: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Node {
    node: String,
    #[serde(default)]
    address: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Service {
    #[serde(rename = "ID")]
    id: String,
    #[serde(default)]
    address: String,
    #[serde(default)]
    port: u16,
    #[serde(default)]
    tags: Option<Vec<String>>,
    #[serde(default)]
    meta: Option<BTreeMap<String, String>>,
}

/// The instances in an answer of `GET /v1/health/service/NAME` (with or without `?passing`), in id order.
pub fn parse_health(body: &[u8]) -> Result<Vec<Instance>, MetaError> {
    if body.len() > MAX_HEALTH_BODY {
        return Err(MetaError(format!("a health answer of {} bytes, at most {MAX_HEALTH_BODY}", body.len())));
    }
    let entries: Vec<Entry> =
        serde_json::from_slice(body).map_err(|e| MetaError(format!("unreadable health answer: {e}")))?;
    let mut out: Vec<Instance> = entries
        .into_iter()
        .map(|e| Instance {
            address: if e.service.address.is_empty() { e.node.address } else { e.service.address },
            id: e.service.id,
            port: e.service.port,
            tags: e.service.tags.unwrap_or_default(),
            meta: e.service.meta.unwrap_or_default(),
            node: e.node.node,
            passing: e.checks.unwrap_or_default().iter().all(|c| c.status == "passing"),
        })
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// The index a blocking query waits on, carried from one answer to the next as Consul's documentation asks:
/// reset to 0 when it goes backwards (the agent's state was restored or it is another server), and never 0 after
/// an answer (a 0 would make the next query return at once, in a loop).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockingIndex(u64);

/// What an answer's `X-Consul-Index` means for the watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexChange {
    /// The first answer, or a newer index: the result may have changed.
    Advanced,
    /// The same index: the wait timed out with no change.
    Same,
    /// The index went backwards (or was missing or unreadable): start over with a full list.
    Reset,
}

impl BlockingIndex {
    /// The query parameters of the next request: `index=N&wait=Ws`, or none for the first (full) list.
    pub fn query(&self, wait: Duration) -> String {
        match self.0 {
            0 => String::new(),
            n => format!("index={n}&wait={}s", wait.as_secs().max(1)),
        }
    }

    /// Take an answer's `X-Consul-Index` header.
    pub fn update(&mut self, header: Option<&str>) -> IndexChange {
        let Some(new) = header.and_then(|h| h.trim().parse::<u64>().ok()) else {
            self.0 = 0;
            return IndexChange::Reset;
        };
        let change = match new.cmp(&self.0) {
            _ if self.0 == 0 => IndexChange::Advanced,
            std::cmp::Ordering::Greater => IndexChange::Advanced,
            std::cmp::Ordering::Equal => IndexChange::Same,
            std::cmp::Ordering::Less => IndexChange::Reset,
        };
        self.0 = if change == IndexChange::Reset { 0 } else { new.max(1) };
        change
    }

    /// Forget the index (after a lost connection: the next query is a full list, so no removal is missed).
    pub fn reset(&mut self) {
        self.0 = 0;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_is_the_body_consul_expects() {
        let r = Registration {
            id: "worker-0".into(),
            name: WORKER_SERVICE.into(),
            address: "10.0.0.5".into(),
            port: 7100,
            tags: vec!["cpu".into(), "model:smollm2".into()],
            meta: BTreeMap::from([("device".to_owned(), "cpu".to_owned())]),
            ttl: Duration::from_secs(5),
            deregister_after: Duration::from_secs(60),
        };
        let v: serde_json::Value = serde_json::from_slice(&r.body().unwrap()).unwrap();
        assert_eq!(v["ID"], "worker-0");
        assert_eq!(v["Name"], "zerolayer-worker");
        assert_eq!((v["Address"].as_str(), v["Port"].as_u64()), (Some("10.0.0.5"), Some(7100)));
        assert_eq!(v["Meta"]["device"], "cpu");
        assert_eq!(v["Check"]["CheckID"], "service:worker-0");
        assert_eq!(v["Check"]["TTL"], "5000ms");
        assert_eq!(v["Check"]["DeregisterCriticalServiceAfter"], "60000ms");
        assert_eq!(v["Check"]["Status"], "passing");
        let mut bad = r.clone();
        bad.meta.insert("consul-x".into(), String::new());
        assert!(bad.body().is_err());
    }

    #[test]
    fn health_answers_parse_with_the_node_address_as_fallback() {
        let body = br#"[
          {"Node": {"Node": "n2", "Address": "10.0.0.2"},
           "Service": {"ID": "worker-1", "Service": "zerolayer-worker", "Address": "", "Port": 7101,
                       "Tags": null, "Meta": null},
           "Checks": [{"CheckID": "serfHealth", "Status": "passing"}, {"CheckID": "service:worker-1", "Status": "critical"}]},
          {"Node": {"Node": "n1", "Address": "10.0.0.1"},
           "Service": {"ID": "worker-0", "Service": "zerolayer-worker", "Address": "192.168.1.9", "Port": 7100,
                       "Tags": ["cpu"], "Meta": {"device": "cpu"}},
           "Checks": [{"CheckID": "serfHealth", "Status": "passing"}, {"CheckID": "service:worker-0", "Status": "passing"}]}
        ]"#;
        let got = parse_health(body).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].id.as_str(), got[0].address.as_str(), got[0].port), ("worker-0", "192.168.1.9", 7100));
        assert_eq!(got[0].meta["device"], "cpu");
        assert_eq!((got[1].address.as_str(), got[1].tags.len(), got[1].node.as_str()), ("10.0.0.2", 0, "n2"));
        assert!(got[0].passing && !got[1].passing, "one critical check makes an instance not passing");
        assert!(parse_health(b"[]").unwrap().is_empty());
        assert!(parse_health(b"{\"not\": \"a list\"}").is_err());
        assert!(parse_health(&vec![b' '; MAX_HEALTH_BODY + 1]).is_err());
    }

    #[test]
    fn the_blocking_index_advances_resets_and_is_never_zero() {
        let mut ix = BlockingIndex::default();
        assert_eq!(ix.query(Duration::from_secs(30)), "");
        assert_eq!(ix.update(Some("42")), IndexChange::Advanced);
        assert_eq!(ix.query(Duration::from_secs(30)), "index=42&wait=30s");
        assert_eq!(ix.update(Some("42")), IndexChange::Same);
        assert_eq!(ix.update(Some("50")), IndexChange::Advanced);
        // Backwards (an agent restarted with a fresh state): a full list next.
        assert_eq!(ix.update(Some("3")), IndexChange::Reset);
        assert_eq!(ix.query(Duration::from_secs(30)), "");
        // A 0 after a full list becomes 1, so the next query blocks.
        assert_eq!(ix.update(Some("0")), IndexChange::Advanced);
        assert_eq!(ix.query(Duration::from_millis(10)), "index=1&wait=1s");
        assert_eq!(ix.update(None), IndexChange::Reset);
        assert_eq!(ix.update(Some("7")), IndexChange::Advanced);
        ix.reset();
        assert_eq!(ix.query(Duration::from_secs(5)), "");
    }
}
