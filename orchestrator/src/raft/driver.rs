//! The async driver of the Raft group: one task owns this orchestrator's [`Replica`] (ticks, steps, proposals,
//! ready) and pumps it; its peers' messages go out through `transport.rs` and come in through `service.rs`, both
//! by way of the task's inbox (`inbox.rs`). [`Group::commit`] proposes a command here or forwards it to the
//! leader, then waits until this node has applied it (a writer reads its own write on the node it asked).
//!
//! Route decisions read the local replicated state ([`SharedState`]) without asking the leader: a follower is
//! behind the leader by at most the time a heartbeat takes to arrive (one tick, 50 ms by default), and a node cut
//! off from the leader serves its last state until it rejoins. Writes need a majority: with one of three
//! orchestrators left they fail with [`CommitError::Unavailable`] after the commit timeout.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use raft::eraftpb::MessageType;
use tokio::sync::{mpsc, oneshot, watch};
use zl_common::sync::read;
use zl_wire::message::Role;

use super::inbox::{COMMIT_TIMEOUT, CommitError, Input, PEER_QUEUE};
use super::membership::{Admission, Change};
use super::pb::ProposeRequest;
use super::pb::raft_peer_client::RaftPeerClient;
use super::replica::{ConsensusError, ProposeError, Replica, ReplicaConfig, SharedState};
use super::transport::{Dialer, Transport, spawn_peer};
use crate::state::Command;

/// Where this node and its peers are.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// This node's Raft id.
    pub id: u64,
    /// Every member's Raft id and admin address (this node's included). A node with storage ignores this list's
    /// membership and uses the replicated one; what a new, empty node does is `start`'s.
    pub peers: BTreeMap<u64, String>,
    /// What a node with empty storage starts as.
    pub start: Start,
    /// Take no Raft message until the leader has made this node a learner of the group ([`Group::keep_joining`]
    /// opens the gate): a node that lost its storage still has a voter's place at the leader until it is removed,
    /// and the leader's messages to that place name a log and a commit index its empty log does not hold.
    pub hold_messages: bool,
    /// Storage directory.
    pub data_dir: PathBuf,
    /// `ca.pem` and this orchestrator's certificate.
    pub tls_dir: PathBuf,
    /// This orchestrator's node id (its certificate's name).
    pub node_id: String,
    /// Logical time step.
    pub tick: Duration,
    /// Raft tuning.
    pub replica: ReplicaConfig,
}

/// What a node with empty storage starts as (a node with storage resumes its group whatever this says).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Start {
    /// A new group of every listed peer (each started with the same list).
    #[default]
    Peers,
    /// A new group of this node alone; the others join it (`--raft-auto-join`'s first node).
    Alone,
    /// No group: wait for the leader to add this node (`--raft-join`, `--raft-auto-join`).
    Join,
}

/// The group as this node sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupStatus {
    /// This node's Raft id.
    pub id: u64,
    /// Current term.
    pub term: u64,
    /// The leader, when known.
    pub leader: Option<u64>,
    /// Highest committed index.
    pub commit: u64,
    /// Highest applied index.
    pub applied: u64,
    /// Voting members.
    pub voters: Vec<u64>,
    /// Learners (joining: they receive the log and vote once caught up).
    pub learners: Vec<u64>,
    /// Log bytes on disk.
    pub log_bytes: u64,
    /// Newest snapshot's index.
    pub snapshot_index: u64,
}

/// A handle on the running group; cheap to clone.
#[derive(Clone, Debug)]
pub struct Group {
    pub(super) id: u64,
    pub(super) tx: mpsc::Sender<Input>,
    status: watch::Receiver<GroupStatus>,
    /// Members' admin addresses: from the configuration, then from applied membership changes.
    peers: Arc<RwLock<BTreeMap<u64, String>>>,
    pub(super) tls_dir: PathBuf,
    pub(super) node_id: String,
    /// Whether peers' Raft messages are taken (see [`GroupConfig::hold_messages`]).
    pub(super) accepting: Arc<std::sync::atomic::AtomicBool>,
    /// The routing state the group applies to (the peer service checks members' bindings in it).
    pub(super) state: SharedState,
}

/// What the replica says of the group now.
fn status_of(replica: &Replica<SharedState>) -> GroupStatus {
    GroupStatus {
        id: replica.id(),
        term: replica.term(),
        leader: replica.leader(),
        commit: replica.commit_index(),
        applied: replica.applied_index(),
        voters: replica.voters(),
        learners: replica.learners(),
        log_bytes: replica.log_bytes(),
        snapshot_index: replica.snapshot_index(),
    }
}

impl Group {
    /// Whether the Raft task still runs (it stops for good when its storage fails): the orchestrator's liveness.
    pub fn alive(&self) -> bool {
        !self.tx.is_closed()
    }

    /// Open the replica on `config.data_dir`, applying to `state`, and start its tasks.
    pub fn start(config: GroupConfig, state: SharedState) -> Result<Group, ConsensusError> {
        let bootstrap: Vec<u64> = match config.start {
            Start::Peers => config.peers.keys().copied().collect(),
            Start::Alone => vec![config.id],
            Start::Join => Vec::new(),
        };
        let shared = state.clone();
        let mut replica = Replica::open_with(config.id, &config.data_dir, &bootstrap, config.replica, state)?;
        if replica.voters() == [config.id] {
            // Alone in the group: lead at once instead of after an election timeout.
            replica.campaign()?;
        }
        let (tx, rx) = mpsc::channel(PEER_QUEUE);
        // The status as stored from the start: a restarted member is a voter before its task's first step (read
        // as "removed from the group" otherwise, and logged so on every restart).
        let (status_tx, status) = watch::channel(status_of(&replica));
        let dialer = Dialer {
            from: config.id,
            tls_dir: config.tls_dir.clone(),
            node_id: config.node_id.clone(),
            report: tx.clone(),
        };
        let mut senders = HashMap::new();
        for (&peer, addr) in &config.peers {
            if peer != config.id {
                senders.insert(peer, spawn_peer(&dialer, peer, addr));
            }
        }
        let peers = Arc::new(RwLock::new(config.peers));
        let transport = Transport { dialer, senders, peers: peers.clone() };
        tokio::spawn(run(replica, rx, transport, status_tx, config.tick));
        let accepting = Arc::new(std::sync::atomic::AtomicBool::new(!config.hold_messages));
        Ok(Group {
            id: config.id,
            tx,
            status,
            peers,
            tls_dir: config.tls_dir,
            node_id: config.node_id,
            accepting,
            state: shared,
        })
    }

    /// The group as this node sees it now.
    pub fn status(&self) -> GroupStatus {
        self.status.borrow().clone()
    }

    /// Whether this node votes now (no copy of the status: asked on every route and sync).
    pub fn votes(&self) -> bool {
        self.status.borrow().voters.contains(&self.id)
    }

    /// Commit `cmd`: propose it here if this node leads, else forward it to the leader; then wait until this
    /// node has applied it. Returns its log index.
    pub async fn commit(&self, cmd: &Command) -> Result<u64, CommitError> {
        let deadline = Instant::now() + COMMIT_TIMEOUT;
        let started = Instant::now();
        let result = self.commit_by(cmd, deadline).await;
        metrics::histogram!("zl_raft_proposal_seconds").record(started.elapsed().as_secs_f64());
        result
    }

    async fn commit_by(&self, cmd: &Command, deadline: Instant) -> Result<u64, CommitError> {
        let now = self.status();
        if !now.voters.is_empty() && !now.voters.contains(&self.id) && !now.learners.contains(&self.id) {
            // Removed (scaled away): it hears from no leader any more; say so at once.
            return Err(CommitError::NotAccepted("this orchestrator was removed from its group: ask another".into()));
        }
        loop {
            let leader = self.status().leader;
            let attempt = match leader {
                Some(l) if l == self.id => self.propose_here(cmd, deadline).await,
                Some(l) => self.forward(l, cmd, deadline).await,
                None => Err(CommitError::NotAccepted("no leader".into())),
            };
            match attempt {
                Ok(index) => {
                    self.await_applied(index, deadline).await?;
                    return Ok(index);
                }
                // Leadership moved or is being decided, and the command was not taken: look again shortly, until
                // the deadline. (A command whose fate is unknown is never sent twice.)
                Err(CommitError::NotAccepted(why)) => {
                    if Instant::now() + Duration::from_millis(50) >= deadline {
                        return Err(CommitError::NotAccepted(why));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Send `input` (built around a reply sender) to the Raft task and wait for its answer until `until`.
    /// `Ok(None)`: no answer in time.
    async fn ask<T>(
        &self,
        input: impl FnOnce(oneshot::Sender<T>) -> Input,
        until: Instant,
    ) -> Result<Option<T>, CommitError> {
        let stopped = || CommitError::Unavailable("the Raft task stopped".into());
        let (reply, answer) = oneshot::channel();
        self.tx.send(input(reply)).await.map_err(|_| stopped())?;
        match tokio::time::timeout_at(until.into(), answer).await {
            Ok(Ok(answer)) => Ok(Some(answer)),
            Ok(Err(_)) => Err(stopped()),
            Err(_) => Ok(None),
        }
    }

    /// Propose on this node (it must lead) and wait for the command to apply here.
    pub async fn propose_here(&self, cmd: &Command, deadline: Instant) -> Result<u64, CommitError> {
        let cmd = cmd.clone();
        match self.ask(|reply| Input::Propose { cmd, reply }, deadline).await? {
            Some(result) => result,
            None => Err(CommitError::Unavailable("no majority answered in time".into())),
        }
    }

    /// Wait until this node's state reflects every write committed before the call (a ReadIndex round through
    /// the leader, then this node applying up to that index): what an admin read sees is then linearizable.
    pub async fn read_barrier(&self) -> Result<(), CommitError> {
        let deadline = Instant::now() + COMMIT_TIMEOUT;
        loop {
            // Without a leader the request goes unanswered; ask again until one answers or time runs out.
            let round = deadline.min(Instant::now() + Duration::from_millis(500));
            if let Some(index) = self.ask(|reply| Input::ReadIndex { reply }, round).await? {
                return self.await_applied(index, deadline).await;
            }
            if Instant::now() >= deadline {
                return Err(CommitError::Unavailable("no leader confirmed a read point in time".into()));
            }
        }
    }

    /// Members' admin addresses (`host:port`), as far as this node knows them.
    pub fn addresses(&self) -> BTreeMap<u64, String> {
        read(&self.peers).clone()
    }

    /// Add a voter at admin address `address`, or remove one (`address` `None`); this node must lead. Returns the
    /// change's log index once applied here.
    pub async fn change_membership(&self, node: u64, address: Option<String>) -> Result<u64, CommitError> {
        if node == 0 {
            return Err(CommitError::Unavailable("Raft ids start at 1".into()));
        }
        let change = if address.is_some() { Change::Voter } else { Change::Remove };
        let address = address.map(String::into_bytes).unwrap_or_default();
        let until = Instant::now() + COMMIT_TIMEOUT;
        match self.ask(|reply| Input::Membership { node, change, address, reply }, until).await? {
            Some(result) => result,
            None => Err(CommitError::Unavailable("no majority answered in time".into())),
        }
    }

    /// Hand leadership to voter `to`, or the best placed voter (`None`); this node must lead. Returns the voter
    /// it went to (`None`: this node does not lead, or votes alone).
    pub async fn transfer_leadership(&self, to: Option<u64>) -> Result<Option<u64>, CommitError> {
        let until = Instant::now() + Duration::from_secs(1);
        Ok(self.ask(|reply| Input::Transfer { to, reply }, until).await?.flatten())
    }

    /// Before a planned stop: if this node leads, hand leadership to the best placed voter and wait (up to `wait`)
    /// until another node leads, so writes wait for no election timeout (a rolling restart costs them nothing).
    pub async fn hand_over(&self, wait: Duration) {
        let Ok(Some(to)) = self.transfer_leadership(None).await else { return };
        tracing::info!(to, "stopping: leadership handed over");
        let mut status = self.status.clone();
        let me = self.id;
        let _ = tokio::time::timeout(wait, status.wait_for(|s| s.leader.is_some_and(|l| l != me))).await;
    }

    /// The leader's next step for node `node` asking to join from admin address `address` (`fresh`: it knows no
    /// membership at all) and whether it admits the node; `Err(leader)` when this node does not lead.
    pub async fn admit(
        &self,
        node: u64,
        address: &str,
        fresh: bool,
    ) -> Result<Result<(Admission, bool), Option<u64>>, CommitError> {
        let address = address.as_bytes().to_vec();
        let until = Instant::now() + Duration::from_secs(1);
        let answer = self.ask(|reply| Input::Admit { node, address, fresh, reply }, until).await?;
        answer.ok_or_else(|| CommitError::Unavailable("the Raft task did not answer in time".into()))
    }

    /// Whether this node votes and has applied everything the leader had committed when asked (a read point, as
    /// admin reads take one): what readiness means. `Err` says why not.
    pub async fn caught_up(&self) -> Result<String, String> {
        if !self.alive() {
            return Err("the Raft task stopped (storage failed): restart this orchestrator".to_owned());
        }
        let status = self.status();
        if !status.voters.contains(&status.id) {
            if status.learners.contains(&status.id) {
                return Err(format!("a learner catching up (applied {})", status.applied));
            }
            return Err(format!("not a member of the group (voters {:?}): waiting to be added", status.voters));
        }
        let Some(leader) = status.leader else { return Err(format!("no leader elected yet (term {})", status.term)) };
        let until = Instant::now() + Duration::from_secs(1);
        let point = match self.ask(|reply| Input::ReadIndex { reply }, until).await {
            Ok(Some(index)) => index,
            _ => return Err(format!("leader {leader} confirmed no read point within 1 s")),
        };
        let applied = self.status().applied;
        if applied < point {
            return Err(format!("catching up: applied {applied} of the leader's {point}"));
        }
        Ok(format!("raft id {}, leader {leader}, term {}, applied {applied}", status.id, status.term))
    }

    async fn forward(&self, leader: u64, cmd: &Command, deadline: Instant) -> Result<u64, CommitError> {
        let Some(addr) = self.addresses().get(&leader).cloned() else {
            return Err(CommitError::NotAccepted(format!("leader {leader} has no known address")));
        };
        let endpoint = zl_admin::endpoint(&addr, &self.tls_dir, Role::Orchestrator, &self.node_id)
            .map_err(|e| CommitError::Unavailable(format!("{e:#}")))?;
        let left = deadline.saturating_duration_since(Instant::now());
        // Nothing is sent until the connection stands: failing to connect leaves the command untaken.
        let channel = match tokio::time::timeout(left, endpoint.connect()).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => return Err(CommitError::NotAccepted(format!("leader {leader} unreachable: {e}"))),
            Err(_) => return Err(CommitError::NotAccepted(format!("leader {leader} unreachable in time"))),
        };
        let command = serde_json::to_vec(cmd).unwrap_or_default();
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, RaftPeerClient::new(channel).propose(ProposeRequest { command })).await {
            Err(_) => Err(CommitError::Unavailable(format!("leader {leader} did not answer in time"))),
            Ok(Ok(reply)) => Ok(reply.into_inner().index),
            // The leader says it was not taken (it no longer leads, or Raft dropped it).
            Ok(Err(status)) if status.code() == tonic::Code::FailedPrecondition => {
                Err(CommitError::NotAccepted(status.message().to_string()))
            }
            Ok(Err(status)) if matches!(status.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded) => {
                Err(CommitError::Unavailable(status.message().to_string()))
            }
            Ok(Err(status)) => Err(CommitError::Remote(status)),
        }
    }

    async fn await_applied(&self, index: u64, deadline: Instant) -> Result<(), CommitError> {
        let mut status = self.status.clone();
        let wait = status.wait_for(|s| s.applied >= index);
        match tokio::time::timeout_at(deadline.into(), wait).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(CommitError::Unavailable(format!("index {index} committed but not yet applied here"))),
        }
    }
}

fn proposal_context(id: u64, seq: u64) -> Vec<u8> {
    let mut c = id.to_le_bytes().to_vec();
    c.extend_from_slice(&seq.to_le_bytes());
    c
}

/// The sequence number in a context this node made with [`proposal_context`]; `None` for another node's.
fn own_sequence(id: u64, context: &[u8]) -> Option<u64> {
    let (node, seq) = context.split_at_checked(8)?;
    (node == id.to_le_bytes()).then_some(u64::from_le_bytes(seq.try_into().ok()?))
}

type Reply = oneshot::Sender<Result<u64, CommitError>>;

/// Callers waiting on the Raft task, by the sequence number in their proposal or read context.
#[derive(Default)]
struct Waiting {
    seq: u64,
    commits: HashMap<u64, Reply>,
    reads: HashMap<u64, oneshot::Sender<u64>>,
}

impl Waiting {
    fn next(&mut self, id: u64) -> (u64, Vec<u8>) {
        self.seq += 1;
        (self.seq, proposal_context(id, self.seq))
    }
}

async fn run(
    mut replica: Replica<SharedState>,
    mut rx: mpsc::Receiver<Input>,
    mut transport: Transport,
    status: watch::Sender<GroupStatus>,
    tick: Duration,
) {
    let id = replica.id();
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut waiting = Waiting::default();
    let mut last_term = 0;
    let (mut snapshot_index, mut snapshot_at) = (replica.snapshot_index(), Instant::now());
    loop {
        tokio::select! {
            _ = ticker.tick() => replica.tick(),
            input = rx.recv() => {
                let Some(input) = input else { return };
                let mut next = Some(input);
                // Take whatever else is queued, so one ready (one fsync) covers them all.
                while let Some(input) = next {
                    handle(&mut replica, input, &mut waiting);
                    next = rx.try_recv().ok();
                }
            }
        }
        let out = match replica.ready() {
            Ok(out) => out,
            Err(e) => {
                // Storage failed: this node can no longer take part safely. Stop the process's group; writes
                // answer Unavailable from now on, and the operator sees why.
                tracing::error!(error = %e, "Raft storage failed; this orchestrator leaves the group (liveness fails: restart it)");
                metrics::counter!("zl_raft_fatal_errors_total").increment(1);
                // It leads nothing now: a gauge left at 1 beside the real leader's would mislead every dashboard.
                metrics::gauge!("zl_raft_is_leader").set(0.0);
                metrics::gauge!("zl_raft_leader_id").set(0.0);
                metrics::gauge!("zl_raft_up").set(0.0);
                return;
            }
        };
        for (context, index) in out.read_states {
            if let Some(reply) = own_sequence(id, &context).and_then(|s| waiting.reads.remove(&s)) {
                let _ = reply.send(index);
            }
        }
        // Reads whose callers gave up (no leader answered) are forgotten.
        waiting.reads.retain(|_, r| !r.is_closed());
        for a in out.applied {
            match &a.membership {
                Some((node, true, address)) => transport.member_added(*node, address),
                Some((node, false, _)) => transport.member_removed(*node),
                None => {}
            }
            if let Some(reply) = own_sequence(id, &a.context).and_then(|s| waiting.commits.remove(&s)) {
                let _ = reply.send(a.result.map(|()| a.index).map_err(CommitError::from));
            }
        }
        for m in out.messages {
            if let Some(peer) = transport.senders.get(&m.to) {
                let (to, snapshot) = (m.to, m.get_msg_type() == MessageType::MsgSnapshot);
                if peer.try_send(m).is_err() {
                    metrics::counter!("zl_raft_dropped_messages_total", "peer" => to.to_string()).increment(1);
                    if snapshot {
                        replica.report_snapshot(to, false);
                    }
                    replica.report_unreachable(to);
                }
            }
        }
        let now = status_of(&replica);
        if now.term != last_term {
            if last_term != 0 {
                metrics::counter!("zl_raft_term_changes_total").increment(1);
            }
            last_term = now.term;
            // A proposal from an older term may never commit: its caller times out (COMMIT_TIMEOUT).
        }
        metrics::gauge!("zl_raft_up").set(1.0);
        metrics::gauge!("zl_raft_term").set(now.term as f64);
        metrics::gauge!("zl_raft_leader_id").set(now.leader.unwrap_or(0) as f64);
        metrics::gauge!("zl_raft_is_leader").set(if now.leader == Some(id) { 1.0 } else { 0.0 });
        metrics::gauge!("zl_raft_commit_index").set(now.commit as f64);
        metrics::gauge!("zl_raft_applied_index").set(now.applied as f64);
        metrics::gauge!("zl_raft_log_bytes").set(now.log_bytes as f64);
        metrics::gauge!("zl_raft_snapshot_index").set(now.snapshot_index as f64);
        if now.snapshot_index != snapshot_index {
            (snapshot_index, snapshot_at) = (now.snapshot_index, Instant::now());
        }
        metrics::gauge!("zl_raft_snapshot_age_seconds").set(snapshot_at.elapsed().as_secs_f64());
        metrics::gauge!("zl_raft_voters").set(now.voters.len() as f64);
        metrics::gauge!("zl_raft_learners").set(now.learners.len() as f64);
        status.send_if_modified(|s| {
            if *s == now {
                false
            } else {
                *s = now;
                true
            }
        });
    }
}

fn handle(replica: &mut Replica<SharedState>, input: Input, waiting: &mut Waiting) {
    match input {
        Input::Propose { cmd, reply } => {
            let (seq, context) = waiting.next(replica.id());
            match replica.propose(context, &cmd) {
                Ok(()) => {
                    waiting.commits.insert(seq, reply);
                }
                Err(ProposeError::NotLeader { leader }) => {
                    let _ = reply.send(Err(CommitError::NotAccepted(format!("not the leader (leader: {leader:?})"))));
                }
                Err(e) => {
                    let _ = reply.send(Err(CommitError::NotAccepted(e.to_string())));
                }
            }
        }
        Input::Membership { node, change, address, reply } => {
            let (seq, context) = waiting.next(replica.id());
            match replica.propose_membership(context, node, change, address) {
                Ok(()) => {
                    waiting.commits.insert(seq, reply);
                }
                Err(e) => {
                    let _ = reply.send(Err(CommitError::Unavailable(e.to_string())));
                }
            }
        }
        Input::Admit { node, address, fresh, reply } => {
            if !replica.is_leader() {
                let _ = reply.send(Err(replica.leader()));
                return;
            }
            // A change dropped (another one pending) is asked for again by the node.
            let (step, admits) = match replica.admit(node, fresh, address) {
                Ok(step) => {
                    let admits = step.admits();
                    (step, admits)
                }
                Err(e) => (Admission::Wait(e.to_string()), false),
            };
            if let Admission::Propose(change) = &step {
                tracing::info!(raft_id = node, ?change, "membership: a joining node's next step");
            }
            let _ = reply.send(Ok((step, admits)));
        }
        Input::Transfer { to, reply } => {
            let to = if replica.is_leader() { to.or_else(|| replica.successor()) } else { None };
            if let Some(to) = to {
                replica.transfer_leader(to);
            }
            let _ = reply.send(to);
        }
        Input::ReadIndex { reply } => {
            let (seq, context) = waiting.next(replica.id());
            replica.read_index(context);
            waiting.reads.insert(seq, reply);
        }
        Input::Messages(messages) => {
            for m in messages {
                if let Err(e) = replica.step(m) {
                    tracing::warn!(error = %e, "a Raft message was refused");
                }
            }
        }
        Input::Sent { to, snapshot, unreachable } => {
            if let Some(ok) = snapshot {
                replica.report_snapshot(to, ok);
            }
            if unreachable {
                replica.report_unreachable(to);
            }
        }
    }
}

/// The storage directory's default location under `data_dir`.
pub fn raft_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("raft")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn only_this_nodes_contexts_name_a_waiting_caller() {
        assert_eq!(own_sequence(3, &proposal_context(3, 42)), Some(42));
        assert_eq!(own_sequence(3, &proposal_context(4, 42)), None);
        assert_eq!(own_sequence(3, &proposal_context(3, 42)[..15]), None);
        assert_eq!(own_sequence(3, &[]), None);
        let mut w = Waiting::default();
        assert_eq!(w.next(3), (1, proposal_context(3, 1)));
        assert_eq!(w.next(3).0, 2);
    }
}
