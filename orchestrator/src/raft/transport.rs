//! The Raft group's outgoing transport: one task per peer sends its messages over gRPC (`schemas/raft.proto`,
//! mutual TLS, orchestrator certificates only) and reports each send back to the Raft task. It stands outside the
//! Raft loop, as raft-rs's `five_mem_node` example keeps its mailboxes: it knows the task's [`Input`] and nothing
//! of the driver. Messages coming in are the peer service's (`service.rs`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use raft::eraftpb::{Message, MessageType};
use tokio::sync::mpsc;
use zl_common::sync::write;
use zl_wire::message::Role;

use super::inbox::{Input, PEER_QUEUE};
use super::pb::RaftBatch;
use super::pb::raft_peer_client::RaftPeerClient;
use super::peers::peer_address;

/// Messages sent to a peer in one call, at most.
const PEER_BATCH: usize = 256;

/// What a peer connection needs.
#[derive(Clone, Debug)]
pub(super) struct Dialer {
    pub(super) from: u64,
    pub(super) tls_dir: PathBuf,
    pub(super) node_id: String,
    pub(super) report: mpsc::Sender<Input>,
}

/// The peers' connections, changed when membership changes are applied.
pub(super) struct Transport {
    pub(super) dialer: Dialer,
    pub(super) senders: HashMap<u64, mpsc::Sender<Message>>,
    pub(super) peers: Arc<RwLock<BTreeMap<u64, String>>>,
}

impl Transport {
    pub(super) fn member_added(&mut self, node: u64, address: &[u8]) {
        let parsed = std::str::from_utf8(address).ok().and_then(|a| peer_address(a).ok());
        let mut peers = write(&self.peers);
        if let Some(addr) = parsed {
            peers.insert(node, addr);
        }
        if node != self.dialer.from
            && !self.senders.contains_key(&node)
            && let Some(addr) = peers.get(&node)
        {
            self.senders.insert(node, spawn_peer(&self.dialer, node, addr));
        }
    }

    pub(super) fn member_removed(&mut self, node: u64) {
        // Dropping the queue ends the peer's task.
        self.senders.remove(&node);
        write(&self.peers).remove(&node);
    }
}

pub(super) fn spawn_peer(dialer: &Dialer, peer: u64, addr: &str) -> mpsc::Sender<Message> {
    let (tx, mut rx) = mpsc::channel::<Message>(PEER_QUEUE);
    // Built from the certificate files as they are now: after a failed send it is built again, so a rotated
    // certificate is presented on the next connection.
    let (addr, tls_dir, node_id) = (addr.to_owned(), dialer.tls_dir.clone(), dialer.node_id.clone());
    let connect = move || {
        zl_admin::endpoint(&addr, &tls_dir, Role::Orchestrator, &node_id).map(|e| {
            RaftPeerClient::new(
                e.timeout(Duration::from_secs(2)).connect_timeout(Duration::from_millis(500)).connect_lazy(),
            )
        })
    };
    let (from, report) = (dialer.from, dialer.report.clone());
    tokio::spawn(async move {
        let mut client = match connect() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(peer, error = %format!("{e:#}"), "cannot set up the Raft connection");
                return;
            }
        };
        let mut batch = Vec::new();
        while let Some(first) = rx.recv().await {
            batch.clear();
            batch.push(first);
            while batch.len() < PEER_BATCH {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            let snapshots: Vec<u64> =
                batch.iter().filter(|m| m.get_msg_type() == MessageType::MsgSnapshot).map(|m| m.to).collect();
            let messages =
                batch.iter().map(|m| protobuf::Message::write_to_bytes(m).unwrap_or_default()).collect::<Vec<_>>();
            let ok = client.send(RaftBatch { from, messages }).await.is_ok();
            if !ok {
                metrics::counter!("zl_raft_send_failures_total", "peer" => peer.to_string()).increment(1);
                if let Ok(c) = connect() {
                    client = c;
                }
            }
            for _ in &snapshots {
                let _ = report.send(Input::Sent { to: peer, snapshot: Some(ok), unreachable: !ok }).await;
            }
            if !ok && snapshots.is_empty() {
                let _ = report.send(Input::Sent { to: peer, snapshot: None, unreachable: true }).await;
            }
        }
    });
    tx
}
