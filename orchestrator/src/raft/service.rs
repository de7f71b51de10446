//! The Raft peer service (`schemas/raft.proto`): takes peers' messages and forwarded proposals in, from
//! orchestrator certificates only. Every message from a peer is size-limited and decoded by [`decode_message`]
//! before the replica sees it.

use std::time::Instant;

use super::driver::Group;
use super::inbox::{COMMIT_TIMEOUT, CommitError, Input, command_status};
use super::members::{check_speaker, speaker};
use super::membership::Admission;
use super::pb::raft_peer_server::{RaftPeer, RaftPeerServer};
use super::pb::{JoinReply, JoinRequest, ProposeReply, ProposeRequest, RaftAck, RaftBatch};
use super::peers::peer_address;
use super::replica::{MAX_MESSAGE_BYTES, decode_message};
use crate::state::Command;

impl Group {
    /// The gRPC service peers call.
    pub fn service(&self) -> RaftPeerServer<PeerService> {
        RaftPeerServer::new(PeerService { group: self.clone() }).max_decoding_message_size(MAX_MESSAGE_BYTES + 1024)
    }
}

/// `schemas/raft.proto`'s service.
#[derive(Debug)]
pub struct PeerService {
    group: Group,
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn send(&self, request: tonic::Request<RaftBatch>) -> Result<tonic::Response<RaftAck>, tonic::Status> {
        let node = speaker(&request)?;
        let batch = request.into_inner();
        check_speaker(
            &self.group.state.0.read().unwrap_or_else(std::sync::PoisonError::into_inner),
            batch.from,
            &node,
        )?;
        if !self.group.accepting.load(std::sync::atomic::Ordering::Relaxed) {
            // Not a member yet (joining with empty storage): what the leader sends to the place this id had is
            // dropped, and resent once it joins.
            return Ok(tonic::Response::new(RaftAck {}));
        }
        let mut messages = Vec::with_capacity(batch.messages.len());
        for bytes in &batch.messages {
            let m = decode_message(bytes).map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
            if m.from != batch.from {
                return Err(tonic::Status::invalid_argument("a batch carries another node's messages"));
            }
            messages.push(m);
        }
        self.group
            .tx
            .send(Input::Messages(messages))
            .await
            .map_err(|_| tonic::Status::unavailable("the Raft task stopped"))?;
        Ok(tonic::Response::new(RaftAck {}))
    }

    async fn propose(
        &self,
        request: tonic::Request<ProposeRequest>,
    ) -> Result<tonic::Response<ProposeReply>, tonic::Status> {
        let node = speaker(&request)?;
        let cmd: Command = serde_json::from_slice(&request.into_inner().command)
            .map_err(|e| tonic::Status::invalid_argument(format!("undecodable command: {e}")))?;
        // A member binds only itself.
        if let Command::BindMember { node_id, .. } = &cmd
            && *node_id != node
        {
            return Err(tonic::Status::permission_denied(format!("{node} may not bind {node_id}'s Raft id")));
        }
        match self.group.propose_here(&cmd, Instant::now() + COMMIT_TIMEOUT).await {
            Ok(index) => Ok(tonic::Response::new(ProposeReply { index })),
            Err(CommitError::Command(e)) => Err(command_status(&e)),
            Err(CommitError::Remote(s)) => Err(s),
            Err(CommitError::NotAccepted(why)) => Err(tonic::Status::failed_precondition(why)),
            Err(CommitError::Unavailable(why)) => Err(tonic::Status::unavailable(why)),
        }
    }

    async fn join(&self, request: tonic::Request<JoinRequest>) -> Result<tonic::Response<JoinReply>, tonic::Status> {
        let node = speaker(&request)?;
        let r = request.into_inner();
        check_speaker(&self.group.state.0.read().unwrap_or_else(std::sync::PoisonError::into_inner), r.id, &node)?;
        if r.id == 0 {
            return Err(tonic::Status::invalid_argument("Raft ids start at 1"));
        }
        let address = peer_address(&r.address)
            .map_err(|e| tonic::Status::invalid_argument(format!("address {:?}: {e}", r.address)))?;
        let status = self.group.status();
        let known = |id: u64| self.group.addresses().get(&id).cloned().unwrap_or_default();
        let mut reply = JoinReply { has_group: !status.voters.is_empty(), ..JoinReply::default() };
        match self.group.admit(r.id, &address, r.fresh).await {
            Ok(Ok((step, admitted))) => {
                (reply.leader_id, reply.leader_address) = (status.id, known(status.id));
                reply.voter = step == Admission::Voter;
                reply.admitted = admitted;
                reply.detail = match step {
                    Admission::Voter => "a voter".to_owned(),
                    Admission::Propose(change) => format!("proposed: {change:?}"),
                    Admission::Wait(why) => why,
                };
            }
            Ok(Err(leader)) => {
                let leader = leader.unwrap_or(0);
                (reply.leader_id, reply.leader_address) =
                    (leader, if leader == 0 { String::new() } else { known(leader) });
                reply.detail = "not the leader".to_owned();
            }
            Err(e) => return Err(tonic::Status::unavailable(e.to_string())),
        }
        Ok(tonic::Response::new(reply))
    }
}
