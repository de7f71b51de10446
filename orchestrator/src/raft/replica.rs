//! The pure Raft replica: raft-rs (`raft` 0.7) over the durable [`DiskStorage`], with the routing state
//! ([`RoutingState`]) as the state machine. The async [`super::driver`] pumps it.
//!
//! [`Replica`] owns one node: `tick` on a timer, `step` for every message from a peer, `propose` a command (leader
//! only; followers answer [`ProposeError::NotLeader`] with the leader's id so the caller can forward), and `ready`
//! after any of them, which persists what Raft asks for (snapshot, entries, hard state, all fsynced) before
//! returning the messages to send and the commands applied, in log order. Nothing here reads a clock or a socket,
//! so the deterministic harness in this module's tests drives whole groups with injected time and a simulated
//! network.
//!
//! Entries are raft-rs `Entry` messages (protobuf) whose data is a JSON [`Command`]; empty entries are Raft's own
//! no-ops. Every `snapshot_every` applied entries the driver snapshots the routing state and compacts the log; a
//! follower too far behind receives that snapshot. Membership is the raft-rs `ConfState`, stored beside the hard
//! state whenever a configuration change is applied.

use std::path::Path;

use raft::eraftpb::{
    ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType, HardState as RaftHardState, Message,
    Snapshot as RaftSnapshot,
};
use raft::{Config, GetEntriesContext, RaftState, RawNode, StateRole, Storage};

use std::sync::{Arc, RwLock};
use zl_common::sync::{read, write};

use super::membership::{Admission, Change, View, admit};
use super::storage::{DiskStorage, HardState, LogEntry, Snapshot, StorageError};
use crate::state::{Command, CommandError, RoutingState};

/// Largest raft-rs message accepted from a peer, in bytes (protobuf 2.28 parses recursively: keep inputs bounded,
/// and accept them only from authenticated peers).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Tuning of one replica.
#[derive(Clone, Copy, Debug)]
pub struct ReplicaConfig {
    /// Ticks without a leader's heartbeat before a follower campaigns (randomised up to twice this).
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// Applied entries between snapshots (and log compactions).
    pub snapshot_every: u64,
    /// Log segment size on disk.
    pub segment_bytes: u64,
    /// Draw the randomised election timeouts from this seed instead of the thread's random generator, so that a
    /// harness replays the same schedule exactly. `None` (the default) in every real deployment, where each node
    /// must draw its own.
    pub election_seed: Option<u64>,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        // With the default 50 ms tick (`--raft-tick-ms`): heartbeats every 50 ms, an election 0.5-1 s after the leader
        // goes quiet.
        ReplicaConfig {
            election_ticks: 10,
            heartbeat_ticks: 1,
            snapshot_every: 1000,
            segment_bytes: 64 << 20,
            election_seed: None,
        }
    }
}

/// Consensus failures.
#[derive(Debug, thiserror::Error)]
pub enum ConsensusError {
    /// The durable storage failed; the replica must stop.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// raft-rs refused an operation.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// Bytes from disk or a peer that do not decode.
    #[error("undecodable {what}: {why}")]
    Decode {
        /// What was being decoded.
        what: &'static str,
        /// Why it failed.
        why: String,
    },
}

/// Why a proposal was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    /// This node is not the leader; `leader` is the one it knows of (`None` during an election).
    #[error("not the leader (leader: {leader:?})")]
    NotLeader {
        /// The current leader's id, when known.
        leader: Option<u64>,
    },
    /// The proposal was dropped by Raft (a leader transfer or a pending configuration change).
    #[error("proposal dropped: {0}")]
    Dropped(String),
}

/// A committed entry applied to the routing state.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// Log position.
    pub index: u64,
    /// What the proposer attached (a proposal id, for waking the caller).
    pub context: Vec<u8>,
    /// The command, `None` for a membership change.
    pub command: Option<Command>,
    /// A membership change: the node, whether it was added, and what its proposer attached (an address).
    pub membership: Option<(u64, bool, Vec<u8>)>,
    /// The command's outcome (a rejected command still takes its log position).
    pub result: Result<(), CommandError>,
}

/// What one [`Replica::ready`] produced.
#[derive(Debug, Default)]
pub struct Output {
    /// Messages to send, each to `msg.to`.
    pub messages: Vec<Message>,
    /// Entries applied, in log order.
    pub applied: Vec<Applied>,
    /// A snapshot was installed from the leader (the state was replaced, nothing in between was applied here).
    pub installed_snapshot: Option<u64>,
    /// Answers to [`Replica::read_index`]: the request's context and the index a linearizable read must wait for.
    pub read_states: Vec<(Vec<u8>, u64)>,
}

/// The replicated state machine: the routing state, owned (tests, tools) or shared with the serving code.
pub trait StateMachine {
    /// Apply the command at `index`.
    fn apply(&mut self, index: u64, cmd: &Command) -> Result<(), CommandError>;
    /// The whole state as bytes.
    fn snapshot(&self) -> Vec<u8>;
    /// Replace the state with a snapshot's.
    fn restore(&mut self, bytes: &[u8]) -> Result<(), String>;
}

impl StateMachine for RoutingState {
    fn apply(&mut self, index: u64, cmd: &Command) -> Result<(), CommandError> {
        RoutingState::apply(self, index, cmd)
    }

    fn snapshot(&self) -> Vec<u8> {
        RoutingState::snapshot(self)
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), String> {
        *self = RoutingState::restore(bytes).map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// The routing state behind a lock that route decisions read while the group applies to it.
#[derive(Clone, Debug, Default)]
pub struct SharedState(pub Arc<RwLock<RoutingState>>);

impl SharedState {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, RoutingState> {
        write(&self.0)
    }
}

impl StateMachine for SharedState {
    fn apply(&mut self, index: u64, cmd: &Command) -> Result<(), CommandError> {
        self.write().apply(index, cmd)
    }

    fn snapshot(&self) -> Vec<u8> {
        read(&self.0).snapshot()
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), String> {
        let state = RoutingState::restore(bytes).map_err(|e| e.to_string())?;
        *self.write() = state;
        Ok(())
    }
}

/// raft-rs's view of [`DiskStorage`].
struct RaftStore {
    disk: DiskStorage,
    conf: ConfState,
    /// Raft asked for a snapshot newer than the stored one, or one that includes a member the stored one
    /// predates (a learner just added): the next ready takes one.
    wanted: std::cell::Cell<bool>,
}

fn decode<M: protobuf::Message>(what: &'static str, bytes: &[u8]) -> Result<M, ConsensusError> {
    M::parse_from_bytes(bytes).map_err(|e| ConsensusError::Decode { what, why: e.to_string() })
}

/// A raft-rs message received as bytes from a peer: size-limited, then decoded.
pub fn decode_message(bytes: &[u8]) -> Result<Message, ConsensusError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(ConsensusError::Decode { what: "raft message", why: format!("{} bytes", bytes.len()) });
    }
    decode("raft message", bytes)
}

fn encode(m: &impl protobuf::Message) -> Vec<u8> {
    // Encoding an in-memory message only fails for missing required fields, which proto3 messages do not have.
    m.write_to_bytes().unwrap_or_default()
}

fn store_err(e: impl std::fmt::Display) -> raft::Error {
    raft::Error::Store(raft::StorageError::Other(e.to_string().into()))
}

impl RaftStore {
    fn snapshot_message(&self) -> Result<RaftSnapshot, ConsensusError> {
        let snap = self.disk.snapshot();
        if snap.index == 0 {
            return Ok(RaftSnapshot::default());
        }
        decode("snapshot", &snap.data)
    }
}

impl Storage for RaftStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let h = self.disk.hard_state();
        let hard_state = RaftHardState { term: h.term, vote: h.vote, commit: h.commit, ..Default::default() };
        Ok(RaftState { hard_state, conf_state: self.conf.clone() })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.disk.first_index() {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        if high > self.disk.last_index() + 1 {
            return Err(raft::Error::Store(raft::StorageError::Unavailable));
        }
        let max = max_size.into().unwrap_or(u64::MAX);
        let mut out = Vec::new();
        let mut size = 0u64;
        for e in self.disk.entries(low, high) {
            let entry: Entry = decode("log entry", &e.data).map_err(store_err)?;
            size += e.data.len() as u64;
            // Always at least one entry, then up to `max` bytes.
            if !out.is_empty() && size > max {
                break;
            }
            out.push(entry);
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let snap = self.disk.snapshot();
        if idx == snap.index {
            return Ok(snap.term);
        }
        if idx < self.disk.first_index() {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        self.disk.term(idx).ok_or(raft::Error::Store(raft::StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.disk.first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.disk.last_index())
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<RaftSnapshot> {
        let snap = self.snapshot_message().map_err(store_err)?;
        let conf = snap.get_metadata().get_conf_state();
        let knows_to = conf.voters.contains(&to) || conf.learners.contains(&to);
        if snap.get_metadata().index < request_index || snap.get_metadata().index == 0 || !knows_to {
            self.wanted.set(true);
            // The driver snapshots at its next ready (see `Replica::ready`); Raft asks again later.
            return Err(raft::Error::Store(raft::StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(snap)
    }
}

/// One member of the group, applying to the state machine `S`.
pub struct Replica<S: StateMachine = RoutingState> {
    raw: RawNode<RaftStore>,
    state: S,
    applied: u64,
    config: ReplicaConfig,
    /// The seeded generator of election timeouts (xorshift64* state), when configured.
    timeouts: Option<u64>,
}

impl<S: StateMachine> std::fmt::Debug for Replica<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.id())
            .field("term", &self.term())
            .field("leader", &self.leader())
            .field("applied", &self.applied)
            .finish_non_exhaustive()
    }
}

impl Replica<RoutingState> {
    /// [`Replica::open_with`] on a fresh, owned routing state.
    pub fn open(id: u64, dir: &Path, bootstrap: &[u64], config: ReplicaConfig) -> Result<Self, ConsensusError> {
        Replica::open_with(id, dir, bootstrap, config, RoutingState::default())
    }
}

impl<S: StateMachine> Replica<S> {
    /// Open node `id` on the storage in `dir`, applying to `state` (replaced by the snapshot if there is one). A node whose storage is empty and that is listed in `bootstrap`
    /// starts a new group of those voters; one that is not waits to be added (it learns the group from the
    /// leader). A node with storage resumes from it: the routing state is rebuilt from the snapshot, then Raft
    /// applies the committed entries after it again.
    pub fn open_with(
        id: u64,
        dir: &Path,
        bootstrap: &[u64],
        config: ReplicaConfig,
        mut state: S,
    ) -> Result<Self, ConsensusError> {
        let mut disk = DiskStorage::open(dir, config.segment_bytes)?;
        let snap = match disk.snapshot().index {
            0 => RaftSnapshot::default(),
            _ => decode::<RaftSnapshot>("snapshot", &disk.snapshot().data)?,
        };
        let mut conf = if disk.conf_state().is_empty() {
            snap.get_metadata().get_conf_state().clone()
        } else {
            decode::<ConfState>("membership", disk.conf_state())?
        };
        let fresh = disk.last_index() == 0 && disk.hard_state() == HardState::default();
        if fresh && conf.voters.is_empty() && bootstrap.contains(&id) {
            conf.voters = bootstrap.to_vec();
            disk.set_conf_state(&encode(&conf))?;
        }
        if snap.get_metadata().index > 0 {
            state
                .restore(snap.get_data())
                .map_err(|why| ConsensusError::Decode { what: "routing state snapshot", why })?;
        }
        let applied = snap.get_metadata().index;
        let cfg = Config {
            id,
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            applied,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            ..Default::default()
        };
        cfg.validate()?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&cfg, RaftStore { disk, conf, wanted: std::cell::Cell::new(false) }, &logger)?;
        // A zero state would stay zero under xorshift; the odd constant also spreads nearby seeds apart.
        let timeouts = config.election_seed.map(|seed| (seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1);
        let mut replica = Replica { raw, state, applied, config, timeouts };
        replica.redraw_timeout();
        Ok(replica)
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.raw.raft.id
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    /// The leader this node knows of.
    pub fn leader(&self) -> Option<u64> {
        Some(self.raw.raft.leader_id).filter(|&l| l != raft::INVALID_ID)
    }

    /// Whether this node leads.
    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// Highest index known committed.
    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    /// Highest index applied to the routing state.
    pub fn applied_index(&self) -> u64 {
        self.applied
    }

    /// The replicated routing state, as applied here.
    pub fn state(&self) -> &S {
        &self.state
    }

    /// Voting members.
    pub fn voters(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.raw.raft.prs().conf().voters().ids().iter().collect();
        v.sort_unstable();
        v
    }

    /// Learners (members that receive the log but do not vote yet).
    pub fn learners(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.raw.raft.prs().conf().learners().iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// How far `node`'s log is known to match this leader's (its replication progress); `None` when it is not a
    /// member or this node does not lead.
    pub fn matched(&self, node: u64) -> Option<u64> {
        self.is_leader().then(|| self.raw.raft.prs().get(node).map(|p| p.matched)).flatten()
    }

    /// Hand leadership to `to` (a voter): this leader stops taking proposals while `to` catches up, then `to`
    /// campaigns at once. Used before this node is removed or stopped.
    pub fn transfer_leader(&mut self, to: u64) {
        self.raw.transfer_leader(to);
    }

    /// The voter best placed to lead after this one: the other voter whose log matches furthest (it catches up
    /// soonest), `None` when this node does not lead or votes alone.
    pub fn successor(&self) -> Option<u64> {
        let me = self.id();
        self.voters()
            .into_iter()
            .filter(|&v| v != me)
            .max_by_key(|&v| (self.matched(v).unwrap_or(0), std::cmp::Reverse(v)))
    }

    /// Bytes of log on disk.
    pub fn log_bytes(&self) -> u64 {
        self.raw.store().disk.log_bytes()
    }

    /// Index of the newest snapshot.
    pub fn snapshot_index(&self) -> u64 {
        self.raw.store().disk.snapshot().index
    }

    /// Advance logical time by one tick.
    pub fn tick(&mut self) {
        self.raw.tick();
        self.redraw_timeout();
    }

    /// Start an election now (a node's own timer does this after `election_ticks` without a leader).
    pub fn campaign(&mut self) -> Result<(), ConsensusError> {
        let result = self.raw.campaign();
        self.redraw_timeout();
        Ok(result?)
    }

    /// Feed a message from a peer.
    pub fn step(&mut self, msg: Message) -> Result<(), ConsensusError> {
        let result = self.raw.step(msg);
        self.redraw_timeout();
        match result {
            // Messages from nodes outside the group, or for a peer this node no longer tracks, are stale.
            Ok(()) | Err(raft::Error::StepPeerNotFound) | Err(raft::Error::StepLocalMsg) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// With [`ReplicaConfig::election_seed`]: whenever the election timer restarted (raft-rs draws a new
    /// timeout then, from the thread's generator), draw it again from the seeded one, in raft-rs's range
    /// `[election_ticks, 2 * election_ticks)`. Drawing on every restart (heartbeats too) keeps the schedule a
    /// function of the seed and the events alone; each timer period still gets a uniform timeout.
    fn redraw_timeout(&mut self) {
        let Some(state) = self.timeouts.as_mut() else { return };
        if self.raw.raft.election_elapsed != 0 {
            return;
        }
        // xorshift64*
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        let draw = state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32;
        let ticks = self.config.election_ticks;
        self.raw.raft.set_randomized_election_timeout(ticks + (draw as usize) % ticks);
    }

    /// The transport's report on a snapshot this node sent to `to`: delivered, or lost (the leader then retries;
    /// until told, it waits for the follower).
    pub fn report_snapshot(&mut self, to: u64, delivered: bool) {
        let status = if delivered { raft::SnapshotStatus::Finish } else { raft::SnapshotStatus::Failure };
        self.raw.report_snapshot(to, status);
    }

    /// The transport could not reach `to` (the leader stops pipelining to it until it answers).
    pub fn report_unreachable(&mut self, to: u64) {
        self.raw.report_unreachable(to);
    }

    /// Ask for a linearizable read point: once the leader confirms it still leads (a heartbeat round), the answer
    /// comes back in [`Output::read_states`] with `context` and the commit index to wait for. Asked of a follower,
    /// the leader answers through it; with no leader there is no answer (the caller times out).
    pub fn read_index(&mut self, context: Vec<u8>) {
        self.raw.read_index(context);
    }

    /// Propose `cmd` with `context` (returned in [`Applied::context`] on every node that applies it).
    pub fn propose(&mut self, context: Vec<u8>, cmd: &Command) -> Result<(), ProposeError> {
        if !self.is_leader() {
            return Err(ProposeError::NotLeader { leader: self.leader() });
        }
        let data = serde_json::to_vec(cmd).map_err(|e| ProposeError::Dropped(e.to_string()))?;
        self.raw.propose(context, data).map_err(|e| match e {
            raft::Error::ProposalDropped => ProposeError::Dropped("Raft dropped the proposal".into()),
            e => ProposeError::Dropped(e.to_string()),
        })
    }

    /// A node asking to join (`membership.rs`): decide its next step from this leader's view and propose it.
    /// Before a learner is added to a group whose log was never compacted, the state is snapshotted, so the new
    /// node starts from a snapshot that carries the membership (a log replayed from its first entry does not: the
    /// first members are in the storage, not in the log).
    pub fn admit(&mut self, node: u64, fresh: bool, attached: Vec<u8>) -> Result<Admission, ProposeError> {
        if !self.is_leader() {
            return Err(ProposeError::NotLeader { leader: self.leader() });
        }
        let (voters, learners) = (self.voters(), self.learners());
        let view =
            View { voters: &voters, learners: &learners, commit: self.commit_index(), matched: self.matched(node) };
        let step = admit(node, fresh, &view);
        if let Admission::Propose(change) = step {
            if change == Change::Learner && self.snapshot_index() == 0 {
                self.snapshot_now().map_err(|e| ProposeError::Dropped(e.to_string()))?;
            }
            self.propose_membership(Vec::new(), node, change, attached)?;
        }
        Ok(step)
    }

    /// Propose one membership change: add (or promote) a voter, add a learner, or remove a member. One change at
    /// a time: Raft drops a second while the first is pending.
    pub fn propose_membership(
        &mut self,
        context: Vec<u8>,
        node: u64,
        change: Change,
        attached: Vec<u8>,
    ) -> Result<(), ProposeError> {
        if !self.is_leader() {
            return Err(ProposeError::NotLeader { leader: self.leader() });
        }
        let kind = match change {
            Change::Voter => ConfChangeType::AddNode,
            Change::Learner => ConfChangeType::AddLearnerNode,
            Change::Remove => ConfChangeType::RemoveNode,
        };
        let mut change = ConfChangeSingle { node_id: node, ..Default::default() };
        change.set_change_type(kind);
        let mut cc = ConfChangeV2::default();
        cc.mut_changes().push(change);
        cc.set_context(attached.into());
        self.raw.propose_conf_change(context, cc).map_err(|e| ProposeError::Dropped(e.to_string()))
    }

    /// Do what Raft has ready: install a snapshot, persist entries and the hard state (fsynced), apply committed
    /// entries, and return the messages to send. Call after every `tick`, `step` and `propose`.
    pub fn ready(&mut self) -> Result<Output, ConsensusError> {
        let mut out = Output::default();
        if self.raw.has_ready() {
            let mut rd = self.raw.ready();
            out.messages.extend(rd.take_messages());
            out.read_states.extend(rd.take_read_states().into_iter().map(|r| (r.request_ctx, r.index)));
            if !rd.snapshot().is_empty() {
                self.install(rd.snapshot().clone())?;
                out.installed_snapshot = Some(self.applied);
            }
            let committed = rd.take_committed_entries();
            self.apply(committed, &mut out)?;
            let entries: Vec<LogEntry> =
                rd.entries().iter().map(|e| LogEntry { index: e.index, term: e.term, data: encode(e) }).collect();
            self.raw.mut_store().disk.append(&entries)?;
            if let Some(hs) = rd.hs() {
                let hard = HardState { term: hs.term, vote: hs.vote, commit: hs.commit };
                self.raw.mut_store().disk.set_hard_state(hard)?;
            }
            out.messages.extend(rd.take_persisted_messages());
            let mut light = self.raw.advance(rd);
            if let Some(commit) = light.commit_index() {
                let mut hard = self.raw.store().disk.hard_state();
                hard.commit = commit;
                self.raw.mut_store().disk.set_hard_state(hard)?;
            }
            out.messages.extend(light.take_messages());
            let committed = light.take_committed_entries();
            self.apply(committed, &mut out)?;
            self.raw.advance_apply();
        }
        self.maybe_snapshot()?;
        Ok(out)
    }

    fn install(&mut self, snap: RaftSnapshot) -> Result<(), ConsensusError> {
        let meta = snap.get_metadata();
        self.state
            .restore(snap.get_data())
            .map_err(|why| ConsensusError::Decode { what: "routing state snapshot", why })?;
        let (index, term, conf) = (meta.index, meta.term, meta.get_conf_state().clone());
        let store = self.raw.mut_store();
        store.disk.install_snapshot(Snapshot { index, term, data: encode(&snap) })?;
        store.disk.set_conf_state(&encode(&conf))?;
        store.conf = conf;
        self.applied = index;
        Ok(())
    }

    fn apply(&mut self, entries: Vec<Entry>, out: &mut Output) -> Result<(), ConsensusError> {
        for e in entries {
            if e.index <= self.applied {
                continue;
            }
            self.applied = e.index;
            match e.get_entry_type() {
                EntryType::EntryNormal if e.data.is_empty() => {}
                EntryType::EntryNormal => {
                    let (command, result) = match serde_json::from_slice::<Command>(&e.data) {
                        Ok(cmd) => {
                            let result = self.state.apply(e.index, &cmd);
                            (Some(cmd), result)
                        }
                        // A command this version cannot read (written by a newer one): skip it the same way on
                        // every node of this version, and say so.
                        Err(err) => (
                            None,
                            Err(CommandError::Invalid { field: "command", problem: format!("undecodable: {err}") }),
                        ),
                    };
                    out.applied.push(Applied {
                        index: e.index,
                        context: e.context.to_vec(),
                        command,
                        membership: None,
                        result,
                    });
                }
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    let cc: ConfChangeV2 = if e.get_entry_type() == EntryType::EntryConfChangeV2 {
                        decode("membership change", &e.data)?
                    } else {
                        let v1: raft::eraftpb::ConfChange = decode("membership change", &e.data)?;
                        let mut change = ConfChangeSingle { node_id: v1.node_id, ..Default::default() };
                        change.set_change_type(v1.get_change_type());
                        let mut cc = ConfChangeV2::default();
                        cc.mut_changes().push(change);
                        cc
                    };
                    let conf = self.raw.apply_conf_change(&cc)?;
                    let store = self.raw.mut_store();
                    store.disk.set_conf_state(&encode(&conf))?;
                    store.conf = conf;
                    let membership = cc
                        .changes
                        .first()
                        .map(|c| (c.node_id, c.get_change_type() != ConfChangeType::RemoveNode, cc.context.to_vec()));
                    out.applied.push(Applied {
                        index: e.index,
                        context: e.context.to_vec(),
                        command: None,
                        membership,
                        result: Ok(()),
                    });
                }
            }
        }
        Ok(())
    }

    /// Snapshot the routing state and compact the log once `snapshot_every` entries were applied since the last.
    fn maybe_snapshot(&mut self) -> Result<(), ConsensusError> {
        let last = self.raw.store().disk.snapshot().index;
        if self.raw.store().wanted.get() && self.applied > last {
            self.raw.store().wanted.set(false);
            return self.snapshot_now();
        }
        if self.applied < last + self.config.snapshot_every.max(1) {
            return Ok(());
        }
        self.snapshot_now()
    }

    /// Snapshot the routing state at the applied index and compact the log.
    pub fn snapshot_now(&mut self) -> Result<(), ConsensusError> {
        let index = self.applied;
        if index <= self.raw.store().disk.snapshot().index {
            return Ok(());
        }
        let term = self.raw.store().term(index)?;
        let mut snap = RaftSnapshot::default();
        snap.set_data(self.state.snapshot().into());
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.raw.store().conf.clone());
        self.raw.mut_store().disk.install_snapshot(Snapshot { index, term, data: encode(&snap) })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn peer_messages_are_size_limited_and_verified() {
        let mut m = Message::default();
        m.set_msg_type(raft::eraftpb::MessageType::MsgHeartbeat);
        (m.from, m.to, m.term) = (1, 2, 7);
        assert_eq!(decode_message(&encode(&m)).unwrap(), m);
        assert!(decode_message(&vec![0u8; MAX_MESSAGE_BYTES + 1]).is_err());
        // A truncated length-delimited field is refused, not read past its end.
        assert!(decode_message(&[0x22, 0x7f, 0x01]).is_err());
    }
}
