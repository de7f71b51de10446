//! Progress while a level runs: a bar redrawn in place on a terminal, a plain line every few seconds otherwise (logs,
//! CI). The counting is lock-free; [`line`] is pure so its format is tested.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::record::Record;

/// Counters of the level under way.
#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicUsize,
    errors: AtomicUsize,
    tokens: AtomicUsize,
}

impl Progress {
    /// Count a finished request.
    pub fn done(&self, rec: &Record) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if !rec.ok() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.tokens.fetch_add(rec.output_tokens as usize, Ordering::Relaxed);
    }
}

/// One progress line: `label [#####.....] done/total, errors, tokens/s, elapsed`.
pub fn line(
    label: &str,
    done: usize,
    total: usize,
    errors: usize,
    tokens: usize,
    elapsed: Duration,
    bar: bool,
) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 { tokens as f64 / secs } else { 0.0 };
    let stats = format!("{done}/{total} requests, {errors} errors, {rate:.1} output tokens/s, {secs:.0} s");
    if !bar {
        return format!("{label}: {stats}");
    }
    const WIDTH: usize = 30;
    let filled = (done * WIDTH).checked_div(total).unwrap_or(0).min(WIDTH);
    format!("{label} [{}{}] {stats}", "#".repeat(filled), ".".repeat(WIDTH - filled))
}

/// Draws the progress of a level until dropped.
#[derive(Debug)]
pub struct Ticker {
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
    tty: bool,
}

impl Ticker {
    /// Start drawing `progress` for a level of `total` requests, on stderr.
    pub fn start(label: String, total: usize, progress: Arc<Progress>, quiet: bool) -> Ticker {
        use std::io::IsTerminal;
        let tty = std::io::stderr().is_terminal();
        let stop = Arc::new(AtomicBool::new(false));
        let task = (!quiet).then(|| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let every = if tty { Duration::from_millis(250) } else { Duration::from_secs(5) };
                loop {
                    tokio::time::sleep(every).await;
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let text = line(
                        &label,
                        progress.done.load(Ordering::Relaxed),
                        total,
                        progress.errors.load(Ordering::Relaxed),
                        progress.tokens.load(Ordering::Relaxed),
                        started.elapsed(),
                        tty,
                    );
                    let mut err = std::io::stderr().lock();
                    let _ = if tty { write!(err, "\r\x1b[2K{text}") } else { writeln!(err, "{text}") };
                    let _ = err.flush();
                }
            })
        });
        Ticker { stop, task, tty }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.task.take() {
            t.abort();
            if self.tty {
                let _ = write!(std::io::stderr(), "\r\x1b[2K");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        let plain = line("4 clients", 5, 20, 1, 100, Duration::from_secs(10), false);
        assert_eq!(plain, "4 clients: 5/20 requests, 1 errors, 10.0 output tokens/s, 10 s");
        let bar = line("x", 10, 20, 0, 0, Duration::ZERO, true);
        assert!(bar.starts_with("x [###############...............] 10/20"), "{bar}");
        assert!(line("x", 0, 0, 0, 0, Duration::ZERO, true).contains("[......"));
    }
}
