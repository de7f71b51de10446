//! The Raft group's driver over real storage, one member: what a restarted member knows of the group the moment it
//! opens, before its task has stepped once.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::time::Duration;

use zl_orchestrator::raft::driver::{Group, GroupConfig, Start};
use zl_orchestrator::raft::{ReplicaConfig, SharedState};

fn config(data: &std::path::Path) -> GroupConfig {
    GroupConfig {
        id: 1,
        peers: BTreeMap::from([(1, "127.0.0.1:1".to_owned())]),
        start: Start::Peers,
        hold_messages: false,
        data_dir: data.to_owned(),
        tls_dir: data.join("no-tls"),
        node_id: "orch-0".into(),
        tick: Duration::from_millis(50),
        replica: ReplicaConfig::default(),
    }
}

/// A member restarted with its storage is a voter from the start: read before its first step (as `serve` does
/// right after opening), an empty status made every restart log "this node was removed from the group".
#[test]
fn a_restarted_member_is_a_voter_before_its_first_step() {
    let dir = tempfile::tempdir().unwrap();
    // The first run, ended with its runtime (the process stops).
    let first = tokio::runtime::Runtime::new().unwrap();
    first.block_on(async {
        let group = Group::start(config(dir.path()), SharedState::default()).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(group.status().leader, Some(1), "a single member leads");
    });
    first.shutdown_timeout(Duration::from_secs(2));
    let again = tokio::runtime::Runtime::new().unwrap();
    again.block_on(async {
        let group = Group::start(config(dir.path()), SharedState::default()).unwrap();
        assert!(group.votes(), "the restarted member's stored membership: {:?}", group.status());
        assert_eq!(group.status().voters, vec![1]);
    });
}
