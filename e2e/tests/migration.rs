//! Invisible failover, end to end on real processes: under a mixed load (streamed and complete answers, both APIs,
//! greedy and seeded sampling, a JSON-schema answer, predictive streaming on), one worker is SIGKILLed and
//! another SIGSTOPped. Every request still ends with 200 and its terminal event, and each one's whole answer is
//! byte-identical to the same request run alone on the undisturbed cluster: the frontend moved it to the
//! surviving worker, which continued after the tokens already sent exactly as the failed one would have. And a
//! rolling restart of every worker of a `zl up` cluster under load (SIGTERM each in turn: the drain lets short
//! requests finish and hands the rest over) harms no request either; nor does `zl admin drain --migrate`.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use zl_e2e::{
    SmallCluster, admin, http_stream, metric_sum, pids, read_state, signal, small_cluster, wait_restarted, zl_up,
};

const MODEL: &str = "smollm2-135m-instruct";
const KEY: &str = "sk-zl-e2e-migration-0123456789";

/// One request of the load: which API, its body, and whether it streams.
#[derive(Clone, Debug)]
struct Case {
    openai: bool,
    stream: bool,
    body: Value,
}

fn cases() -> Vec<Case> {
    let messages = |i: u32, what: &str| json!([{"role": "user", "content": format!("{what} (number {i})")}]);
    let anthropic = |i: u32, stream: bool, sampling: Value| {
        let mut body = json!({"model": MODEL, "max_tokens": 300, "stream": stream,
            "messages": messages(i, "Write a long story about a lighthouse keeper.")});
        body.as_object_mut().unwrap().extend(sampling.as_object().unwrap().clone());
        Case { openai: false, stream, body }
    };
    let openai = |i: u32, stream: bool, sampling: Value| {
        let mut body = json!({"model": MODEL, "max_tokens": 300, "stream": stream,
            "messages": messages(i, "Describe a long journey across the mountains.")});
        body.as_object_mut().unwrap().extend(sampling.as_object().unwrap().clone());
        Case { openai: true, stream, body }
    };
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "facts": {"type": "array",
        "items": {"type": "string"}}}, "required": ["city", "facts"]});
    vec![
        anthropic(1, true, json!({"temperature": 0.0})),
        anthropic(2, true, json!({"temperature": 0.8, "seed": 11})),
        anthropic(3, false, json!({"temperature": 0.7, "seed": 12})),
        anthropic(4, false, json!({"temperature": 0.0})),
        openai(5, true, json!({"temperature": 0.9, "seed": 13})),
        openai(6, true, json!({"temperature": 0.0})),
        openai(7, false, json!({"temperature": 0.6, "seed": 14})),
        openai(
            8,
            false,
            json!({"temperature": 0.0, "response_format": {"type": "json_schema",
            "json_schema": {"name": "city", "schema": schema}}}),
        ),
        anthropic(9, true, json!({"temperature": 0.5, "seed": 15})),
    ]
}

/// What a request got: status, the worker that started it, its whole text, and whether it ended with its
/// terminal event (`message_stop`, `[DONE]`, or a complete body).
#[derive(Debug)]
struct Answer {
    status: u16,
    worker: String,
    text: String,
    finished: bool,
}

/// Send `case`; `started` gets the worker's id once text flows (streams) or once the headers are in.
fn ask(http_addr: SocketAddr, case: &Case, started: &std::sync::mpsc::Sender<String>) -> Answer {
    let path = if case.openai { "/v1/chat/completions" } else { "/v1/messages" };
    // Headers: no response cache (the load repeats the reference runs), predictive streaming on.
    let headers = [("x-api-key", KEY), ("x-zl-cache", "bypass"), ("x-zl-streaming-predicted", "true")];
    let mut stream = http_stream(http_addr, "POST", path, &headers, &case.body.to_string()).expect("answered");
    let worker = stream.header("x-zl-worker").unwrap_or_default().to_owned();
    let status = stream.status;
    let _ = started.send(worker.clone());
    let body = stream.rest();
    if status != 200 {
        return Answer { status, worker, text: body, finished: false };
    }
    if !case.stream {
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        let text = if case.openai {
            v["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned()
        } else {
            v["content"].as_array().unwrap().iter().filter_map(|b| b["text"].as_str()).collect()
        };
        return Answer { status, worker, text, finished: true };
    }
    let (mut text, mut finished) = (String::new(), false);
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            finished = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
        if case.openai {
            if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
                text.push_str(t);
            }
            assert!(v.get("error").is_none(), "an error chunk: {data}");
        } else {
            match v["type"].as_str() {
                Some("content_block_delta") => text.push_str(v["delta"]["text"].as_str().unwrap_or_default()),
                Some("message_stop") => finished = true,
                Some("error") => panic!("an error event: {data}"),
                _ => {}
            }
        }
    }
    Answer { status, worker, text, finished }
}

#[test]
fn requests_on_a_killed_and_a_stopped_worker_finish_elsewhere_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let ids = ["worker-a", "worker-b", "worker-c"];
    let SmallCluster { mut orch, mut workers, mut frontend, http: http_addr } =
        small_cluster(dir.path(), &ids, &[], &[], KEY);
    let cases = cases();
    let (tx, _rx) = std::sync::mpsc::channel();

    // The reference: each request alone on the undisturbed cluster.
    let reference: Vec<Answer> = cases.iter().map(|c| ask(http_addr, c, &tx)).collect();
    for (c, a) in cases.iter().zip(&reference) {
        assert_eq!(a.status, 200, "{c:?}: {}", a.text);
        assert!(a.finished && a.text.len() > 40, "{c:?}: {a:?}");
    }

    // The load: the requests a quarter of a second apart (so that load reports spread them over the workers).
    // Once all have started, the worker serving most is killed and the next stopped.
    let (tx, rx) = std::sync::mpsc::channel();
    let handles: Vec<_> = cases
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, c)| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(250 * i as u64));
                ask(http_addr, &c, &tx)
            })
        })
        .collect();
    // Streams answer their headers at once; complete answers only at their end. Once every stream is in, the
    // workers' own gauges say who runs what.
    let streams = cases.iter().filter(|c| c.stream).count();
    let serving: Vec<String> = (0..streams).map(|_| rx.recv_timeout(Duration::from_secs(120)).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let running: Vec<f64> = workers
        .iter()
        .map(|w| {
            metric_sum(&zl_e2e::metrics(w.as_ref().unwrap().metrics).unwrap_or_default(), "zl_worker_running_sequences")
        })
        .collect();
    let mut busy: Vec<&str> = ids.to_vec();
    let index = |id: &str| ids.iter().position(|i| *i == id).unwrap();
    busy.sort_by(|a, b| running[index(b)].total_cmp(&running[index(a)]));
    assert!(running[index(busy[1])] >= 1.0, "the load is not on two workers: {running:?} ({serving:?})");
    let killed = workers[index(busy[0])].take().unwrap();
    let stopped = workers[index(busy[1])].as_ref().unwrap().proc.0.id();
    let migrations_before = metric_sum(&zl_e2e::frontend_metrics(http_addr), "zl_frontend_migrations_total");
    signal(killed.proc.0.id(), "-KILL");
    signal(stopped, "-STOP");
    let faulted = Instant::now();
    eprintln!("killed {} and stopped {} running {running:?} of {ids:?}", busy[0], busy[1]);

    let answers: Vec<Answer> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    eprintln!("every request answered {:?} after the faults", faulted.elapsed());
    signal(stopped, "-CONT");
    for ((c, a), want) in cases.iter().zip(&answers).zip(&reference) {
        assert_eq!(a.status, 200, "{c:?}: {}", a.text);
        assert!(a.finished, "{c:?} did not end with its terminal event: {a:?}");
        assert_eq!(a.text, want.text, "{c:?} (started on {}): not the undisturbed answer", a.worker);
    }
    let migrations = metric_sum(&zl_e2e::frontend_metrics(http_addr), "zl_frontend_migrations_total");
    let on_faulted = running[index(busy[0])] + running[index(busy[1])];
    eprintln!("{on_faulted} requests ran on the faulted workers; {} migrations", migrations - migrations_before);
    // Each faulted worker ran at least one request when the faults came (its gauge is a step old at most, so one
    // may have just finished): requests moved off both.
    assert!(migrations - migrations_before >= 2.0, "requests did not move off both faulted workers");
    drop(killed);
    orch.proc.assert_running("zl-orchestrator");
    frontend.assert_running("zl-frontend");
}

/// Wait (bounded) until `zl up`'s frontend counts `n` serving workers.
fn wait_serving(http_addr: SocketAddr, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = zl_e2e::http(http_addr, "GET", "/readyz", &[], "")
            .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
            .and_then(|v| v["serving_workers"].as_u64());
        if ready == Some(n) {
            return;
        }
        assert!(Instant::now() < deadline, "never {n} serving workers (last: {ready:?})");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_rolling_restart_of_every_worker_under_load_harms_no_request() {
    let dir = tempfile::tempdir().unwrap();
    // No drain wait: the requests running when a worker is stopped are handed over at once, which is what this
    // test is about (with a wait, a request might finish within it, and nothing would move).
    let (mut up, http_addr, state) =
        zl_up(dir.path(), "data", KEY, &["--workers", "3", "--kv-memory-mb", "96"], &[("ZL_DRAIN_TIMEOUT_S", "0")]);
    let data = dir.path().join("data");
    let cases = cases();
    let (tx, _rx) = std::sync::mpsc::channel();
    let reference: Vec<String> = cases.iter().map(|c| ask(http_addr, c, &tx).text).collect();

    // Three clients send the cases round and round until the restart is over.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..3)
        .map(|k| {
            let (cases, stop, tx) = (cases.clone(), stop.clone(), tx.clone());
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                let mut i = k * 3;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    answers.push((i % cases.len(), ask(http_addr, &cases[i % cases.len()], &tx)));
                    i += 1;
                }
                answers
            })
        })
        .collect();
    let migrations_before = metric_sum(&zl_e2e::frontend_metrics(http_addr), "zl_frontend_migrations_total");
    std::thread::sleep(Duration::from_secs(2));
    for (name, pid) in pids(&state).into_iter().filter(|(n, _)| n.starts_with("worker-")) {
        // Stopped while it runs a request (bounded wait), so that one is handed over.
        let addr: SocketAddr = read_state(&data)["workers"]
            .as_array()
            .and_then(|w| w.iter().find(|w| w["name"] == name.as_str()))
            .and_then(|w| w["metrics"].as_str()?.parse().ok())
            .expect("cluster.json names each worker's metrics address");
        let deadline = Instant::now() + Duration::from_secs(30);
        while zl_e2e::metrics(addr).is_none_or(|m| metric_sum(&m, "zl_worker_running_sequences") < 1.0) {
            assert!(Instant::now() < deadline, "{name} never ran a request");
            std::thread::sleep(Duration::from_millis(20));
        }
        signal(pid, "-TERM");
        let new = wait_restarted(&data, &name, pid);
        wait_serving(http_addr, 3);
        eprintln!("{name} restarted (pid {pid} -> {new})");
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let answers: Vec<(usize, Answer)> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    let migrations =
        metric_sum(&zl_e2e::frontend_metrics(http_addr), "zl_frontend_migrations_total") - migrations_before;
    eprintln!("{} requests during the restart, {migrations} migrations", answers.len());
    for (i, a) in &answers {
        assert_eq!(a.status, 200, "{:?}: {}", cases[*i], a.text);
        assert!(a.finished, "{:?} did not end with its terminal event: {a:?}", cases[*i]);
        assert_eq!(a.text, reference[*i], "{:?} (started on {}): not the undisturbed answer", cases[*i], a.worker);
    }
    assert!(answers.len() >= 3, "only {} requests were answered during the restart", answers.len());
    assert!(migrations >= 1.0, "no request was handed over by a draining worker");
    assert_eq!(read_state(&data)["workers"].as_array().map(Vec::len), Some(3));
    signal(up.0.id(), "-INT");
    let _ = up.0.wait();
}

/// The text of an Anthropic SSE body (its text deltas, in order), and whether it ended with `message_stop`.
fn sse_text(body: &str) -> (String, bool) {
    let mut text = String::new();
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let v: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
        assert_ne!(v["type"], "error", "an error event: {data}");
        if v["type"] == "content_block_delta" {
            text.push_str(v["delta"]["text"].as_str().unwrap_or_default());
        }
    }
    (text, body.contains("event: message_stop"))
}

#[test]
fn an_operator_drain_with_migrate_moves_running_requests_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ids = ["worker-a", "worker-b"];
    let SmallCluster { orch, workers, frontend: _frontend, http: http_addr } =
        small_cluster(dir.path(), &ids, &[], &[], KEY);
    let body = json!({"model": MODEL, "max_tokens": 300, "stream": true, "temperature": 0.8, "seed": 21,
        "messages": [{"role": "user", "content": "Write a long story about a river."}]})
    .to_string();
    let headers = [("x-api-key", KEY), ("x-zl-cache", "bypass")];
    let (want, done) = sse_text(&http_stream(http_addr, "POST", "/v1/messages", &headers, &body).unwrap().rest());
    assert!(done && want.len() > 100, "{want}");

    // The same request again; once its text flows, its worker is drained with --migrate.
    let mut stream = http_stream(http_addr, "POST", "/v1/messages", &headers, &body).unwrap();
    let worker = stream.header("x-zl-worker").unwrap().to_owned();
    let mut seen = String::new();
    while seen.matches("content_block_delta").count() < 3 {
        seen.push_str(&stream.next_piece().expect("the stream continues"));
    }
    let before =
        metric_sum(&zl_e2e::frontend_metrics(http_addr), "zl_frontend_migrations_total{cause=\"unavailable\"}");
    let said = admin(dir.path(), orch.admin, &["drain", &worker, "--migrate"]);
    assert!(said.contains("handed over"), "{said}");
    seen.push_str(&stream.rest());
    let (got, done) = sse_text(&seen);
    assert!(done, "{seen}");
    assert_eq!(got, want, "the moved answer is not the undisturbed one");
    let after = metric_sum(&zl_e2e::frontend_metrics(http_addr), "zl_frontend_migrations_total{cause=\"unavailable\"}");
    assert_eq!(after - before, 1.0, "moved once, because the worker handed it over");
    // Undrained, the worker takes requests again.
    admin(dir.path(), orch.admin, &["undrain", &worker]);
    let index = ids.iter().position(|id| *id == worker).unwrap();
    let wm = workers[index].as_ref().unwrap().metrics;
    let deadline = Instant::now() + Duration::from_secs(20);
    while zl_e2e::http(wm, "GET", "/readyz", &[], "").map(|r| r.0) != Some(200) {
        assert!(Instant::now() < deadline, "{worker} never took requests again");
        std::thread::sleep(Duration::from_millis(100));
    }
}
