//! Degradation levels (`x-zl-health`): `healthy`, `degraded` or `unavailable`, from real signals: whether the
//! routing state is fresh and the discovery backend reachable, whether the Raft group has a leader, and the
//! workers' load: sequences running and waiting per sequence slot of the healthy workers, as the orchestrators
//! report them in each answer to this frontend's report. A worker takes at most as many waiting sequences as it
//! has slots, so the load runs from 0 to 2; at 2 every route is refused. Pure: [`assess`] takes every input,
//! including the time.

use std::time::{Duration, Instant};

use zl_wire::message::FrontendGrant;

/// The levels, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Serving normally.
    Healthy,
    /// Serving, with the configured effects (lower classes shed, output capped).
    Degraded,
    /// Refusing at once with 529 and `retry-after`, without queueing.
    Unavailable,
}

impl Level {
    /// Header and metric value.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Healthy => "healthy",
            Level::Degraded => "degraded",
            Level::Unavailable => "unavailable",
        }
    }
}

/// Where the levels change (docs/operations.md, "Degradation levels").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// Degraded when the load (running and waiting sequences per slot) reaches this.
    pub degraded_load: f64,
    /// Unavailable when the load reaches this.
    pub unavailable_load: f64,
    /// Degraded when the orchestrators' signals are older than this.
    pub signals_stale: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { degraded_load: 1.5, unavailable_load: 1.9, signals_stale: Duration::from_secs(5) }
    }
}

/// Everything a level is decided from.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// Why the routing state is not usable (`Cluster::ready`): never synced, stale, or no healthy worker.
    pub state: Option<String>,
    /// The state synced once at least.
    pub ever_synced: bool,
    /// Workers able to serve, as of the last sync.
    pub serving_workers: u32,
    /// The discovery backend is reachable (always, without one).
    pub discovery_ok: bool,
    /// The last answer to a report, and when it came.
    pub signals: Option<(FrontendGrant, Instant)>,
}

/// The level now, and why.
pub fn assess(t: &Thresholds, i: &Inputs, now: Instant) -> (Level, String) {
    if !i.ever_synced {
        return (Level::Unavailable, "no orchestrator has answered yet".into());
    }
    if i.serving_workers == 0 {
        return (Level::Unavailable, "no healthy worker is registered".into());
    }
    let fresh = i.signals.as_ref().filter(|(_, at)| now.saturating_duration_since(*at) <= t.signals_stale);
    if let Some((g, _)) = fresh {
        if g.capacity == 0 {
            return (Level::Unavailable, "no healthy worker capacity".into());
        }
        let load = f64::from(g.running + g.waiting) / f64::from(g.capacity);
        let why =
            || format!("load {load:.2}: {} running and {} waiting for {} slots", g.running, g.waiting, g.capacity);
        if load >= t.unavailable_load {
            return (Level::Unavailable, why());
        }
        if load >= t.degraded_load {
            return (Level::Degraded, why());
        }
        if !g.leader {
            return (Level::Degraded, "the orchestrators have no Raft leader".into());
        }
    } else if let Some((_, at)) = &i.signals {
        return (
            Level::Degraded,
            format!("no orchestrator answered a report for {:.0?}", now.saturating_duration_since(*at)),
        );
    }
    if let Some(why) = &i.state {
        return (Level::Degraded, why.clone());
    }
    if !i.discovery_ok {
        return (Level::Degraded, "the discovery backend is unreachable".into());
    }
    (Level::Healthy, String::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(capacity: u32, busy: u32, leader: bool) -> FrontendGrant {
        let running = busy.min(capacity);
        FrontendGrant { capacity, running, waiting: busy - running, leader, ..FrontendGrant::default() }
    }

    #[test]
    fn levels_follow_the_signals() {
        let t = Thresholds::default();
        let now = Instant::now();
        let ok = Inputs { ever_synced: true, serving_workers: 2, discovery_ok: true, ..Inputs::default() };
        let with =
            |g: FrontendGrant, age: u64| Inputs { signals: Some((g, now - Duration::from_secs(age))), ..ok.clone() };
        assert_eq!(assess(&t, &ok, now).0, Level::Healthy, "no report answered yet: the sync decides");
        assert_eq!(assess(&t, &with(grant(4, 5, true), 0), now).0, Level::Healthy);
        assert_eq!(assess(&t, &with(grant(4, 6, true), 0), now).0, Level::Degraded);
        assert_eq!(assess(&t, &with(grant(4, 8, true), 0), now).0, Level::Unavailable);
        assert_eq!(assess(&t, &with(grant(0, 0, true), 0), now).0, Level::Unavailable);
        assert_eq!(assess(&t, &with(grant(4, 0, false), 0), now).0, Level::Degraded);
        let (level, why) = assess(&t, &with(grant(4, 8, true), 6), now);
        assert_eq!(level, Level::Degraded, "stale signals degrade, they do not condemn");
        assert!(why.contains("report"), "{why}");
        assert_eq!(assess(&t, &Inputs { discovery_ok: false, ..ok.clone() }, now).0, Level::Degraded);
        assert_eq!(assess(&t, &Inputs { serving_workers: 0, ..ok.clone() }, now).0, Level::Unavailable);
        assert_eq!(assess(&t, &Inputs::default(), now).0, Level::Unavailable);
    }
}
