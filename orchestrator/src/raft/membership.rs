//! Membership that follows the deployment (`--raft-auto-join`, docs/consensus.md "Membership that follows a
//! StatefulSet"): what the leader does when a node asks to be a voter. Pure: the leader's view in, one step out.
//!
//! A node joins as a learner (it receives the log but does not vote), and is promoted once it holds everything
//! the leader had committed, so a joining node never weakens the quorum while it catches up. A voter that comes
//! back with empty storage (a lost volume) has forgotten its term and vote: it is removed first and joins again as
//! a new learner, so it cannot vote twice in a term it no longer remembers.

/// A single-member change (raft-rs changes one member per entry here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Add a voter, or promote a learner to one.
    Voter,
    /// Add a learner.
    Learner,
    /// Remove a voter or a learner.
    Remove,
}

/// The leader's view of the group, as far as a join needs it.
#[derive(Clone, Debug, Default)]
pub struct View<'a> {
    /// Voting members.
    pub voters: &'a [u64],
    /// Learners.
    pub learners: &'a [u64],
    /// The leader's commit index.
    pub commit: u64,
    /// How far the asking node's log matches the leader's (its replication progress), when it is a member.
    pub matched: Option<u64>,
}

/// What the leader does for a node asking to join.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// It already votes: nothing to do.
    Voter,
    /// Propose this change (one step of the join; the node asks again).
    Propose(Change),
    /// Nothing to do yet, for this reason (the node asks again).
    Wait(String),
}

impl Admission {
    /// Whether the node may take the leader's messages once this step is taken: every step but the removal of
    /// the voter place its lost storage had (messages to that place name a log its empty one does not hold).
    pub fn admits(&self) -> bool {
        *self != Admission::Propose(Change::Remove)
    }
}

/// The next step for node `id`, which has storage of its own unless `fresh` (it knows no membership at all).
pub fn admit(id: u64, fresh: bool, view: &View<'_>) -> Admission {
    if view.voters.contains(&id) {
        if fresh {
            // A voter with empty storage: its term and vote are gone.
            return Admission::Propose(Change::Remove);
        }
        return Admission::Voter;
    }
    if view.learners.contains(&id) {
        let matched = view.matched.unwrap_or(0);
        if !fresh && matched >= view.commit {
            return Admission::Propose(Change::Voter);
        }
        return Admission::Wait(format!("catching up: {matched} of {} entries", view.commit));
    }
    Admission::Propose(Change::Learner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(voters: &'a [u64], learners: &'a [u64], commit: u64, matched: Option<u64>) -> View<'a> {
        View { voters, learners, commit, matched }
    }

    #[test]
    fn a_new_node_joins_as_a_learner_and_votes_once_caught_up() {
        assert_eq!(admit(4, true, &view(&[1, 2, 3], &[], 10, None)), Admission::Propose(Change::Learner));
        // Added, but its storage has not received the membership yet.
        assert!(matches!(admit(4, true, &view(&[1, 2, 3], &[4], 11, Some(0))), Admission::Wait(_)));
        assert!(
            matches!(admit(4, false, &view(&[1, 2, 3], &[4], 11, Some(9))), Admission::Wait(w) if w.contains("9 of 11"))
        );
        assert_eq!(admit(4, false, &view(&[1, 2, 3], &[4], 11, Some(11))), Admission::Propose(Change::Voter));
        assert_eq!(admit(4, false, &view(&[1, 2, 3, 4], &[], 12, Some(12))), Admission::Voter);
    }

    #[test]
    fn a_voter_that_lost_its_storage_is_removed_before_it_joins_again() {
        assert_eq!(admit(2, true, &view(&[1, 2, 3], &[], 10, Some(10))), Admission::Propose(Change::Remove));
        assert!(!Admission::Propose(Change::Remove).admits());
        assert!(Admission::Propose(Change::Learner).admits() && Admission::Wait("catching up".into()).admits());
        assert_eq!(admit(2, true, &view(&[1, 3], &[], 11, None)), Admission::Propose(Change::Learner));
        // A voter that kept its storage is left alone however far behind it is.
        assert_eq!(admit(2, false, &view(&[1, 2, 3], &[], 10, Some(3))), Admission::Voter);
    }
}
