//! Faults as operators and attackers meet them, end to end on real processes: a worker killed under load, and
//! what the frontend does with hostile or sloppy HTTP. Every bound here is a promise of docs/operations.md
//! ("Fault detection"), not a speed target.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use zl_e2e::{SmallCluster, http, http_stream, metric_sum, request, signal, small_cluster};

const MODEL: &str = "smollm2-135m-instruct";
const KEY: &str = "sk-zl-e2e-faults-0123456789";

fn body(max_tokens: u32, stream: bool, temperature: f32, content: &str) -> String {
    serde_json::json!({
        "model": MODEL, "max_tokens": max_tokens, "stream": stream, "temperature": temperature,
        "messages": [{"role": "user", "content": content}],
    })
    .to_string()
}

/// A long, seeded story: the same text on every run (sampling is seeded and batch-invariant), hundreds of tokens, so
/// that it is still streaming when the worker dies a moment after every story's first text never depends on luck.
fn story(i: u32) -> String {
    serde_json::json!({
        "model": MODEL, "max_tokens": 1500, "stream": true, "temperature": 0.7, "seed": 7 + i,
        "messages": [{"role": "user", "content": format!("Write a very long story about mountain number {i}.")}],
    })
    .to_string()
}

/// The frontend's counter `name` (from its internal metrics address).
fn frontend_counter(http_addr: SocketAddr, name: &str) -> f64 {
    metric_sum(&zl_e2e::frontend_metrics(http_addr), name)
}

/// What a streaming request saw: its worker, the body after its first text, and when the body ended.
struct StreamEnd {
    worker: String,
    rest: String,
    ended: Instant,
}

#[test]
fn a_worker_killed_under_load_costs_its_requests_seconds_and_new_requests_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // The orchestrator's default heartbeat timeout (1 s) is part of what is tested. Migration is off: what is
    // timed here is how soon a dead worker's streams end (with it on they go on elsewhere: migration.rs).
    let ids = ["worker-a", "worker-b"];
    let SmallCluster { mut orch, mut workers, mut frontend, http: http_addr } =
        small_cluster(dir.path(), &ids, &[], &["--migration-limit", "0"], KEY);

    // Load: six long streams, each told apart by its prompt so the policy spreads them. Each thread reports its
    // worker once text flows, then how its body ended.
    let (started_tx, started_rx) = mpsc::channel::<String>();
    let (ended_tx, ended_rx) = mpsc::channel::<StreamEnd>();
    for i in 0..6 {
        let (started_tx, ended_tx) = (started_tx.clone(), ended_tx.clone());
        std::thread::spawn(move || {
            let headers = [("x-api-key", KEY)];
            let mut stream =
                http_stream(http_addr, "POST", "/v1/messages", &headers, &story(i)).expect("the frontend answers");
            if stream.status != 200 {
                let status = stream.status;
                panic!("{status}: {}", stream.rest());
            }
            let worker = stream.header("x-zl-worker").unwrap().to_owned();
            let mut seen = String::new();
            while !seen.contains("content_block_delta") {
                seen.push_str(&stream.next_piece().expect("the stream continues"));
            }
            started_tx.send(worker.clone()).unwrap();
            let rest = stream.rest();
            let _ = ended_tx.send(StreamEnd { worker, rest, ended: Instant::now() });
        });
    }
    let serving: Vec<String> = (0..6).map(|_| started_rx.recv_timeout(Duration::from_secs(120)).unwrap()).collect();
    let victim_id = serving[0].clone();
    let victim = ids.iter().position(|id| *id == victim_id).unwrap();
    let survivor_id = ids[1 - victim];
    let on_victim = serving.iter().filter(|w| **w == victim_id).count();

    let mut killed = workers[victim].take().unwrap();
    signal(killed.proc.0.id(), "-KILL");
    let killed_at = Instant::now();
    let _ = killed.proc.0.wait();
    drop(killed);

    // New requests in the second after the kill: each is answered (by the survivor, retried there before its first
    // token if it was routed to the dead worker) or refused with a clean 529, within 3 s of being sent.
    let fresh: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(250 * i));
                let sent = Instant::now();
                let headers = [("x-api-key", KEY)];
                let mut stream = http_stream(
                    http_addr,
                    "POST",
                    "/v1/messages",
                    &headers,
                    &body(8, true, 0.0, &format!("Say hello {i}.")),
                )
                .expect("the frontend answers");
                let waited = sent.elapsed();
                let worker = stream.header("x-zl-worker").map(str::to_owned);
                let rest = stream.rest();
                (stream.status, worker, waited, rest)
            })
        })
        .collect();
    for handle in fresh {
        let (status, worker, waited, rest) = handle.join().unwrap();
        eprintln!("a request sent after the kill: {status} from {worker:?} after {waited:?}");
        assert!(waited <= Duration::from_secs(3), "a request sent after the kill waited {waited:?}");
        match status {
            200 => {
                assert_eq!(worker.as_deref(), Some(survivor_id), "{rest}");
                assert!(rest.contains("message_stop"), "{rest}");
            }
            529 => assert!(rest.contains("overloaded_error"), "{rest}"),
            other => panic!("unexpected {other}: {rest}"),
        }
    }

    // Every stream the dead worker was serving ended with an error event within 3 s of the kill. A story on the
    // survivor may come to its end meanwhile (its text is fixed, not its length in seconds: faster kernels finish
    // it sooner), and then it ends whole.
    let mut ended_on_victim = 0;
    for _ in 0..6 {
        if ended_on_victim == on_victim {
            break;
        }
        let end = ended_rx.recv_timeout(Duration::from_secs(30)).expect("a stream on the dead worker ended");
        if end.worker != victim_id {
            assert!(end.rest.contains("message_stop"), "a stream on the survivor was cut: {}", end.rest);
            continue;
        }
        ended_on_victim += 1;
        let took = end.ended.duration_since(killed_at);
        eprintln!("a stream on the dead worker ended {took:?} after the kill");
        assert!(took <= Duration::from_secs(3), "a stream on the dead worker ended {took:?} after the kill");
        assert!(end.rest.contains("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"), "{}", end.rest);
        assert!(!end.rest.contains("message_stop"), "{}", end.rest);
    }
    assert_eq!(ended_on_victim, on_victim, "every stream on the dead worker ended");

    // From a second after the kill on, nothing is routed to the dead worker: no request needs a retry.
    std::thread::sleep((killed_at + Duration::from_millis(1200)).saturating_duration_since(Instant::now()));
    let retries = frontend_counter(http_addr, "zl_frontend_retries_total");
    for i in 0..6 {
        let r = request(
            http_addr,
            "POST",
            "/v1/messages",
            &[("x-api-key", KEY)],
            &body(4, false, 0.0, &format!("Name a colour {i}.")),
        )
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.header("x-zl-worker"), Some(survivor_id));
    }
    assert_eq!(
        frontend_counter(http_addr, "zl_frontend_retries_total"),
        retries,
        "a request was routed to the dead worker"
    );
    orch.proc.assert_running("zl-orchestrator");
    frontend.assert_running("zl-frontend");
}

/// The peak resident memory of a process, in MiB (`VmHWM`).
fn peak_rss_mib(pid: u32) -> f64 {
    proc_status_mib(pid, "VmHWM:")
}

/// A memory figure of `/proc/PID/status`, in MiB.
fn proc_status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}

#[test]
fn huge_prompts_are_refused_fast_in_bounded_memory_while_small_requests_flow() {
    let dir = tempfile::tempdir().unwrap();
    // No operator byte limit: the context window's own byte bound must refuse them.
    // (Bound whole: a field left out of a pattern would drop, and stop, its process at once.)
    let SmallCluster { orch: _orch, workers: _workers, mut frontend, http: http_addr } =
        small_cluster(dir.path(), &["worker-a"], &[], &["--max-prompt-bytes", "0"], KEY);
    let deadline = Instant::now() + Duration::from_secs(60);
    // A first small request loads the model card.
    loop {
        let r = request(http_addr, "POST", "/v1/messages", &[("x-api-key", KEY)], &body(4, false, 0.0, "Hi."));
        if r.as_ref().map(|r| r.status) == Some(200) {
            break;
        }
        assert!(Instant::now() < deadline, "the frontend never answered: {r:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = peak_rss_mib(frontend.0.id());

    // Three 30 MB prompts at once (under the 32 MB body limit), while small requests keep coming.
    let huge = std::sync::Arc::new(body(16, false, 0.0, &"All work and no play. ".repeat(30 * 1024 * 1024 / 22)));
    assert!(huge.len() > 30 * 1024 * 1024 && huge.len() < 32 * 1024 * 1024);
    let senders: Vec<_> = (0..3)
        .map(|_| {
            let huge = huge.clone();
            std::thread::spawn(move || {
                let sent = Instant::now();
                let r = request(http_addr, "POST", "/v1/messages", &[("x-api-key", KEY)], &huge).unwrap();
                (r, sent.elapsed())
            })
        })
        .collect();
    let mut small = Vec::new();
    while !senders.iter().all(|s| s.is_finished()) {
        let sent = Instant::now();
        let (status, _) = http(http_addr, "GET", "/v1/models", &[("x-api-key", KEY)], "").unwrap();
        assert_eq!(status, 200);
        small.push(sent.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    for s in senders {
        let (r, took) = s.join().unwrap();
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains("prompt is too long") && r.body.contains("bytes of text cannot fit"), "{}", r.body);
        assert!(took <= Duration::from_secs(2), "a huge prompt's 400 took {took:?}");
    }
    let slowest = small.iter().max().copied().unwrap_or_default();
    assert!(slowest <= Duration::from_millis(500), "a small request took {slowest:?} beside the huge ones");
    let peak = peak_rss_mib(frontend.0.id());
    eprintln!(
        "frontend peak RSS {before:.0} MiB before, {peak:.0} MiB after three 30 MB prompts; slowest small request {slowest:?}"
    );
    assert!(peak < 512.0, "the frontend's peak RSS reached {peak:.0} MiB");
    frontend.assert_running("zl-frontend");
    // And it still serves.
    let r =
        request(http_addr, "POST", "/v1/messages", &[("x-api-key", KEY)], &body(4, false, 0.0, "Hi again.")).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    // The bodies' memory is given back, not kept for the next burst.
    let now = proc_status_mib(frontend.0.id(), "VmRSS:");
    eprintln!("frontend RSS afterwards {now:.0} MiB");
    assert!(now < before + 128.0, "the frontend kept {now:.0} MiB (it used {before:.0} MiB before)");
}
