//! What the Raft task takes in ([`Input`]: proposals, reads, membership changes, peers' messages, send reports)
//! and what a write gets back ([`CommitError`]). A leaf: the driver, the transport and the peer service all speak
//! it, none of them through another.

use std::time::Duration;

use raft::eraftpb::Message;
use tokio::sync::oneshot;

use super::membership::{Admission, Change};
use crate::state::{Command, CommandError};

/// How long a write waits for a majority before it fails.
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);
/// Messages queued per peer before new ones are dropped (Raft resends what matters).
pub(super) const PEER_QUEUE: usize = 4096;

/// Why a write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The state machine rejected the command (on this node, or on the leader it was forwarded to).
    #[error(transparent)]
    Command(#[from] CommandError),
    /// The leader rejected it with this status (forwarded writes).
    #[error("{}", .0.message())]
    Remote(tonic::Status),
    /// No leader or no majority answered in time; the command may still commit later.
    #[error("the orchestrator group cannot commit now: {0}")]
    Unavailable(String),
    /// The command was certainly not appended (no leader, or the node asked was not it): safe to send again.
    #[error("the orchestrator group cannot commit now: {0}")]
    NotAccepted(String),
}

/// The gRPC status a rejected command gets: on the admin API, and when a follower forwarded it to the leader.
pub fn command_status(e: &CommandError) -> tonic::Status {
    match e {
        CommandError::NotFound(_) => tonic::Status::not_found(e.to_string()),
        CommandError::Exists(_) => tonic::Status::already_exists(e.to_string()),
        CommandError::Invalid { .. } => tonic::Status::invalid_argument(e.to_string()),
        CommandError::Limit(_) => tonic::Status::resource_exhausted(e.to_string()),
    }
}

/// One thing for the Raft task to handle.
pub(super) enum Input {
    Propose {
        cmd: Command,
        reply: oneshot::Sender<Result<u64, CommitError>>,
    },
    ReadIndex {
        reply: oneshot::Sender<u64>,
    },
    Membership {
        node: u64,
        change: Change,
        address: Vec<u8>,
        reply: oneshot::Sender<Result<u64, CommitError>>,
    },
    /// A node asks to join (`join.rs`): the leader's next step for it and whether that step admits it
    /// ([`Admission::admits`]; false when the step could not be proposed), or `Err(leader)` when this node does
    /// not lead.
    Admit {
        node: u64,
        address: Vec<u8>,
        fresh: bool,
        reply: oneshot::Sender<Result<(Admission, bool), Option<u64>>>,
    },
    /// Hand leadership to this voter (`None`: the best placed one, [`super::replica::Replica::successor`]); the
    /// reply names it (`None` when this node does not lead or votes alone).
    Transfer {
        to: Option<u64>,
        reply: oneshot::Sender<Option<u64>>,
    },
    Messages(Vec<Message>),
    Sent {
        to: u64,
        snapshot: Option<bool>,
        unreachable: bool,
    },
}
