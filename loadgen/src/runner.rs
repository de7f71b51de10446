//! Running load levels: the thin async shell around the workload, the shapes and the clients. Each level starts
//! fresh (its own clock, session numbers continuing from the last level so no prompt repeats), sends at most its
//! request count within its duration, and waits for what it sent.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zl_common::sync::lock;

use crate::client::{Ask, Connection, Endpoint};
use crate::direct::DirectWorker;
use crate::load::{Shape, arrivals};
use crate::progress::Progress;
use crate::record::Record;
use crate::workload::{Session, Turn, Workload};

/// Where the requests go.
#[derive(Clone, Debug)]
pub enum Target {
    /// An HTTP endpoint speaking the Anthropic or OpenAI API.
    Http(Arc<Endpoint>),
    /// One worker over the cluster's RPC.
    Worker(Arc<DirectWorker>, Duration),
}

/// What to send.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The workload.
    pub workload: Workload,
    /// Model id.
    pub model: String,
    /// Sampling temperature.
    pub temperature: f32,
    /// Requests per level at most.
    pub requests: usize,
    /// Time per level at most (no new request after it).
    pub duration: Option<Duration>,
}

/// A client's connection to the target.
#[derive(Default)]
struct Conn(Connection);

impl Target {
    async fn send(&self, conn: &mut Conn, ask: &Ask<'_>, t0: Instant, due: Option<f64>) -> (Record, String) {
        match self {
            Target::Http(ep) => crate::client::send(&mut conn.0, ep, ask, t0, due).await,
            Target::Worker(w, timeout) => w.send(ask, t0, due, *timeout).await,
        }
    }
}

/// The state of one level, shared by its tasks.
struct Level {
    plan: Plan,
    target: Target,
    t0: Instant,
    next_session: AtomicU64,
    sent: AtomicUsize,
    records: Mutex<Vec<Record>>,
    progress: Arc<Progress>,
    pool: Mutex<Vec<Conn>>,
    stop: AtomicBool,
}

impl Level {
    /// Claim the right to send one more request: false once the count or the time is spent.
    fn claim(&self) -> bool {
        if self.stop.load(Ordering::Relaxed) || self.plan.duration.is_some_and(|d| self.t0.elapsed() >= d) {
            return false;
        }
        self.sent.fetch_add(1, Ordering::Relaxed) < self.plan.requests
    }

    /// Hold one conversation; `due` is when its first request was due (open loops).
    async fn converse(&self, conn: &mut Conn, session: &Session, mut due: Option<f64>) {
        let mut messages: Vec<Turn> = session.history.clone();
        for (turn, text) in session.user_turns.iter().enumerate() {
            if !self.claim() {
                return;
            }
            messages.push(Turn { role: "user".into(), content: text.clone() });
            let ask = Ask {
                model: session.model.as_deref().unwrap_or(&self.plan.model),
                system: session.system.as_deref(),
                messages: &messages,
                max_tokens: session.max_tokens,
                temperature: self.plan.temperature,
            };
            let (mut rec, answer) = self.target.send(conn, &ask, self.t0, due.take()).await;
            rec.session = session.id;
            rec.turn = turn as u32;
            let ok = rec.ok();
            self.progress.done(&rec);
            lock(&self.records).push(rec);
            if !ok {
                // A conversation whose answer is missing does not go on.
                return;
            }
            messages.push(Turn { role: "assistant".into(), content: answer });
        }
    }

    fn take_conn(&self) -> Conn {
        lock(&self.pool).pop().unwrap_or_default()
    }

    fn give_conn(&self, conn: Conn) {
        lock(&self.pool).push(conn);
    }
}

/// Run one level; its records, in the order they ended, and the first session number it left unused.
pub async fn run_level(
    plan: &Plan,
    target: &Target,
    shape: Shape,
    first_session: u64,
    progress: Arc<Progress>,
) -> (Vec<Record>, u64) {
    let level = Arc::new(Level {
        plan: plan.clone(),
        target: target.clone(),
        t0: Instant::now(),
        next_session: AtomicU64::new(first_session),
        sent: AtomicUsize::new(0),
        records: Mutex::new(Vec::with_capacity(plan.requests)),
        progress,
        pool: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
    });
    let mut tasks = tokio::task::JoinSet::new();
    match shape {
        Shape::Closed { clients } => {
            for _ in 0..clients {
                let level = level.clone();
                tasks.spawn(async move {
                    let mut conn = Conn::default();
                    while level.sent.load(Ordering::Relaxed) < level.plan.requests
                        && !level.stop.load(Ordering::Relaxed)
                    {
                        if level.plan.duration.is_some_and(|d| level.t0.elapsed() >= d) {
                            break;
                        }
                        let id = level.next_session.fetch_add(1, Ordering::Relaxed);
                        let session = level.plan.workload.session(id);
                        level.converse(&mut conn, &session, None).await;
                    }
                });
            }
        }
        Shape::Open { .. } | Shape::Replay { .. } => {
            // Sessions arrive on a seeded Poisson schedule, or a trace's (from this level's first session on); each
            // runs its turns back to back on a pooled connection.
            let times = match shape {
                Shape::Replay { speed } => {
                    let at = |i: u64| plan.workload.arrival(i).unwrap_or(0.0);
                    let start = at(first_session);
                    (first_session..first_session + plan.requests as u64).map(|i| (at(i) - start) / speed).collect()
                }
                _ => arrivals(shape.level(), plan.requests, plan.workload.seed.wrapping_add(first_session)),
            };
            for (k, at) in times.into_iter().enumerate() {
                let wait = Duration::from_secs_f64(at).saturating_sub(level.t0.elapsed());
                tokio::time::sleep(wait).await;
                if level.sent.load(Ordering::Relaxed) >= plan.requests
                    || plan.duration.is_some_and(|d| level.t0.elapsed() >= d)
                {
                    break;
                }
                // Session k of the level is the one due at its time (a trace's line at its own arrival).
                let id = first_session + k as u64;
                level.next_session.store(id + 1, Ordering::Relaxed);
                let level = level.clone();
                tasks.spawn(async move {
                    let session = level.plan.workload.session(id);
                    let mut conn = level.take_conn();
                    level.converse(&mut conn, &session, Some(at)).await;
                    level.give_conn(conn);
                });
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    level.stop.store(true, Ordering::Relaxed);
    (std::mem::take(&mut *lock(&level.records)), level.next_session.load(Ordering::Relaxed))
}
