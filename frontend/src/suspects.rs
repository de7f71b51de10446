//! Workers this frontend saw fail at the connection level (unreachable, or the connection died), kept out of its
//! routes for a short while. The orchestrators notice a dead worker by its missing load reports (about a second);
//! this covers the gap, so a frontend that just lost a worker routes no new request there meanwhile. Pure and
//! clock-free: callers pass `now`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use zl_wire::message::NodeId;

/// How long a failed worker stays excluded: longer than the orchestrators' default heartbeat timeout (1 s) plus
/// a state sync, short enough that a restarted worker is back in the routes at once after.
pub const SUSPECT_FOR: Duration = Duration::from_secs(2);

/// Most workers excluded at once (the wire carries at most 1,024 exclusions; a frontend that lost this many
/// workers at once has bigger problems than routing around them).
const MAX_SUSPECTS: usize = 64;

/// Recently failed workers and when each may be routed to again.
#[derive(Debug, Default)]
pub struct Suspects {
    until: HashMap<NodeId, Instant>,
}

impl Suspects {
    /// `worker` failed at `now`.
    pub fn suspect(&mut self, worker: &NodeId, now: Instant) {
        self.until.retain(|_, until| *until > now);
        if self.until.len() < MAX_SUSPECTS || self.until.contains_key(worker) {
            self.until.insert(worker.clone(), now + SUSPECT_FOR);
        }
    }

    /// The workers to keep out of a route made at `now`.
    pub fn excluded(&self, now: Instant) -> Vec<NodeId> {
        let mut out: Vec<NodeId> =
            self.until.iter().filter(|(_, until)| **until > now).map(|(id, _)| id.clone()).collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> NodeId {
        NodeId::new(s.to_owned()).expect("a valid id")
    }

    #[test]
    fn a_failed_worker_is_excluded_for_a_while_then_routed_again() {
        let (mut s, t0) = (Suspects::default(), Instant::now());
        assert!(s.excluded(t0).is_empty());
        s.suspect(&id("w1"), t0);
        s.suspect(&id("w2"), t0 + Duration::from_millis(500));
        assert_eq!(s.excluded(t0 + Duration::from_secs(1)), vec![id("w1"), id("w2")]);
        assert_eq!(s.excluded(t0 + SUSPECT_FOR), vec![id("w2")]);
        assert!(s.excluded(t0 + SUSPECT_FOR + Duration::from_secs(1)).is_empty());
    }

    #[test]
    fn the_list_stays_bounded() {
        let (mut s, t0) = (Suspects::default(), Instant::now());
        for i in 0..1000 {
            s.suspect(&id(&format!("w{i}")), t0);
        }
        assert_eq!(s.excluded(t0).len(), MAX_SUSPECTS);
        // Expired entries make room again.
        s.suspect(&id("late"), t0 + SUSPECT_FOR);
        assert_eq!(s.excluded(t0 + SUSPECT_FOR), vec![id("late")]);
    }
}
