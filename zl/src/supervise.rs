//! `zl up`'s children: spawn each tier as its own process, notice one that exits, restart it with backoff, and
//! stop them all in order. A child that exits is reported (name, exit status, the end of its log) and started
//! again on the same addresses and data directory, so an orchestrator rejoins its Raft group from its log and a
//! worker registers again. Only a child that keeps failing soon after each start ends the cluster: then retrying
//! cannot help, and the reason is in its log.
//!
//! The restart policy ([`Restarts`]) is a pure state machine over injected instants; [`Children`] is the thin
//! shell that owns the processes.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// The first restart's delay; each quick failure in a row doubles it.
const FIRST_DELAY: Duration = Duration::from_millis(250);
/// The longest delay between restarts.
const MAX_DELAY: Duration = Duration::from_secs(8);
/// A child that ran this long before exiting was not failing to start: its next restart is quick again.
const STABLE_AFTER: Duration = Duration::from_secs(30);
/// Quick failures in a row after which a child is given up (and the cluster stopped).
const MAX_QUICK_FAILURES: u32 = 5;

/// What to do about a child that exited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Start it again after this delay.
    RestartIn(Duration),
    /// It failed this many times in a row, each soon after starting: stop trying.
    GiveUp(u32),
}

/// One child's restart history.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Restarts {
    started: Instant,
    quick_failures: u32,
}

impl Restarts {
    /// A child started at `now`.
    pub(crate) fn new(now: Instant) -> Self {
        Restarts { started: now, quick_failures: 0 }
    }

    /// The child exited at `now`.
    pub(crate) fn exited(&mut self, now: Instant) -> Verdict {
        if now.duration_since(self.started) >= STABLE_AFTER {
            self.quick_failures = 0;
        }
        self.quick_failures += 1;
        if self.quick_failures > MAX_QUICK_FAILURES {
            return Verdict::GiveUp(self.quick_failures);
        }
        let delay = FIRST_DELAY.saturating_mul(1 << (self.quick_failures - 1).min(16));
        Verdict::RestartIn(delay.min(MAX_DELAY))
    }

    /// The child was started again at `now`.
    pub(crate) fn restarted(&mut self, now: Instant) {
        self.started = now;
    }
}

/// One child process and how to start it again.
struct Supervised {
    name: String,
    bin: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Child,
    restarts: Restarts,
    /// When an exited child is due to start again.
    due: Option<Instant>,
}

/// What happened to the children in one look (exits and restarts are reported on stderr as they are seen).
#[derive(Debug, Default)]
pub(crate) struct Look {
    /// Some child has a new pid.
    pub(crate) restarted: bool,
    /// A child keeps failing to start: why the cluster must stop.
    pub(crate) give_up: Option<String>,
}

/// The running children, in start order.
#[derive(Default)]
pub(crate) struct Children {
    all: Vec<Supervised>,
}

fn start(bin: &Path, args: &[String], log: &Path) -> Result<Child> {
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    Command::new(bin)
        .args(args)
        // Stop when this supervisor is gone, even killed with SIGKILL (no orphans holding the ports).
        .env(zl_node::EXIT_WITH_PARENT_ENV, "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

/// The last `lines` lines of a log.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Children {
    /// Start `bin args` as `name`, its output into `{logs}/{name}.log` (a fresh log).
    pub(crate) fn spawn(&mut self, name: &str, bin: &Path, args: &[String], logs: &Path) -> Result<()> {
        let log = logs.join(format!("{name}.log"));
        fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = start(bin, args, &log)?;
        self.all.push(Supervised {
            name: name.to_owned(),
            bin: bin.to_owned(),
            args: args.to_vec(),
            log,
            child,
            restarts: Restarts::new(Instant::now()),
            due: None,
        });
        Ok(())
    }

    /// Each child's name and pid.
    pub(crate) fn pids(&self) -> Vec<(String, u32)> {
        self.all.iter().map(|c| (c.name.clone(), c.child.id())).collect()
    }

    /// Look after the children: report and schedule the restart of those that exited, restart those due.
    pub(crate) fn look(&mut self, now: Instant) -> Look {
        let mut look = Look::default();
        for c in &mut self.all {
            if let Some(due) = c.due {
                if now < due {
                    continue;
                }
                c.due = None;
                let _ = fs::OpenOptions::new()
                    .append(true)
                    .open(&c.log)
                    .and_then(|mut f| std::io::Write::write_all(&mut f, b"\n---- zl up: restarted ----\n"));
                match start(&c.bin, &c.args, &c.log) {
                    Ok(child) => {
                        c.child = child;
                        c.restarts.restarted(now);
                        look.restarted = true;
                        eprintln!("zl up: {} restarted (pid {})", c.name, c.child.id());
                    }
                    Err(e) => {
                        look.give_up = Some(format!("{} could not be started again: {e:#}", c.name));
                    }
                }
                continue;
            }
            let Ok(Some(status)) = c.child.try_wait() else { continue };
            let end = tail(&c.log, 12);
            match c.restarts.exited(now) {
                Verdict::RestartIn(delay) => {
                    c.due = Some(now + delay);
                    eprintln!(
                        "zl up: {} exited ({status}); restarting it in {delay:?}. The end of {}:\n{end}",
                        c.name,
                        c.log.display()
                    );
                }
                Verdict::GiveUp(times) => {
                    look.give_up = Some(format!(
                        "{} keeps failing to start ({times} exits in a row, each soon after it started; last: \
                         {status}); the end of {}:\n{end}",
                        c.name,
                        c.log.display()
                    ));
                }
            }
        }
        look
    }

    /// SIGTERM every child, newest first (frontend, workers, orchestrators), each waited for before the next;
    /// whatever is still running after `grace` is killed.
    pub(crate) fn stop(&mut self, grace: Duration) {
        for c in self.all.iter_mut().rev() {
            if let Ok(None) = c.child.try_wait() {
                let _ = Command::new("kill").args(["-TERM", &c.child.id().to_string()]).status();
            }
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if let Ok(None) = c.child.try_wait() {
                eprintln!("zl up: {} did not stop within {grace:?}; killing it", c.name);
                let _ = c.child.kill();
            }
            let _ = c.child.wait();
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.all {
            let _ = c.child.kill();
            let _ = c.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_failures_back_off_then_give_up() {
        let t0 = Instant::now();
        let mut r = Restarts::new(t0);
        let mut now = t0;
        let mut delays = Vec::new();
        loop {
            now += Duration::from_secs(1);
            match r.exited(now) {
                Verdict::RestartIn(d) => {
                    delays.push(d);
                    now += d;
                    r.restarted(now);
                }
                Verdict::GiveUp(n) => {
                    assert_eq!(n, MAX_QUICK_FAILURES + 1);
                    break;
                }
            }
        }
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 4000]);
    }

    #[test]
    fn a_child_that_ran_a_while_is_restarted_quickly_forever() {
        let t0 = Instant::now();
        let mut r = Restarts::new(t0);
        let mut now = t0;
        for _ in 0..100 {
            now += STABLE_AFTER;
            assert_eq!(r.exited(now), Verdict::RestartIn(FIRST_DELAY));
            r.restarted(now);
        }
    }

    #[test]
    fn the_delay_is_capped() {
        let t0 = Instant::now();
        let mut r = Restarts { started: t0, quick_failures: 0 };
        for _ in 0..MAX_QUICK_FAILURES {
            if let Verdict::RestartIn(d) = r.exited(t0) {
                assert!(d <= MAX_DELAY);
            }
        }
    }
}
