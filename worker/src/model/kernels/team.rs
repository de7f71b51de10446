//! The forward pass's fork-join: the pool's threads kept on call for the length of one step.
//!
//! A step of one sequence hands the pool about five parallel regions per layer (150 for SmolLM2), each tens of
//! microseconds of work. Between two of them the leader runs the serial parts (norms, RoPE, the KV writes) for a
//! few microseconds, long enough for rayon's idle threads to go to sleep on a futex, so every region paid a wake-up
//! (a system call, and on a VM an inter-processor interrupt): `perf` showed a tenth of the worker's time in
//! `futex_wake` / `futex_wait` at one sequence, and two threads decoded 1.48x one thread's speed where the read
//! bandwidth doubles. llama.cpp keeps its threads polling for the same reason.
//!
//! [`scope`] runs a step with the other pool threads as *helpers*: each waits for the leader's next region by
//! polling (then yielding, then parking after [`PARK_AFTER`] without work, so a worker sharing its cores with other
//! processes gives them back between steps and during long serial parts), claims tasks from a shared counter
//! alongside the leader, and goes back to waiting. [`map`] and [`for_each`] hand a region to the team when called
//! on its leader, and fall back to rayon elsewhere; a call from inside a task runs inline. Which thread runs a task
//! never changes a result: every task computes its own outputs (the kernels' batch invariance).

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock, RwLockWriteGuard};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use rayon::prelude::*;

/// Polling (a `pause` per round) this long before yielding the core between polls.
const SPIN_FOR: Duration = Duration::from_micros(20);
/// Without work this long, a helper parks until the leader posts a region (a wake-up then costs what rayon's does).
const PARK_AFTER: Duration = Duration::from_micros(200);

/// One region: `tasks` calls of `run`, tagged with the epoch it was posted in.
struct Job {
    epoch: usize,
    tasks: usize,
    /// The leader's closure, its lifetime erased: valid while the job is in the slot (the leader takes it out,
    /// under the write lock, before its call returns).
    run: *const (dyn Fn(usize) + Sync + 'static),
}

// SAFETY: `run` points to a `Sync` closure, used only while the job is in the slot (see `Job::run`).
#[allow(unsafe_code)]
unsafe impl Send for Job {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for Job {}

/// The state the leader and its helpers share for one step.
struct Team {
    /// Bumped after each region is posted; helpers wait for it to move.
    epoch: AtomicUsize,
    /// The current region; helpers read it under the read lock, the leader replaces it under the write lock.
    job: RwLock<Option<Job>>,
    /// The next unclaimed task of the current region.
    next: AtomicUsize,
    /// Tasks of the current region finished (successfully or not).
    done: AtomicUsize,
    /// The first panic of a task in this region, raised again on the leader.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    quit: AtomicBool,
    /// Helpers parked (or about to park); the leader wakes them when it posts.
    sleepers: AtomicUsize,
    /// Parks ended by a region (or the step's end).
    wakes: AtomicUsize,
    helpers: Mutex<Vec<Thread>>,
}

thread_local! {
    /// The team this thread leads, while in [`scope`].
    static LEADING: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
    /// Set while this thread runs a team task: a region inside a task runs inline.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` (one forward step) on a pool thread with the pool's other threads as helpers of its regions.
pub fn scope<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let threads = rayon::current_num_threads();
    let team = Team {
        epoch: AtomicUsize::new(0),
        job: RwLock::new(None),
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panic: Mutex::new(None),
        quit: AtomicBool::new(false),
        sleepers: AtomicUsize::new(0),
        wakes: AtomicUsize::new(0),
        helpers: Mutex::new(Vec::with_capacity(threads)),
    };
    rayon::scope(|s| {
        for _ in 1..threads {
            s.spawn(|_| team.help());
        }
        // Helpers leave when the step ends, however it ends (a panic included), so the scope can close.
        let _release = Release(&team);
        let outer = LEADING.with(|l| l.replace(&team));
        let result = catch_unwind(AssertUnwindSafe(f));
        LEADING.with(|l| l.set(outer));
        result.unwrap_or_else(|payload| resume_unwind(payload))
    })
}

/// Sets `quit` and wakes every helper when the step ends.
struct Release<'a>(&'a Team);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.quit.store(true, Ordering::SeqCst);
        self.0.epoch.fetch_add(1, Ordering::SeqCst);
        self.0.wake();
    }
}

/// `f` over `items`, in parallel (on the step's team, or rayon's pool outside one), the results in order.
pub fn map<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync + Send) -> Vec<R> {
    if items.len() <= 1 || IN_TASK.with(Cell::get) {
        return items.into_iter().map(f).collect();
    }
    let leading = LEADING.with(Cell::get);
    if leading.is_null() {
        return items.into_par_iter().map(f).collect();
    }
    // SAFETY: `LEADING` is set only inside `scope`, whose team outlives the call to `f` that reached here.
    #[allow(unsafe_code)]
    let team = unsafe { &*leading };
    let slots = Slots(items.into_iter().map(|t| UnsafeCell::new((Some(t), None))).collect());
    team.run(slots.0.len(), &|i| {
        // SAFETY: task `i` is claimed once (`Team::work`), so this is the only reference to its slot (`Slots`).
        #[allow(unsafe_code)]
        let slot = unsafe { &mut *slots.slot(i) };
        if let Some(item) = slot.0.take() {
            slot.1 = Some(f(item));
        }
    });
    slots.0.into_iter().map(|s| s.into_inner().1.expect("every task ran")).collect()
}

/// Each task's item, then its result. Task `i` alone touches slot `i` during the region (each index is claimed
/// once, by the shared counter in `Team::work`); the leader wrote the items before posting the region and reads the
/// results after every task is done (`done` counted with release, read with acquire ordering). A panicking task
/// leaves its slot half done, and the leader then raises the panic instead of reading them.
struct Slots<T, R>(Vec<UnsafeCell<(Option<T>, Option<R>)>>);

impl<T, R> Slots<T, R> {
    fn slot(&self, i: usize) -> *mut (Option<T>, Option<R>) {
        self.0[i].get()
    }
}

// SAFETY: no two threads touch one slot at once (above), and items and results are `Send`.
#[allow(unsafe_code)]
unsafe impl<T: Send, R: Send> Sync for Slots<T, R> {}

/// `f` for each of `items`, in parallel as [`map`].
pub fn for_each<T: Send>(items: Vec<T>, f: impl Fn(T) + Sync + Send) {
    map(items, f);
}

impl Team {
    /// The leader's side of one region: post it, work on it, wait for the helpers' tasks, take it back.
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let epoch = self.epoch.load(Ordering::Relaxed) + 1;
        {
            let mut slot = self.write();
            self.next.store(0, Ordering::Relaxed);
            self.done.store(0, Ordering::Relaxed);
            // SAFETY: only the lifetime is erased; the job leaves the slot (under the write lock, so no helper
            // holds it) before this function returns, and `f` outlives this function.
            #[allow(unsafe_code)]
            let run = unsafe {
                std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const (dyn Fn(usize) + Sync + 'static)>(f)
            };
            *slot = Some(Job { epoch, tasks, run });
        }
        self.epoch.store(epoch, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.wake();
        }
        self.work(f, tasks);
        let mut waited = Wait::new();
        while self.done.load(Ordering::Acquire) < tasks {
            waited.pause();
        }
        *self.write() = None;
        let panic = self.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
    }

    /// Claim and run tasks of the current region until none is left.
    fn work(&self, f: &(dyn Fn(usize) + Sync), tasks: usize) {
        let outer = IN_TASK.with(|t| t.replace(true));
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= tasks {
                break;
            }
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                self.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(payload);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
        IN_TASK.with(|t| t.set(outer));
    }

    /// A helper: wait for each region, work on it, until the step ends.
    fn help(&self) {
        self.helpers.lock().unwrap_or_else(|e| e.into_inner()).push(thread::current());
        let mut seen = 0;
        loop {
            let epoch = self.next_epoch(seen);
            if self.quit.load(Ordering::SeqCst) {
                return;
            }
            seen = epoch;
            // Fails only while the leader replaces the job: then this region is over or the next is coming.
            if let Ok(slot) = self.job.try_read()
                && let Some(job) = slot.as_ref()
                && job.epoch == epoch
            {
                // SAFETY: the job is in the slot and this thread holds the read lock (see `Job::run`).
                #[allow(unsafe_code)]
                let f = unsafe { &*job.run };
                self.work(f, job.tasks);
            }
        }
    }

    /// Wait until the epoch moves past `seen` (polling, yielding, then parked) and return it.
    fn next_epoch(&self, seen: usize) -> usize {
        let mut waited = Wait::new();
        loop {
            let epoch = self.epoch.load(Ordering::Acquire);
            if epoch != seen {
                return epoch;
            }
            if !waited.long {
                waited.pause();
                continue;
            }
            // Announce the park before the last look, so a leader posting now either is seen here or sees us.
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            while self.epoch.load(Ordering::SeqCst) == seen {
                thread::park();
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
            self.wakes.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn wake(&self) {
        for helper in self.helpers.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            helper.unpark();
        }
    }

    /// The job slot for writing: helpers hold it only between claims, so this polls rather than parks.
    fn write(&self) -> RwLockWriteGuard<'_, Option<Job>> {
        let mut waited = Wait::new();
        loop {
            match self.job.try_write() {
                Ok(slot) => return slot,
                Err(std::sync::TryLockError::Poisoned(e)) => return e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => waited.pause(),
            }
        }
    }
}

/// A short wait: `pause` for [`SPIN_FOR`], then yield the core between looks; `long` once it has lasted
/// [`PARK_AFTER`].
struct Wait {
    start: Instant,
    rounds: u32,
    yielding: bool,
    long: bool,
}

impl Wait {
    fn new() -> Self {
        Wait { start: Instant::now(), rounds: 0, yielding: false, long: false }
    }

    fn pause(&mut self) {
        if self.yielding {
            thread::yield_now();
            self.long = self.start.elapsed() >= PARK_AFTER;
            return;
        }
        std::hint::spin_loop();
        self.rounds += 1;
        // The clock every 64 rounds: a look costs about as much as a few pauses.
        if self.rounds.is_multiple_of(64) && self.start.elapsed() >= SPIN_FOR {
            self.yielding = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn map_keeps_order_on_the_team_and_outside_it() {
        let items: Vec<u64> = (0..100).collect();
        let expected: Vec<u64> = items.iter().map(|x| x * x).collect();
        assert_eq!(map(items.clone(), |x| x * x), expected);
        let inside = scope(|| (0..50).map(|_| map(items.clone(), |x| x * x)).collect::<Vec<_>>());
        assert!(inside.iter().all(|r| *r == expected));
    }

    #[test]
    fn every_task_runs_once_over_many_regions_and_nested_calls_run_inline() {
        let count = AtomicU64::new(0);
        scope(|| {
            for region in 0..2000u64 {
                for_each((0..(region % 7)).collect(), |i| {
                    count.fetch_add(1 << (i * 8), Ordering::Relaxed);
                    // A region inside a task runs on this thread.
                    let inner = map(vec![1u64, 2, 3], |x| x + 1);
                    assert_eq!(inner, vec![2, 3, 4]);
                });
            }
        });
        // Region r runs tasks 0..r%7: task i ran once per region with r%7 > i.
        let expected: u64 = (0..2000u64).map(|r| (0..r % 7).map(|i| 1u64 << (i * 8)).sum::<u64>()).sum();
        assert_eq!(count.load(Ordering::Relaxed), expected);
    }

    #[test]
    fn a_task_panic_reaches_the_leader_and_the_team_stays_usable() {
        let caught = catch_unwind(|| {
            scope(|| {
                for_each((0..8).collect(), |i: i32| assert!(i != 5, "task five"));
            })
        });
        assert!(caught.is_err());
        // The pool is not left with spinning helpers: a later step runs normally.
        assert_eq!(scope(|| map((0..8).collect(), |x: i32| x + 1)), (1..9).collect::<Vec<_>>());
    }

    /// The threads that ran a region of tasks long enough that every member of the team takes some.
    fn threads_of_a_slow_region() -> std::collections::HashSet<thread::ThreadId> {
        map((0..8).collect(), |_: u32| {
            thread::sleep(Duration::from_millis(2));
            thread::current().id()
        })
        .into_iter()
        .collect()
    }

    #[test]
    fn helpers_take_tasks_and_wake_from_parking_for_the_next_region() {
        let threads = rayon::current_num_threads().min(8);
        if threads < 2 {
            eprintln!("skipped: the pool has one thread");
            return;
        }
        // Bounded waits: a loaded machine may start a helper late, never never.
        let eventually = |what: &str, ok: &dyn Fn() -> bool| {
            let start = Instant::now();
            while !ok() {
                assert!(start.elapsed() < Duration::from_secs(10), "{what}");
                thread::sleep(Duration::from_micros(100));
            }
        };
        scope(|| {
            eventually("every helper takes tasks", &|| threads_of_a_slow_region().len() == threads);
            // SAFETY: inside `scope`, this thread leads the team.
            #[allow(unsafe_code)]
            let team = unsafe { &*LEADING.with(Cell::get) };
            for _ in 0..3 {
                eventually("idle helpers park", &|| team.sleepers.load(Ordering::SeqCst) == threads - 1);
                let wakes = team.wakes.load(Ordering::Relaxed);
                assert_eq!(map((0..16).collect(), |x: u32| x * 2), (0..16).map(|x| x * 2).collect::<Vec<_>>());
                eventually("a region wakes them", &|| team.wakes.load(Ordering::Relaxed) >= wakes + threads - 1);
            }
            eventually("woken helpers take tasks", &|| threads_of_a_slow_region().len() == threads);
        });
    }
}
