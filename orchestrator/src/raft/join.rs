//! The joining node's side of membership that follows the deployment (`--raft-auto-join`; the leader's side is
//! `membership.rs`, answered by `service.rs`'s `Join`): where a node with empty storage starts ([`plan`]), and the
//! loop that asks the leader, one step at a time, until this node votes ([`Group::keep_joining`]).
//!
//! Only the first listed peer (the lowest Raft id: a StatefulSet's ordinal 0) ever starts a group, and only when
//! no listed peer belongs to one; every other node, and the first one when a group already runs (its volume was
//! lost), joins. So a fresh install, a scale-up and a lost volume all take the same path, and no two nodes ever
//! start two groups from one list.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use zl_wire::message::Role;

use super::driver::{Group, Start};
use super::pb::raft_peer_client::RaftPeerClient;
use super::pb::{JoinReply, JoinRequest};

/// Between two rounds of asking.
const ROUND: Duration = Duration::from_millis(500);
/// One call, connection included.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// One `Join` call to the orchestrator at admin address `addr`.
async fn call(addr: &str, tls_dir: &Path, node_id: &str, request: JoinRequest) -> Result<JoinReply, String> {
    let endpoint = zl_admin::endpoint(addr, tls_dir, Role::Orchestrator, node_id).map_err(|e| format!("{e:#}"))?;
    let ask = async {
        let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
        RaftPeerClient::new(channel).join(request).await.map(|r| r.into_inner()).map_err(|s| s.message().to_owned())
    };
    tokio::time::timeout(CALL_TIMEOUT, ask).await.map_err(|_| "no answer in time".to_owned())?
}

/// Whether `dir` holds any Raft storage (a hard state, a membership, a snapshot or a log segment: the files of
/// `storage.rs`): false for a node that never started, or whose volume was lost.
pub fn holds_storage(dir: &Path) -> bool {
    let segments = std::fs::read_dir(dir.join("log")).is_ok_and(|mut d| d.next().is_some());
    segments || ["hardstate", "confstate", "snapshot"].iter().any(|f| dir.join(f).exists())
}

/// Where node `id` (listed in `peers` with its own admin address) starts when its storage is empty.
pub async fn plan(id: u64, peers: &BTreeMap<u64, String>, tls_dir: &Path, node_id: &str) -> Start {
    if peers.keys().next() != Some(&id) {
        return Start::Join;
    }
    let address = peers.get(&id).cloned().unwrap_or_default();
    for (&peer, addr) in peers {
        if peer == id {
            continue;
        }
        let request = JoinRequest { id, address: address.clone(), fresh: true };
        if let Ok(reply) = call(addr, tls_dir, node_id, request).await
            && reply.has_group
        {
            tracing::warn!(peer, "storage empty but the group runs (a lost volume?): joining it again");
            return Start::Join;
        }
    }
    Start::Alone
}

impl Group {
    /// Ask the leader (found through the known members' addresses) to take this node one step further, every
    /// half second, until it votes. `address` is this node's admin address, as the others reach it.
    pub async fn keep_joining(self, address: String) {
        let mut leader: Option<String> = None;
        let mut said = String::new();
        loop {
            let status = self.status();
            if status.voters.contains(&status.id) {
                tracing::info!(raft_id = status.id, "joined the group as a voter");
                return;
            }
            let fresh = status.voters.is_empty() && status.learners.is_empty();
            let own = self.id;
            let others = self.addresses().into_iter().filter(|(id, _)| *id != own).map(|(_, a)| a);
            let targets: Vec<String> = leader.take().into_iter().chain(others).collect();
            for addr in targets {
                let request = JoinRequest { id: own, address: address.clone(), fresh };
                let Ok(reply) = call(&addr, &self.tls_dir, &self.node_id, request).await else { continue };
                if reply.leader_address.is_empty() {
                    continue;
                }
                if reply.leader_address != addr {
                    leader = Some(reply.leader_address);
                    break;
                }
                // Admitted (any old voter place of this id removed first): the leader's messages now address this
                // node's empty log.
                if reply.admitted {
                    self.accepting.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                if reply.detail != said {
                    tracing::info!(leader = reply.leader_id, detail = %reply.detail, "joining the group");
                    said = reply.detail;
                }
                leader = Some(addr);
                break;
            }
            tokio::time::sleep(ROUND).await;
        }
    }
}
