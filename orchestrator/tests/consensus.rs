//! The Raft group in a deterministic harness: real replicas on real (tmpfs) storage, a simulated network that
//! drops, reorders and partitions messages from a seeded generator, and logical time (ticks). No sockets, no clock:
//! a failing seed replays exactly.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{BTreeMap, BTreeSet, HashMap};

use raft::eraftpb::{Message, MessageType};
use tempfile::TempDir;
use zl_orchestrator::raft::membership::{Admission, Change};
use zl_orchestrator::raft::replica::{ProposeError, Replica, ReplicaConfig};
use zl_orchestrator::state::{Command, Quota};

/// xorshift64*: small, seeded, good enough for schedules.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// True with probability `per_mille` / 1000.
    fn chance(&mut self, per_mille: u64) -> bool {
        self.next() % 1000 < per_mille
    }
}

fn command(i: u64) -> Command {
    Command::SetProject {
        name: format!("p{}", i % 40),
        quota: Quota { requests_per_minute: i as u32, ..Quota::default() },
    }
}

struct Cluster {
    config: ReplicaConfig,
    dirs: BTreeMap<u64, TempDir>,
    nodes: BTreeMap<u64, Option<Replica>>,
    /// Everything applied anywhere, by index: every node must apply the same thing at the same index.
    history: BTreeMap<u64, String>,
    /// Per node, the last index it applied in this incarnation (applied indices only grow).
    last_applied: HashMap<u64, u64>,
    in_flight: Vec<Message>,
    /// Directed links that drop everything.
    cut: BTreeSet<(u64, u64)>,
    drop_per_mille: u64,
    reorder: bool,
    rng: Rng,
    /// The schedule's seed.
    seed: u64,
    /// Group members when the cluster started.
    bootstrap: Vec<u64>,
    /// Read points answered: node, request context, index.
    reads: Vec<(u64, Vec<u8>, u64)>,
    /// Nodes started empty to join (`--raft-auto-join`) that take no message until the leader makes them learners.
    holding: BTreeSet<u64>,
}

fn storage_dir() -> TempDir {
    // tmpfs where there is one: fsync is then free, and thousands of appends stay fast.
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() { tempfile::tempdir_in(shm).unwrap() } else { tempfile::tempdir().unwrap() }
}

impl Cluster {
    fn new(n: u64, seed: u64, config: ReplicaConfig) -> Cluster {
        let bootstrap: Vec<u64> = (1..=n).collect();
        let mut c = Cluster {
            config,
            dirs: BTreeMap::new(),
            nodes: BTreeMap::new(),
            history: BTreeMap::new(),
            last_applied: HashMap::new(),
            in_flight: Vec::new(),
            cut: BTreeSet::new(),
            drop_per_mille: 0,
            reorder: false,
            rng: Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
            seed,
            bootstrap,
            reads: Vec::new(),
            holding: BTreeSet::new(),
        };
        for id in 1..=n {
            c.dirs.insert(id, storage_dir());
            c.start(id);
        }
        c
    }

    fn start(&mut self, id: u64) {
        // Election timeouts from the schedule's seed too (each node its own stream), so a seed replays exactly.
        let config = ReplicaConfig { election_seed: Some(self.seed), ..self.config };
        let replica = Replica::open(id, self.dirs[&id].path(), &self.bootstrap, config).unwrap();
        self.last_applied.insert(id, replica.applied_index());
        self.nodes.insert(id, Some(replica));
    }

    /// Add a brand-new, empty node (it joins once the group adds it).
    fn spawn(&mut self, id: u64) {
        self.dirs.insert(id, storage_dir());
        self.start(id);
    }

    /// Node `id` back with empty storage (a lost volume), started as `--raft-auto-join` starts it: knowing no
    /// group, waiting to be added.
    fn start_empty(&mut self, id: u64) {
        self.dirs.insert(id, storage_dir());
        let config = ReplicaConfig { election_seed: Some(self.seed), ..self.config };
        let replica = Replica::open(id, self.dirs[&id].path(), &[], config).unwrap();
        self.last_applied.insert(id, replica.applied_index());
        self.nodes.insert(id, Some(replica));
        self.holding.insert(id);
    }

    /// One round of `id` asking the leader to join (what `raft/join.rs` does over gRPC): the leader's decision,
    /// proposed when it is a change.
    fn join_step(&mut self, id: u64) -> Admission {
        let Some(leader) = self.leader() else { return Admission::Wait("no leader".into()) };
        let fresh = {
            let n = self.node(id);
            n.voters().is_empty() && n.learners().is_empty()
        };
        // Dropped while another change is pending: the node asks again.
        // As the driver and `raft/join.rs` do: admitted by a step that was taken, it takes the leader's messages.
        match self.node_mut(leader).admit(id, fresh, vec![]) {
            Ok(step) => {
                if step.admits() {
                    self.holding.remove(&id);
                }
                step
            }
            Err(e) => Admission::Wait(e.to_string()),
        }
    }

    fn crash(&mut self, id: u64) {
        // Its memory is gone; its disk stays. Messages to it are lost (snapshots reported as such).
        self.nodes.insert(id, None);
        let lost: Vec<Message> = self.in_flight.iter().filter(|m| m.to == id).cloned().collect();
        self.in_flight.retain(|m| m.to != id);
        for m in lost {
            if m.get_msg_type() == MessageType::MsgSnapshot
                && let Some(Some(sender)) = self.nodes.get_mut(&m.from)
            {
                sender.report_snapshot(id, false);
            }
        }
    }

    fn live(&self) -> Vec<u64> {
        self.nodes.iter().filter(|(_, n)| n.is_some()).map(|(&id, _)| id).collect()
    }

    fn node(&self, id: u64) -> &Replica {
        self.nodes[&id].as_ref().expect("node is up")
    }

    fn node_mut(&mut self, id: u64) -> &mut Replica {
        self.nodes.get_mut(&id).unwrap().as_mut().expect("node is up")
    }

    /// Collect every live node's ready output: check what it applied, queue what it sends.
    fn drain_ready(&mut self) {
        for id in self.live() {
            let out = self.node_mut(id).ready().unwrap();
            self.reads.extend(out.read_states.into_iter().map(|(ctx, index)| (id, ctx, index)));
            if let Some(index) = out.installed_snapshot {
                self.last_applied.insert(id, index);
            }
            for a in out.applied {
                let last = self.last_applied.insert(id, a.index).unwrap_or(0);
                assert!(a.index > last, "node {id} applied {} after {last}", a.index);
                let what = match &a.command {
                    Some(cmd) => serde_json::to_string(cmd).unwrap(),
                    None => "membership".to_string(),
                };
                let seen = self.history.entry(a.index).or_insert_with(|| what.clone());
                assert_eq!(*seen, what, "node {id} applied a different entry at {}", a.index);
            }
            for m in out.messages {
                let lost = self.cut.contains(&(m.from, m.to)) || self.rng.chance(self.drop_per_mille);
                if !lost {
                    self.in_flight.push(m);
                } else if m.get_msg_type() == MessageType::MsgSnapshot {
                    // A real transport learns that a snapshot did not arrive, and says so.
                    self.node_mut(id).report_snapshot(m.to, false);
                }
            }
        }
    }

    /// Deliver what is in flight (in a shuffled order when reordering), until nothing more is sent; bounded.
    fn settle(&mut self) {
        for _ in 0..50 {
            self.drain_ready();
            if self.in_flight.is_empty() {
                return;
            }
            let mut batch = std::mem::take(&mut self.in_flight);
            if self.reorder {
                for i in (1..batch.len()).rev() {
                    let j = (self.rng.next() % (i as u64 + 1)) as usize;
                    batch.swap(i, j);
                }
            }
            for m in batch {
                let (from, to, snapshot) = (m.from, m.to, m.get_msg_type() == MessageType::MsgSnapshot);
                let delivered = match self.nodes.get_mut(&to) {
                    Some(Some(_)) if self.holding.contains(&to) => false,
                    Some(Some(node)) => {
                        node.step(m).unwrap();
                        true
                    }
                    _ => false,
                };
                if snapshot && let Some(Some(sender)) = self.nodes.get_mut(&from) {
                    sender.report_snapshot(to, delivered);
                }
            }
        }
    }

    /// One unit of logical time: every live node ticks, then messages settle.
    fn tick(&mut self) {
        for id in self.live() {
            self.node_mut(id).tick();
        }
        self.settle();
    }

    fn run(&mut self, ticks: usize) {
        for _ in 0..ticks {
            self.tick();
        }
    }

    /// The live leader with the highest term, if any.
    fn leader(&self) -> Option<u64> {
        self.live().into_iter().filter(|&id| self.node(id).is_leader()).max_by_key(|&id| self.node(id).term())
    }

    /// Ticks until some node leads, at most `limit`; returns the leader and the ticks it took.
    fn await_leader(&mut self, limit: usize) -> (u64, usize) {
        for t in 0..limit {
            if let Some(l) = self.leader() {
                return (l, t);
            }
            self.tick();
        }
        panic!("no leader within {limit} ticks");
    }

    /// Propose command `i` on the current leader (if any); true if a leader took it.
    fn propose(&mut self, i: u64) -> bool {
        let Some(l) = self.leader() else { return false };
        let ok = self.node_mut(l).propose(i.to_le_bytes().to_vec(), &command(i)).is_ok();
        self.settle();
        ok
    }

    /// Every live node has applied the same state up to the same index.
    fn assert_converged(&self) {
        let live = self.live();
        let first = self.node(live[0]);
        for &id in &live[1..] {
            let n = self.node(id);
            assert_eq!(n.applied_index(), first.applied_index(), "node {id} vs node {}", live[0]);
            assert!(n.state() == first.state(), "node {id}'s routing state differs from node {}'s", live[0]);
        }
    }
}

fn config() -> ReplicaConfig {
    ReplicaConfig {
        election_ticks: 10,
        heartbeat_ticks: 1,
        snapshot_every: 1000,
        segment_bytes: 1 << 20,
        election_seed: None,
    }
}

#[test]
fn a_group_elects_a_leader_and_replicates_commands() {
    let mut c = Cluster::new(3, 1, config());
    let (leader, _) = c.await_leader(100);
    for i in 0..20 {
        assert!(c.propose(i));
    }
    c.run(3);
    c.assert_converged();
    assert_eq!(c.node(leader).state().projects().len(), 20);
    // A follower refuses proposals and names the leader, so the caller can forward.
    let follower = c.live().into_iter().find(|&id| id != leader).unwrap();
    match c.node_mut(follower).propose(vec![], &command(99)) {
        Err(ProposeError::NotLeader { leader: Some(l) }) => assert_eq!(l, leader),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_seed_replays_its_elections_exactly() {
    // raft-rs draws election timeouts from a thread-local generator; the harness draws them from the seed, so the
    // same seed gives the same leaders after the same numbers of ticks, run after run.
    let elections = |seed: u64| {
        let mut c = Cluster::new(5, seed, config());
        let mut seen = Vec::new();
        for _ in 0..3 {
            let (leader, ticks) = c.await_leader(200);
            seen.push((leader, ticks, c.node(leader).term()));
            c.crash(leader);
        }
        seen
    };
    for seed in 1..=20 {
        assert_eq!(elections(seed), elections(seed), "seed {seed}");
    }
}

#[test]
fn leader_crash_elects_a_new_leader_and_the_old_one_catches_up_from_disk() {
    let mut c = Cluster::new(3, 2, config());
    let (old, _) = c.await_leader(100);
    for i in 0..10 {
        assert!(c.propose(i));
    }
    c.crash(old);
    let (new, ticks) = c.await_leader(100);
    assert_ne!(new, old);
    // Election timeout is 10-20 ticks; pre-vote adds a round trip.
    assert!(ticks <= 40, "re-election took {ticks} ticks");
    for i in 10..20 {
        assert!(c.propose(i));
    }
    c.start(old);
    c.run(30);
    c.assert_converged();
    assert_eq!(c.node(old).state().projects().len(), 20);
}

#[test]
fn a_partitioned_leader_cannot_commit_and_the_majority_moves_on() {
    let mut c = Cluster::new(3, 3, config());
    let (old, _) = c.await_leader(100);
    assert!(c.propose(0));
    let others: Vec<u64> = c.live().into_iter().filter(|&id| id != old).collect();
    for &o in &others {
        c.cut.insert((old, o));
        c.cut.insert((o, old));
    }
    // The isolated leader takes a proposal but can never commit it.
    let before = c.node(old).commit_index();
    c.node_mut(old).propose(vec![], &command(1)).unwrap();
    c.run(5);
    assert_eq!(c.node(old).commit_index(), before);
    // The majority elects a leader of its own and commits.
    let mut new = None;
    for _ in 0..100 {
        c.tick();
        new = others.iter().copied().find(|&id| c.node(id).is_leader());
        if new.is_some() {
            break;
        }
    }
    let new = new.expect("the majority elects a leader");
    c.node_mut(new).propose(vec![], &command(2)).unwrap();
    c.run(3);
    assert!(others.iter().all(|&id| c.node(id).state().projects().contains_key("p2")));
    // With check-quorum the old leader steps down on its own; healed, it takes the majority's log.
    c.run(30);
    assert!(!c.node(old).is_leader());
    c.cut.clear();
    c.run(30);
    c.assert_converged();
    assert!(!c.node(old).state().projects().contains_key("p1"), "the uncommitted entry was dropped");
}

#[test]
fn a_lagging_node_catches_up_from_a_snapshot() {
    let mut c = Cluster::new(3, 4, ReplicaConfig { snapshot_every: 10, ..config() });
    let (leader, _) = c.await_leader(100);
    let lagging = c.live().into_iter().find(|&id| id != leader).unwrap();
    c.crash(lagging);
    for i in 0..60 {
        assert!(c.propose(i));
    }
    // The leader compacted past everything the lagging node has.
    assert!(c.node(leader).snapshot_index() >= 50);
    c.start(lagging);
    c.run(30);
    c.assert_converged();
    assert!(c.node(lagging).snapshot_index() >= 50, "it installed the leader's snapshot");
    // And it restarts from that snapshot.
    c.crash(lagging);
    c.start(lagging);
    c.run(10);
    c.assert_converged();
}

#[test]
fn membership_changes_while_a_node_is_down() {
    let mut c = Cluster::new(3, 5, config());
    let (leader, _) = c.await_leader(100);
    let down = c.live().into_iter().find(|&id| id != leader).unwrap();
    c.crash(down);
    // Add node 4 while node `down` is away: two of four are needed... of the new three-plus-one, three.
    c.spawn(4);
    c.node_mut(leader).propose_membership(vec![], 4, Change::Voter, vec![]).unwrap();
    c.run(20);
    assert_eq!(c.node(leader).voters(), vec![1, 2, 3, 4]);
    for i in 0..10 {
        assert!(c.propose(i));
    }
    // Remove the node that is down; the group is then three live voters.
    let leader = c.leader().unwrap();
    c.node_mut(leader).propose_membership(vec![], down, Change::Remove, vec![]).unwrap();
    c.run(20);
    let voters = c.node(c.leader().unwrap()).voters();
    assert!(!voters.contains(&down) && voters.len() == 3, "{voters:?}");
    c.run(10);
    c.assert_converged();
    assert_eq!(c.node(4).state().projects().len(), 10);
    // Losing one more of the three still leaves a majority.
    let leader = c.leader().unwrap();
    let other = voters.iter().copied().find(|&id| id != leader).unwrap();
    c.crash(other);
    assert!(c.propose(100));
    c.run(5);
    assert!(c.node(leader).state().projects().contains_key("p20") || c.node(leader).state().projects().len() == 10);
}

/// Joins until every node in `joining` votes, with a proposal between rounds; returns the steps each took.
fn join_all(c: &mut Cluster, joining: &[u64], next: &mut u64) -> BTreeMap<u64, Vec<Admission>> {
    let mut steps: BTreeMap<u64, Vec<Admission>> = BTreeMap::new();
    for _ in 0..60 {
        let mut done = true;
        for &id in joining {
            let step = c.join_step(id);
            if step != Admission::Voter {
                done = false;
                // A learner is never promoted before it holds everything the leader committed.
                if step == Admission::Propose(Change::Voter) {
                    let leader = c.leader().unwrap();
                    assert!(c.node(id).applied_index() + 5 >= c.node(leader).commit_index());
                }
            }
            steps.entry(id).or_default().push(step);
        }
        if done {
            return steps;
        }
        if c.propose(*next) {
            *next += 1;
        }
        c.run(10);
    }
    panic!("never joined: {steps:?}");
}

#[test]
fn nodes_join_as_learners_and_vote_once_caught_up_then_leave_with_leadership_handed_over() {
    let mut c = Cluster::new(3, 41, config());
    c.await_leader(100);
    let mut next = 0;
    for _ in 0..30 {
        assert!(c.propose(next));
        next += 1;
    }
    // 3 -> 5: both new nodes at once, writes flowing.
    c.spawn(4);
    c.spawn(5);
    let steps = join_all(&mut c, &[4, 5], &mut next);
    for id in [4, 5] {
        assert!(steps[&id].contains(&Admission::Propose(Change::Learner)), "{steps:?}");
        assert!(steps[&id].contains(&Admission::Propose(Change::Voter)), "{steps:?}");
    }
    let leader = c.leader().unwrap();
    assert_eq!(c.node(leader).voters(), vec![1, 2, 3, 4, 5]);
    assert!(c.node(leader).learners().is_empty());
    c.run(10);
    c.assert_converged();
    for id in 1..=5 {
        assert_eq!(c.node(id).voters(), vec![1, 2, 3, 4, 5], "node {id} knows the membership");
    }

    // 5 -> 3: the highest ids leave, the leader handing over first when it is one of them.
    for gone in [5, 4] {
        let mut leader = c.leader().unwrap();
        if leader == gone {
            let to = c.node(leader).successor().unwrap();
            assert!(to != gone && to <= 5);
            c.node_mut(leader).transfer_leader(to);
            c.run(40);
            leader = c.leader().unwrap();
            assert_ne!(leader, gone, "leadership moved");
        }
        c.node_mut(leader).propose_membership(vec![], gone, Change::Remove, vec![]).unwrap();
        c.run(10);
        c.crash(gone);
        c.nodes.remove(&gone);
    }
    let leader = c.leader().unwrap();
    assert_eq!(c.node(leader).voters(), vec![1, 2, 3]);
    // Still a group that survives one failure.
    let other = [1, 2, 3].into_iter().find(|&id| id != leader).unwrap();
    c.crash(other);
    assert!(c.propose(next));
    c.start(other);
    c.run(20);
    c.assert_converged();
}

#[test]
fn a_voter_that_lost_its_storage_is_removed_and_joins_again_as_a_new_learner() {
    let mut c = Cluster::new(3, 43, ReplicaConfig { snapshot_every: 10, ..config() });
    let (leader, _) = c.await_leader(100);
    let mut next = 0;
    for _ in 0..25 {
        assert!(c.propose(next));
        next += 1;
    }
    let lost = [1, 2, 3].into_iter().find(|&id| id != leader).unwrap();
    c.crash(lost);
    c.start_empty(lost);
    // Heartbeats reach it before it asks to join: they name a commit index its empty log does not hold.
    c.run(30);
    let steps = join_all(&mut c, &[lost], &mut next);
    let kinds: Vec<&Admission> = steps[&lost].iter().filter(|s| matches!(s, Admission::Propose(_))).collect();
    assert_eq!(
        kinds,
        [&Admission::Propose(Change::Remove), &Admission::Propose(Change::Learner), &Admission::Propose(Change::Voter)],
        "{steps:?}"
    );
    c.run(10);
    c.assert_converged();
    assert_eq!(c.node(lost).voters(), vec![1, 2, 3]);
    assert_eq!(c.node(lost).state().projects().len(), c.node(c.leader().unwrap()).state().projects().len());
}

#[test]
fn random_loss_reordering_and_crashes_never_disagree() {
    // Each seed: a schedule of proposals, crashes, restarts, partitions and healing over a lossy, reordering
    // network. Every applied entry is checked against every other node's at the same index as it happens.
    for seed in std::env::var("ZL_RAFT_SEEDS")
        .ok()
        .map(|s| s.split(',').map(|v| v.parse().unwrap()).collect::<Vec<u64>>())
        .unwrap_or_else(|| (11..31).collect())
    {
        let mut c = Cluster::new(5, seed, ReplicaConfig { snapshot_every: 25, ..config() });
        c.drop_per_mille = 100;
        c.reorder = true;
        let mut next = 0u64;
        for _ in 0..300 {
            let roll = c.rng.next() % 100;
            let live = c.live();
            match roll {
                0..=59 if c.propose(next) => next += 1,
                60..=63 if live.len() > 3 => {
                    let victim = live[(c.rng.next() % live.len() as u64) as usize];
                    c.crash(victim);
                }
                64..=69 => {
                    let down: Vec<u64> = c.nodes.iter().filter(|(_, n)| n.is_none()).map(|(&id, _)| id).collect();
                    if let Some(&id) = down.first() {
                        c.start(id);
                    }
                }
                70..=71 if c.cut.is_empty() => {
                    let a = 1 + c.rng.next() % 5;
                    for b in 1..=5 {
                        if b != a {
                            c.cut.insert((a, b));
                            c.cut.insert((b, a));
                        }
                    }
                }
                72..=75 => c.cut.clear(),
                _ => {}
            }
            c.tick();
        }
        // Heal everything: the group converges on one history.
        c.cut.clear();
        c.drop_per_mille = 0;
        let down: Vec<u64> = c.nodes.iter().filter(|(_, n)| n.is_none()).map(|(&id, _)| id).collect();
        for id in down {
            c.start(id);
        }
        c.run(80);
        c.assert_converged();
        assert!(next > 20, "seed {seed}: only {next} proposals were taken");
    }
}

#[test]
fn read_points_cover_every_committed_write_and_need_the_leader() {
    let mut c = Cluster::new(3, 6, config());
    let (leader, _) = c.await_leader(100);
    for i in 0..5 {
        assert!(c.propose(i));
    }
    let committed = c.node(leader).commit_index();
    let follower = c.live().into_iter().find(|&id| id != leader).unwrap();
    c.node_mut(follower).read_index(b"through a follower".to_vec());
    c.node_mut(leader).read_index(b"on the leader".to_vec());
    c.run(2);
    for (who, ctx) in [(follower, &b"through a follower"[..]), (leader, &b"on the leader"[..])] {
        let (_, _, index) = c.reads.iter().find(|(n, x, _)| *n == who && x == ctx).expect("a read point");
        assert!(*index >= committed, "read point {index} is behind the commit index {committed}");
    }
    // Cut off from the leader, a follower gets no read point: it cannot know it is current.
    let other = c.live().into_iter().find(|&id| id != leader && id != follower).unwrap();
    for peer in [leader, follower] {
        c.cut.insert((other, peer));
        c.cut.insert((peer, other));
    }
    c.node_mut(other).read_index(b"isolated".to_vec());
    c.run(5);
    assert!(!c.reads.iter().any(|(_, x, _)| x == b"isolated"), "an isolated node answered a read point");
}
