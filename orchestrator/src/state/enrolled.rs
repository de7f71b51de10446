//! The nodes that enrolled for a certificate of their own (`zl_tls::enroll`): which key each node id's
//! certificate certifies, and until when. A bootstrap credential may only enroll a node id that is not here (and
//! is no registered worker or reporting frontend): one stolen bootstrap credential cannot take over a running
//! node. A node renews with its own certificate. Records of expired certificates are dropped as commands arrive
//! (their certificates no longer work), so pods that come and go do not grow the state without bound.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::command::{CommandError, EnrollEntry, check_sha};

/// Enrollments kept at once (live certificates of nodes that enrolled).
pub const MAX_ENROLLED: usize = 65_536;

/// One enrolled node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enrollment {
    /// SHA-256 (hex) of the public key its current certificate certifies.
    pub key_sha256: String,
    /// When its current certificate expires (Unix ms).
    pub not_after_ms: u64,
    /// When it first enrolled (Unix ms, the proposer's clock).
    pub enrolled_ms: u64,
    /// How many times it renewed.
    pub renewals: u32,
}

/// The enrolled nodes, by `role/node_id`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enrolled {
    nodes: BTreeMap<String, Enrollment>,
    /// Every node that ever ran here (a worker that registered, a frontend that reported), by `role/node_id`,
    /// with the log index it was last seen at: a bootstrap credential may never claim one of these ids, even while
    /// the node is restarting or between its registrations, until an operator forgets it. The oldest go first
    /// past [`MAX_ENROLLED`].
    #[serde(default)]
    seen: BTreeMap<String, u64>,
}

fn key(role: &str, node_id: &str) -> String {
    format!("{role}/{node_id}")
}

impl Enrolled {
    /// Apply an enrollment. `taken`: the node id already speaks in the cluster (a registered worker, a frontend
    /// with a committed audit head) without having enrolled, so a bootstrap credential may not claim it.
    pub fn apply(&mut self, e: &EnrollEntry, taken: bool) -> Result<(), CommandError> {
        if !matches!(e.role.as_str(), "worker" | "frontend") {
            return Err(super::command::invalid("role", format!("{:?} nodes are not enrolled", e.role)));
        }
        check_sha("key_sha256", &e.key_sha256)?;
        self.nodes.retain(|_, n| n.not_after_ms > e.at_ms);
        let k = key(&e.role, &e.node_id);
        match (self.nodes.get_mut(&k), e.renewal) {
            (Some(_), false) => Err(CommandError::Exists(format!(
                "{k} (enrolled already: a bootstrap credential only enrolls new node ids; the node renews with its own certificate)"
            ))),
            (None, false) if taken => {
                Err(CommandError::Exists(format!("{k} (a node with this id is in the cluster already)")))
            }
            (Some(n), true) => {
                n.key_sha256.clone_from(&e.key_sha256);
                n.not_after_ms = e.not_after_ms;
                n.renewals = n.renewals.saturating_add(1);
                Ok(())
            }
            // A first enrollment, or a node with a certificate from `zl certs issue` (never enrolled) renewing
            // through an orchestrator.
            (None, renewal) => {
                if self.nodes.len() >= MAX_ENROLLED {
                    return Err(CommandError::Limit("enrolled nodes"));
                }
                let n = Enrollment {
                    key_sha256: e.key_sha256.clone(),
                    not_after_ms: e.not_after_ms,
                    enrolled_ms: e.at_ms,
                    renewals: u32::from(renewal),
                };
                self.nodes.insert(k, n);
                Ok(())
            }
        }
    }

    /// `role/node_id` ran in the cluster (at log `index`).
    pub fn saw(&mut self, role: &str, node_id: &str, index: u64) {
        let k = key(role, node_id);
        if !self.seen.contains_key(&k)
            && self.seen.len() >= MAX_ENROLLED
            && let Some(oldest) = self.seen.iter().min_by_key(|(_, i)| **i).map(|(k, _)| k.clone())
        {
            self.seen.remove(&oldest);
        }
        self.seen.insert(k, index);
    }

    /// Whether `role/node_id` ever ran in the cluster (and was not forgotten since).
    pub fn seen(&self, role: &str, node_id: &str) -> bool {
        self.seen.contains_key(&key(role, node_id))
    }

    /// Forget `role/node_id`'s enrollment and that it ran; an error when there is neither to forget.
    pub fn forget(&mut self, role: &str, node_id: &str) -> Result<(), CommandError> {
        let k = key(role, node_id);
        let (enrolled, seen) = (self.nodes.remove(&k).is_some(), self.seen.remove(&k).is_some());
        if enrolled || seen { Ok(()) } else { Err(CommandError::NotFound(format!("node {k}"))) }
    }

    /// The enrollment of `role/node_id`, if live.
    pub fn get(&self, role: &str, node_id: &str) -> Option<&Enrollment> {
        self.nodes.get(&key(role, node_id))
    }

    /// Enrolled nodes held.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, at_ms: u64, renewal: bool) -> EnrollEntry {
        EnrollEntry {
            role: "worker".into(),
            node_id: id.into(),
            key_sha256: "ab".repeat(32),
            not_after_ms: at_ms + 1000,
            at_ms,
            renewal,
        }
    }

    #[test]
    fn a_bootstrap_credential_enrolls_each_id_once() {
        let mut e = Enrolled::default();
        e.apply(&entry("w-1", 10, false), false).unwrap();
        let again = e.apply(&entry("w-1", 20, false), false).unwrap_err();
        assert!(matches!(again, CommandError::Exists(_)), "{again}");
        // A running node that never enrolled is not up for grabs either.
        assert!(matches!(e.apply(&entry("w-2", 20, false), true), Err(CommandError::Exists(_))));
        // The node itself renews.
        e.apply(&entry("w-1", 30, true), false).unwrap();
        assert_eq!(e.get("worker", "w-1").unwrap().renewals, 1);
        assert_eq!(e.get("worker", "w-1").unwrap().not_after_ms, 1030);
        let mut bad = entry("w-3", 40, false);
        bad.role = "orchestrator".into();
        assert!(e.apply(&bad, false).is_err());
    }

    #[test]
    fn expired_enrollments_are_dropped() {
        let mut e = Enrolled::default();
        e.apply(&entry("w-1", 10, false), false).unwrap();
        e.apply(&entry("w-2", 500, false), false).unwrap();
        assert_eq!(e.len(), 2);
        // w-1's certificate expired at 1010: its record goes, and the id may be enrolled again.
        e.apply(&entry("w-1", 2000, false), false).unwrap();
        assert_eq!(e.len(), 1, "w-2 expired at 1500 too");
        assert_eq!(e.get("worker", "w-1").unwrap().enrolled_ms, 2000);
    }
}
