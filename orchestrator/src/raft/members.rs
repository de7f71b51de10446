//! Which orchestrator each Raft member is. Every member binds its Raft id to its certificate's node id in the
//! replicated state once it votes ([`Group::bind_self`]); from then on the peer service takes a member's
//! messages, proposals and joins only from the orchestrator certificate that member bound ([`check_speaker`]),
//! so one orchestrator's key cannot speak for another member of the group. An id not bound yet (a group still
//! forming, a member joining) is taken from any orchestrator certificate, as before.

use std::time::Duration;

use zl_wire::message::Role;

use super::driver::Group;
use super::inbox::CommitError;
use crate::state::{Command, CommandError, RoutingState};

/// The orchestrator node id the client certificate of `request` names.
#[allow(clippy::result_large_err)]
pub(super) fn speaker<T>(request: &tonic::Request<T>) -> Result<String, tonic::Status> {
    zl_admin::require_role(request, Role::Orchestrator)?;
    let cert = request.peer_certs().and_then(|c| c.first().cloned());
    cert.and_then(|c| zl_tls::node_ids(&c, Role::Orchestrator).into_iter().next())
        .ok_or_else(|| tonic::Status::permission_denied("the certificate names no orchestrator"))
}

/// Whether orchestrator `node` may speak as Raft member `raft_id`: the member bound to that id, or (while the id is
/// not bound) any orchestrator that is not bound to another id.
#[allow(clippy::result_large_err)]
pub(super) fn check_speaker(state: &RoutingState, raft_id: u64, node: &str) -> Result<(), tonic::Status> {
    let members = state.members();
    match members.get(&raft_id) {
        Some(bound) if bound != node => {
            metrics::counter!("zl_raft_impostors_total").increment(1);
            tracing::error!(raft_id, bound = %bound, speaker = node, "a Raft message for another member's id refused");
            Err(tonic::Status::permission_denied(format!(
                "Raft id {raft_id} is orchestrator {bound}; {node} may not speak for it"
            )))
        }
        Some(_) => Ok(()),
        None => match members.iter().find(|(_, n)| n.as_str() == node) {
            Some((own, _)) => {
                Err(tonic::Status::permission_denied(format!("orchestrator {node} is Raft id {own}, not {raft_id}")))
            }
            None => Ok(()),
        },
    }
}

impl Group {
    /// Bind this member's Raft id to its node id in the replicated state, once it votes and a leader answers
    /// (retried every second until then). A binding to another node is logged as an error and left alone: two
    /// orchestrators configured with one Raft id.
    pub async fn bind_self(self) {
        let cmd = Command::BindMember { raft_id: self.id, node_id: self.node_id.clone() };
        loop {
            let bound = self.state.0.read().map(|s| s.members().get(&self.id).cloned()).unwrap_or(None);
            if bound.as_deref() == Some(self.node_id.as_str()) {
                return;
            }
            if self.votes() && self.status().leader.is_some() {
                match self.commit(&cmd).await {
                    Ok(_) => {
                        tracing::info!(raft_id = self.id, node = %self.node_id, "Raft id bound to this orchestrator");
                        return;
                    }
                    Err(CommitError::Command(CommandError::Exists(why))) => {
                        tracing::error!(raft_id = self.id, node = %self.node_id, %why, "Raft id bound to another orchestrator");
                        return;
                    }
                    Err(e) => tracing::debug!(error = %e, "binding the Raft id: retrying"),
                }
            }
            if !self.alive() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_member_speaks_only_through_its_own_certificate() {
        let mut s = RoutingState::default();
        s.apply(1, &Command::BindMember { raft_id: 1, node_id: "orch-0".into() }).unwrap();
        s.apply(2, &Command::BindMember { raft_id: 2, node_id: "orch-1".into() }).unwrap();
        check_speaker(&s, 1, "orch-0").unwrap();
        assert!(check_speaker(&s, 1, "orch-1").is_err(), "orch-1 speaking as member 1");
        assert!(check_speaker(&s, 3, "orch-1").is_err(), "orch-1 is member 2");
        check_speaker(&s, 3, "orch-2").unwrap();
        // Neither an id nor a node binds twice; the same binding again is no change.
        assert!(s.apply(3, &Command::BindMember { raft_id: 1, node_id: "orch-2".into() }).is_err());
        assert!(s.apply(4, &Command::BindMember { raft_id: 3, node_id: "orch-0".into() }).is_err());
        s.apply(5, &Command::BindMember { raft_id: 1, node_id: "orch-0".into() }).unwrap();
        assert_eq!(RoutingState::restore(&s.snapshot()).unwrap().members().len(), 2);
    }
}
