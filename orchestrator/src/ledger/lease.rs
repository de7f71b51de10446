//! The lease arithmetic budgets and shared rate limits have in common: frontends hold cumulative allotments out
//! of a capacity, and the allotments plus what was charged never exceed it.

use std::collections::BTreeMap;

use super::Allotment;

/// What frontends hold of one budget period or rate bucket, and what was charged for leases taken back.
pub(super) struct Leases<'a> {
    /// Per frontend.
    pub(super) frontends: &'a mut BTreeMap<String, Allotment>,
    /// Charged for leases of frontends that stopped reporting or started counting afresh.
    pub(super) charged: &'a mut u64,
}

impl Leases<'_> {
    fn committed(&self) -> u64 {
        *self.charged + self.frontends.values().map(|a| a.allotment).sum::<u64>()
    }

    /// A frontend's cumulative position (`used`, and the allotment it wants, `target`) against `capacity`: a
    /// frontend that counts afresh (it restarted) has its old lease charged; it is given what it wants within what
    /// is free, or takes back what it holds beyond it. The lease then holds until `expires_ms`.
    pub(super) fn ask(&mut self, frontend: &str, used: u64, target: u64, capacity: u64, expires_ms: u64) {
        if let Some(a) = self.frontends.get(frontend)
            && used < a.used
        {
            *self.charged += a.allotment;
            self.frontends.remove(frontend);
        }
        let free = capacity.saturating_sub(self.committed());
        let a = self.frontends.entry(frontend.to_owned()).or_default();
        a.used = a.used.max(used);
        a.allotment = a.allotment.max(a.used);
        let want = target.max(a.used);
        if want <= a.allotment {
            a.allotment = want;
        } else {
            a.allotment += (want - a.allotment).min(free);
        }
        a.expires_ms = expires_ms;
    }

    /// Charge and drop the leases of frontends silent past their lease time; returns them.
    pub(super) fn expire(&mut self, now_ms: u64) -> Vec<(String, Allotment)> {
        let dead: Vec<String> =
            self.frontends.iter().filter(|(_, a)| a.expires_ms < now_ms).map(|(f, _)| f.clone()).collect();
        let mut gone = Vec::new();
        for f in dead {
            if let Some(a) = self.frontends.remove(&f) {
                *self.charged += a.allotment;
                gone.push((f, a));
            }
        }
        gone
    }
}
