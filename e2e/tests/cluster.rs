//! The whole cluster as users run it: `zl up` (banner, readiness, concurrent streams, the response cache, a client
//! disconnect freeing the worker's KV blocks, `zl chat`, Ctrl-C stopping everything, a dying child stopping the
//! whole), and separate tier processes surviving a worker killed mid-stream and its restart.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use zl_e2e::{
    SmallCluster, alive, bin, free_tcp, http_stream, metric_sum, metrics, pids, read_state, request, signal,
    small_cluster, start_worker_args, wait_restarted, wait_up,
};

const MODEL: &str = "smollm2-135m-instruct";
const KEY: &str = "sk-zl-e2e-cluster-0123456789";

fn body(max_tokens: u32, stream: bool, temperature: f32, content: &str) -> String {
    serde_json::json!({
        "model": MODEL, "max_tokens": max_tokens, "stream": stream, "temperature": temperature,
        "system": "You are a helpful assistant.",
        "messages": [{"role": "user", "content": content}],
    })
    .to_string()
}

fn post(addr: SocketAddr, body: &str) -> zl_e2e::HttpResponse {
    request(addr, "POST", "/v1/messages", &[("x-api-key", KEY)], body).expect("the frontend answers")
}

fn wait_exit(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        assert!(Instant::now() < deadline, "did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A worker metric summed over the cluster's workers.
fn workers_sum(state: &Value, name: &str) -> f64 {
    state["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let addr: SocketAddr = w["metrics"].as_str().unwrap().parse().unwrap();
            metric_sum(&metrics(addr).unwrap_or_default(), name)
        })
        .sum()
}

fn kv_used(state: &Value) -> f64 {
    workers_sum(state, "zl_worker_kv_blocks_used")
}

/// Wait (bounded) until the workers hold no more KV blocks than `baseline`.
fn wait_kv_freed(state: &Value, baseline: f64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while kv_used(state) > baseline {
        assert!(Instant::now() < deadline, "KV blocks not freed after the client left: {}", kv_used(state));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn zl_up_runs_serves_and_stops_the_whole_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let http_addr = free_tcp();
    let out_path = dir.path().join("up.out");
    let err_path = dir.path().join("up.err");
    let mut up = Command::new(bin("zl"))
        .args(["up", "--data-dir", data.to_str().unwrap(), "--http-addr", &http_addr.to_string()])
        .args(["--api-key", KEY, "--workers", "2", "--orchestrators", "3", "--kv-memory-mb", "160"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let state = wait_up(&data, http_addr, &mut up);
    let tiers = pids(&state);
    assert_eq!(tiers.len(), 6, "3 orchestrators, 2 workers, 1 frontend: {tiers:?}");
    // A healthy fresh cluster counts no failure of any kind: no failed connection, heartbeat, sync or fail-over
    // (zl up starts the workers and the frontend once the orchestrators listen; a handshake a client gave up on
    // while its peer was starting is `abandoned`, which is not one).
    let mut scrapes: Vec<String> = ["orchestrators", "workers"]
        .iter()
        .flat_map(|tier| state[tier].as_array().unwrap().clone())
        .map(|n| metrics(n["metrics"].as_str().unwrap().parse().unwrap()).unwrap())
        .collect();
    scrapes.push(zl_e2e::frontend_metrics(http_addr));
    for text in &scrapes {
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.ends_with(" 0")) {
            let failed = line.split(['{', ' ']).next().is_some_and(|name| name.contains("fail"))
                || ["\"failed\"", "\"tls_failed\"", "\"refused\"", "\"handshake_refused\"", "\"unreachable\""]
                    .iter()
                    .any(|bad| line.starts_with("zl_rpc_connections_total") && line.contains(bad));
            assert!(!failed, "a fresh cluster counts a failure: {line}");
        }
    }
    // The three orchestrators are one Raft group with a leader.
    let admin_addr = state["orchestrators"][2]["admin"].as_str().unwrap().parse().unwrap();
    let listed = zl_e2e::admin_as(&data.join("tls"), "zl-up", admin_addr, &["members", "list"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert_eq!(listed.matches("leader").count(), 1, "{listed}");
    assert_eq!(listed.matches("follower").count(), 2, "{listed}");
    // The banner follows cluster.json closely; give it a moment.
    std::thread::sleep(Duration::from_millis(500));
    let banner = std::fs::read_to_string(&out_path).unwrap();
    for want in ["zerolayer is up", KEY, MODEL, &format!("http://{http_addr}"), "curl ", "import anthropic"] {
        assert!(banner.contains(want), "the banner lacks {want:?}:\n{banner}");
    }

    // Two concurrent streams both complete.
    let streams: Vec<_> = (0..2)
        .map(|i| {
            std::thread::spawn(move || {
                post(http_addr, &body(24, true, 0.8, &format!("Tell me a short fact about number {i}.")))
            })
        })
        .collect();
    for s in streams {
        let r = s.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(r.body.starts_with("event: message_start"), "{}", r.body);
        assert!(r.body.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"), "{}", r.body);
    }

    // A deterministic request twice: the same answer, the second from the cache.
    let question = body(24, false, 0.0, "What is the capital of France?");
    let first = post(http_addr, &question);
    let second = post(http_addr, &question);
    assert_eq!((first.status, second.status), (200, 200), "{}", first.body);
    assert_eq!((first.header("x-zl-cache"), second.header("x-zl-cache")), (Some("miss"), Some("hit")));
    let content = |r: &zl_e2e::HttpResponse| serde_json::from_str::<Value>(&r.body).unwrap()["content"].clone();
    assert_eq!(content(&first), content(&second));
    assert!(content(&first)[0]["text"].as_str().unwrap().contains("Paris"), "{}", first.body);

    // The README's and the quick start's examples as written (address and key filled in) answer it too, with
    // their shipped defaults: the curl request bodies, and the Python scripts with the official SDKs.
    let url = format!("http://{http_addr}");
    for doc in ["README.md", "docs/quickstart.md"] {
        for example in zl_e2e::code_blocks(doc, "sh").iter().filter(|b| b.contains("curl ")) {
            let path = example.split("curl http://127.0.0.1:8080").nth(1).and_then(|r| r.split(' ').next()).unwrap();
            let json = example.split("-d '").nth(1).and_then(|rest| rest.split('\'').next()).unwrap();
            let r = request(http_addr, "POST", path, &[("x-api-key", KEY)], json).expect("the frontend answers");
            assert!(r.status == 200 && r.body.contains("Paris"), "{doc}: {path} {json}\n{}", r.body);
        }
        let scripts = zl_e2e::code_blocks(doc, "python");
        assert!(!scripts.is_empty(), "{doc} has a Python example");
        for script in scripts {
            let script = format!("KEY = {KEY:?}\n{}", script.replace("http://127.0.0.1:8080", &url));
            let out = Command::new(zl_e2e::python()).arg("-c").arg(&script).output().unwrap();
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && said.matches("Paris").count() >= script.matches("print(").count(),
                "{doc}:\n{script}\nsaid: {said}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    // Predictive streaming on and off: the same answer to a request whose output repeats its input.
    let copy =
        body(48, false, 0.0, "Repeat exactly: the quick brown fox jumps over the lazy dog, the lazy dog sleeps.");
    let ask = |on: &str| {
        let headers = [("x-api-key", KEY), ("x-zl-cache", "bypass"), ("x-zl-streaming-predicted", on)];
        request(http_addr, "POST", "/v1/messages", &headers, &copy).expect("the frontend answers")
    };
    let (on, off) = (ask("true"), ask("false"));
    assert_eq!((on.status, off.status), (200, 200), "{}", on.body);
    assert_eq!(content(&on), content(&off), "speculation changed the answer");
    assert_eq!(off.header("x-zl-predicted-draft-tokens"), Some("0"));
    let drafted: u64 = on.header("x-zl-predicted-draft-tokens").unwrap().parse().unwrap();
    let accepted: u64 = on.header("x-zl-predicted-accepted-tokens").unwrap().parse().unwrap();
    assert!(accepted <= drafted, "{accepted} of {drafted}");

    // A client that disconnects mid-stream frees the worker's KV blocks.
    let baseline = kv_used(&state);
    let mut stream = http_stream(
        http_addr,
        "POST",
        "/v1/messages",
        &[("x-api-key", KEY)],
        &body(2000, true, 0.8, "Write a very long story about the sea."),
    )
    .unwrap();
    assert_eq!(stream.status, 200);
    let mut seen = String::new();
    while seen.matches("content_block_delta").count() < 3 {
        seen.push_str(&stream.next_piece().expect("the stream continues"));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while kv_used(&state) <= baseline {
        assert!(Instant::now() < deadline, "the running sequence never showed in the KV figures");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(stream);
    wait_kv_freed(&state, baseline);

    // A 4k-token prompt: the headers and `message_start` arrive once the worker admits it, while its prefill is
    // still running (fewer prompt tokens prefilled than it has, no output token yet), not a minute later.
    let (prefilled, output) =
        (workers_sum(&state, "zl_worker_prefill_tokens_total"), workers_sum(&state, "zl_worker_output_tokens_total"));
    let long = format!(
        "{}Repeat the last sentence.",
        "The quick brown fox jumps over the lazy dog by the river. ".repeat(320)
    );
    let headers = [("x-api-key", KEY), ("x-zl-cache", "bypass")];
    let mut stream = http_stream(http_addr, "POST", "/v1/messages", &headers, &body(16, true, 0.0, &long)).unwrap();
    assert_eq!(stream.status, 200);
    let mut seen = String::new();
    while !seen.contains("\n\n") {
        seen.push_str(&stream.next_piece().expect("message_start arrives"));
    }
    let (now_prefilled, now_output) =
        (workers_sum(&state, "zl_worker_prefill_tokens_total"), workers_sum(&state, "zl_worker_output_tokens_total"));
    let start: Value = serde_json::from_str(seen.split("data: ").nth(1).unwrap().split('\n').next().unwrap()).unwrap();
    let prompt = start["message"]["usage"]["input_tokens"].as_f64().unwrap();
    assert!(seen.starts_with("event: message_start") && prompt >= 4000.0, "{seen}");
    assert!(now_prefilled - prefilled < prompt, "prefilled {} of {prompt} tokens", now_prefilled - prefilled);
    assert_eq!(now_output, output, "no output token before message_start");
    drop(stream);
    wait_kv_freed(&state, baseline);

    // zl chat and zl admin find the cluster through its data dir (ZL_DATA_DIR: no flags), with their shipped
    // defaults (zl chat: "You are a helpful assistant.", greedy).
    let zl = |args: &[&str]| {
        let mut cmd = Command::new(bin("zl"));
        cmd.args(args).env("ZL_DATA_DIR", &data).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        for var in ["ZL_ADMIN_ADDR", "ZL_TLS_DIR", "ZL_ADMIN_ID", "ZL_URL", "ZL_API_KEY"] {
            cmd.env_remove(var);
        }
        cmd.spawn().unwrap()
    };
    let mut chat = zl(&["chat"]);
    std::io::Write::write_all(chat.stdin.as_mut().unwrap(), b"What is the capital of France?\n\n").unwrap();
    let out = chat.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("Paris"), "{said}\n{}", String::from_utf8_lossy(&out.stderr));
    // Ctrl-C while an answer streams stops that answer, and the conversation goes on; Ctrl-C at the prompt quits.
    let mut chat = zl(&["chat", "--max-tokens", "2000"]);
    let mut input = chat.stdin.take().unwrap();
    std::io::Write::write_all(&mut input, b"Write a very long story about the sea.\n").unwrap();
    let pieces = {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let mut said = chat.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while let Ok(n @ 1..) = std::io::Read::read(&mut said, &mut buf) {
                let _ = tx.send(buf[..n].to_vec());
            }
        });
        rx
    };
    let mut seen = String::new();
    let mut read_until = |done: &dyn Fn(&str) -> bool, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(&seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match pieces.recv_timeout(left) {
                Ok(piece) => seen.push_str(&String::from_utf8_lossy(&piece)),
                Err(_) => panic!("zl chat: no {what}: {seen}"),
            }
        }
        seen.clone()
    };
    // The prompt `> `, then some of the answer; Ctrl-C stops it and the prompt comes back.
    read_until(&|s| s.len() > 40, "answer");
    signal(chat.id(), "-INT");
    read_until(&|s| s.ends_with("\n> "), "prompt after Ctrl-C");
    std::io::Write::write_all(&mut input, b"What is the capital of France?\n").unwrap();
    let all = read_until(&|s| s.matches("\n> ").count() >= 2, "second answer");
    let second = all.split("\n> ").nth(1).unwrap();
    assert!(!second.trim().is_empty(), "{all}");
    // At the prompt, Ctrl-C quits.
    signal(chat.id(), "-INT");
    let out = chat.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[stopped]") && out.status.code() == Some(130), "{:?} {err}", out.status);
    wait_kv_freed(&state, baseline);
    // `zl admin workers` names each worker, its KV cache's type as the worker registered it (`12/1456 f16`) and the
    // memory its model's weights take there (`... (98 MiB)`).
    let workers = &["admin", "workers"][..];
    let listed = [(workers, "worker-0"), (workers, " f16 "), (workers, " MiB)")];
    for (args, expect) in listed.into_iter().chain([(&["admin", "members", "list"][..], "leader")]) {
        let out = zl(args).wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains(expect),
            "zl {args:?}: {said}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // A child that dies is reported and restarted; the cluster serves on.
    let (name, pid) = tiers.iter().find(|(n, _)| n == "worker-1").cloned().unwrap();
    signal(pid, "-KILL");
    let restarted = wait_restarted(&data, &name, pid);
    let err = std::fs::read_to_string(&err_path).unwrap();
    assert!(err.contains(&format!("zl up: {name} exited")) && err.contains(&format!("{name} restarted")), "{err}");
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric_sum(&metrics(worker_metrics(&state, &name)).unwrap_or_default(), "zl_worker_registrations_total") < 1.0
    {
        assert!(Instant::now() < deadline, "the restarted worker never registered again");
        assert!(alive(restarted), "the restarted worker died");
        std::thread::sleep(Duration::from_millis(250));
    }

    // With three orchestrators, killing the Raft leader leaves the API serving throughout; it comes back too.
    // (A node may briefly not know the leader, e.g. after a pre-vote while the restarted worker loaded its model.)
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader_id: usize = loop {
        let listed = zl_e2e::admin_as(&data.join("tls"), "zl-up", admin_addr, &["members", "list"]);
        let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
        if let Some(id) =
            listed.lines().find(|l| l.contains("leader")).and_then(|l| l.split_whitespace().next()?.parse().ok())
        {
            break id;
        }
        assert!(Instant::now() < deadline, "no leader in {listed}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let leader = format!("orchestrator-{}", leader_id - 1);
    let leader_pid = pids(&read_state(&data)).into_iter().find(|(n, _)| *n == leader).unwrap().1;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut statuses = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let r = post(http_addr, &body(4, false, 0.0, &format!("Say {}.", statuses.len())));
                statuses.push((r.status, r.body));
            }
            statuses
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    signal(leader_pid, "-KILL");
    wait_restarted(&data, &leader, leader_pid);
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let statuses = client.join().unwrap();
    assert!(statuses.len() >= 3, "only {} requests were sent", statuses.len());
    for (status, body) in &statuses {
        assert_eq!(*status, 200, "a request failed while the leader was down: {body}");
    }

    // Ctrl-C (SIGINT to zl up) stops every child cleanly, restarted ones included.
    let now_running = pids(&read_state(&data));
    signal(up.id(), "-INT");
    assert!(wait_exit(&mut up, Duration::from_secs(60)).success(), "zl up did not stop cleanly");
    for (name, pid) in tiers.iter().chain(&now_running) {
        assert!(!alive(*pid), "{name} was left running");
    }
}

/// The metrics address of worker `name`.
fn worker_metrics(state: &Value, name: &str) -> SocketAddr {
    let w = state["workers"].as_array().unwrap().iter().find(|w| w["name"] == name).unwrap();
    w["metrics"].as_str().unwrap().parse().unwrap()
}

#[test]
fn a_worker_killed_mid_stream_fails_cleanly_and_the_cluster_recovers_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let ids = ["worker-a", "worker-b"];
    // With migration off (`--migration-limit 0`): the stream must then end cleanly. (On, it goes on on the other
    // worker: migration.rs.)
    let SmallCluster { mut orch, mut workers, mut frontend, http: http_addr } =
        small_cluster(dir.path(), &ids, &["--heartbeat-timeout-ms", "1500"], &["--migration-limit", "0"], KEY);
    let addrs: Vec<_> = workers.iter().map(|w| w.as_ref().map(|w| (w.quic, w.metrics)).unwrap()).collect();
    let orch_metrics = orch.metrics;
    let healthy = || metric_sum(&metrics(orch_metrics).unwrap_or_default(), "zl_workers{state=\"healthy\"}");

    // Kill the worker serving a stream, mid-stream: the client gets an `error` event, not a hang or a torn body.
    let mut stream = http_stream(
        http_addr,
        "POST",
        "/v1/messages",
        &[("x-api-key", KEY)],
        &body(2000, true, 0.8, "Write a very long story about mountains."),
    )
    .unwrap();
    assert_eq!(stream.status, 200);
    let serving = stream.header("x-zl-worker").unwrap().to_owned();
    let victim = ids.iter().position(|id| *id == serving).unwrap();
    let mut seen = String::new();
    while seen.matches("content_block_delta").count() < 2 {
        seen.push_str(&stream.next_piece().expect("the stream continues"));
    }
    let mut killed = workers[victim].take().unwrap();
    signal(killed.proc.0.id(), "-KILL");
    let _ = killed.proc.0.wait();
    drop(killed);
    let rest = stream.rest();
    assert!(rest.contains("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"), "{rest}");
    assert!(!rest.contains("message_stop"), "{rest}");

    // The next request is answered by the survivor (retried before its first token if routed to the dead one), or
    // refused with a clean 529 while the orchestrator still counts the dead worker.
    let next = post(http_addr, &body(8, false, 0.0, "Hello!"));
    match next.status {
        200 => assert_ne!(next.header("x-zl-worker"), Some(serving.as_str())),
        529 => assert!(next.body.contains("overloaded_error") && next.header("retry-after").is_some(), "{}", next.body),
        other => panic!("unexpected {other}: {}", next.body),
    }

    // Restart the killed worker: it registers again and the cluster is whole, nothing else restarted.
    let (quic, metrics) = addrs[victim];
    workers[victim] = Some(start_worker_args(dir.path(), ids[victim], &[orch.quic], (quic, metrics), &[]));
    let deadline = Instant::now() + Duration::from_secs(120);
    while healthy() < 2.0 {
        assert!(Instant::now() < deadline, "the restarted worker never became healthy again");
        std::thread::sleep(Duration::from_millis(250));
    }
    for i in 0..4 {
        let r = post(http_addr, &body(8, false, 0.5, &format!("Say hello {i}.")));
        assert_eq!(r.status, 200, "{}", r.body);
    }
    orch.proc.assert_running("zl-orchestrator");
    frontend.assert_running("zl-frontend");
}
