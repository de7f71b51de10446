//! The audit log on a real cluster (`zl up`): one hash-chained record per request, the chain head committed to
//! the orchestrators; `zl audit verify` passes after traffic and names the record when one byte is changed, a
//! record is removed or the newest records are cut off; content logging seals prompts and answers under the
//! project's data key, and shredding the key leaves the chain valid and the content unreadable.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use zl_e2e::{request, up_admin, zl, zl_up};

const KEY: &str = "sk-zl-audit-test-key-0123456789abcd";
const SECRET_KEY: &str = "sk-zl-audit-secret-project-key-0123";
const PROMPT: &str = "The launch code is tangerine-47. Repeat it.";

fn ask(http: std::net::SocketAddr, key: &str, model: &str, content: &str) -> zl_e2e::HttpResponse {
    let body = serde_json::json!({"model": model, "max_tokens": 6, "temperature": 0,
        "messages": [{"role": "user", "content": content}]})
    .to_string();
    request(http, "POST", "/v1/messages", &[("x-api-key", key)], &body).expect("the frontend answers")
}

/// `zl audit ARGS` against the cluster in `data`.
fn audit(data: &Path, args: &[&str]) -> (bool, String) {
    let mut all = vec!["audit", "--data-dir", data.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = zl(&all);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn segment(dir: &Path) -> PathBuf {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files.pop().unwrap()
}

/// Rewrite the lines of the (only) segment in a copy of `chain` and verify the copy.
fn tampered(chain: &Path, scratch: &Path, name: &str, edit: impl Fn(&mut Vec<String>)) -> (bool, String) {
    let copy = scratch.join(name).join("frontend-0");
    copy_dir(chain, &copy);
    let seg = segment(&copy);
    let mut lines: Vec<String> = std::fs::read_to_string(&seg).unwrap().lines().map(str::to_owned).collect();
    edit(&mut lines);
    std::fs::write(&seg, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let data = scratch.join("data");
    audit(&data, &["verify", copy.to_str().unwrap()])
}

#[test]
fn the_chain_verifies_after_traffic_and_catches_every_tampering() {
    let dir = tempfile::tempdir().unwrap();
    let (mut up, http, state) = zl_up(dir.path(), "data", KEY, &[], &[]);
    let data = dir.path().join("data");
    let chain = Path::new(state["audit_dir"].as_str().unwrap()).join("frontend-0");
    let model = state["model"].as_str().unwrap();

    // Traffic: answers, a refusal after authentication (unknown model), and an unauthenticated call (no record).
    let mut rids = Vec::new();
    for i in 0..5 {
        let r = ask(http, KEY, model, &format!("Count to {i}."));
        assert_eq!(r.status, 200, "{}", r.body);
        rids.push(r.header("request-id").unwrap().to_owned());
    }
    assert_eq!(ask(http, KEY, "no-such-model", "hi").status, 404);
    assert_eq!(ask(http, "wrong-key-wrong-key-wrong", model, "hi").status, 401);

    // Wait until the frontend has committed its head (record 6) to the orchestrators.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, text) = audit(&data, &["verify", chain.to_str().unwrap()]);
        if ok && text.contains("reaches the committed head, record 6") {
            break;
        }
        assert!(Instant::now() < deadline, "the head was never committed: {text}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, export) = audit(&data, &["export", chain.to_str().unwrap()]);
    let records: Vec<serde_json::Value> = export.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 6);
    assert_eq!(records[0]["request_id"], rids[0].as_str());
    assert_eq!(records[0]["key_id"], "local");
    assert_eq!(records[0]["worker"], "worker-0");
    assert_eq!(records[0]["orchestrator"], "orchestrator-0");
    assert_eq!(records[0]["stop_reason"], "max_tokens");
    assert_eq!(records[0]["input_sha256"].as_str().unwrap().len(), 64);
    assert!(records[0]["output_tokens"].as_u64().unwrap() > 0);
    assert_eq!(records[5]["status"], 404);
    assert_eq!(records[5]["error_type"], "not_found_error");
    assert!(!export.contains("Count to"), "no plaintext by default");

    let scratch = tempfile::tempdir().unwrap();
    // The scratch copies are checked against the live cluster's heads.
    std::os::unix::fs::symlink(&data, scratch.path().join("data")).unwrap();
    let (ok, text) =
        tampered(&chain, scratch.path(), "byte", |l| l[2] = l[2].replacen("\"status\":200", "\"status\":201", 1));
    assert!(!ok && text.contains("line 3 (record 3)") && text.contains("hash mismatch"), "{text}");
    let (ok, text) = tampered(&chain, scratch.path(), "removed", |l| {
        l.remove(3);
    });
    assert!(!ok && text.contains("record 4") && text.contains("missing"), "{text}");
    let (ok, text) = tampered(&chain, scratch.path(), "truncated", |l| l.truncate(4));
    assert!(!ok && text.contains("truncated") && text.contains("record 6"), "{text}");
    let (ok, text) = tampered(&chain, scratch.path(), "untouched", |_| {});
    assert!(ok, "{text}");

    // Content logging: sealed under the project's key, readable with it, unreadable once it is shredded.
    up_admin(&data, &["project", "secret"]);
    up_admin(&data, &["keys", "create", "ks", "--project", "secret", "--secret", SECRET_KEY]);
    up_admin(&data, &["content-logging", "secret", "on"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let sealed_rid = loop {
        let r = ask(http, SECRET_KEY, model, PROMPT);
        assert!(r.status == 200 || r.status == 401, "{}", r.body);
        let rid = r.header("request-id").unwrap_or_default().to_owned();
        let (_, export) = audit(&data, &["export", chain.to_str().unwrap(), "--project", "secret"]);
        if r.status == 200 && export.lines().any(|l| l.contains(&rid) && l.contains("\"payload\"")) {
            break rid;
        }
        assert!(Instant::now() < deadline, "no sealed record appeared: {export}");
        std::thread::sleep(Duration::from_millis(300));
    };
    let raw: String =
        std::fs::read_dir(&chain).unwrap().map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap()).collect();
    assert!(!raw.contains("tangerine"), "the prompt is not stored in the clear");
    let line = |text: &str| -> serde_json::Value {
        serde_json::from_str(text.lines().find(|l| l.contains(&sealed_rid)).unwrap()).unwrap()
    };
    let (ok, text) = audit(&data, &["export", chain.to_str().unwrap(), "--project", "secret", "--decrypt"]);
    assert!(ok, "{text}");
    let open = line(&text);
    assert!(open["content"]["input"].as_str().unwrap().contains("tangerine-47"), "{open}");
    assert!(!open["content"]["output"].as_str().unwrap().is_empty());

    up_admin(&data, &["content-logging", "secret", "shred"]);
    let (ok, text) = audit(&data, &["export", chain.to_str().unwrap(), "--project", "secret", "--decrypt"]);
    assert!(ok, "{text}");
    let shredded = line(&text);
    assert!(shredded["content"]["error"].as_str().unwrap().contains("shredded"), "{shredded}");
    assert!(!text.contains("tangerine"));
    let (ok, text) = audit(&data, &["verify", chain.to_str().unwrap()]);
    assert!(ok && text.contains("ok:"), "shredding leaves the chain valid: {text}");

    // Several choices (`n`): a record for each, the first under the request's id, the others under `<id>-<k>`.
    let body = serde_json::json!({"model": model, "max_tokens": 4, "n": 3, "seed": 1,
        "messages": [{"role": "user", "content": "Name a colour."}]})
    .to_string();
    let r =
        request(http, "POST", "/v1/chat/completions", &[("authorization", &format!("Bearer {KEY}"))], &body).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let rid = r.header("request-id").unwrap().to_owned();
    let ids = [rid.clone(), format!("{rid}-1"), format!("{rid}-2")];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, export) = audit(&data, &["export", chain.to_str().unwrap()]);
        let records: Vec<serde_json::Value> = export
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|r| r["request_id"].as_str().is_some_and(|id| id.starts_with(&rid)))
            .collect();
        if records.len() == 3 {
            let got: Vec<&str> = records.iter().map(|r| r["request_id"].as_str().unwrap()).collect();
            assert_eq!(
                got.iter().copied().collect::<std::collections::BTreeSet<_>>(),
                ids.iter().map(String::as_str).collect()
            );
            assert!(
                records.iter().all(|r| r["status"] == 200 && r["output_tokens"].as_u64().unwrap() > 0),
                "{records:?}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "three records never appeared: {export}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(up.terminate(Duration::from_secs(30)));
}

/// [`ask`] with the test's key, `None` while nothing listens.
fn try_ask(http: std::net::SocketAddr, model: &str, content: &str) -> Option<zl_e2e::HttpResponse> {
    let body = serde_json::json!({"model": model, "max_tokens": 6, "temperature": 0,
        "messages": [{"role": "user", "content": content}]})
    .to_string();
    request(http, "POST", "/v1/messages", &[("x-api-key", KEY)], &body)
}

/// `frontend-0`'s pid in `zl up`'s `cluster.json` in `data` (it changes when the supervisor restarts it).
fn frontend_pid(data: &Path) -> u32 {
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("cluster.json")).unwrap()).unwrap();
    let pids = state["pids"].as_array().unwrap();
    pids.iter().find(|p| p["name"] == "frontend-0").and_then(|p| p["pid"].as_u64()).unwrap() as u32
}

/// Rewrite every record of `chain` as if `frontend` had written it, re-hashing and re-linking each line: a forged
/// chain that is internally perfect.
fn forge(chain: &Path, out: &Path, frontend: &str) {
    std::fs::create_dir_all(out).unwrap();
    let mut prev = zl_common::audit::GENESIS.to_owned();
    for (_, path) in zl_node_segments(chain) {
        let mut text = String::new();
        for line in std::fs::read(&path).unwrap().split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let (_, mut record) = zl_common::audit::decode_line(line).unwrap();
            record.frontend = frontend.to_owned();
            record.prev = prev;
            let (line, hash) = zl_common::audit::encode_line(&record);
            text.push_str(&line);
            prev = hash;
        }
        std::fs::write(out.join(path.file_name().unwrap()), text).unwrap();
    }
}

fn zl_node_segments(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    files.sort();
    files
}

#[test]
fn verify_cannot_be_fooled_and_a_lost_chain_is_not_silently_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let (mut up, http, state) = zl_up(dir.path(), "data", KEY, &[], &[]);
    let data = dir.path().join("data");
    let chain = Path::new(state["audit_dir"].as_str().unwrap()).join("frontend-0");
    let model = state["model"].as_str().unwrap().to_owned();
    for i in 0..3 {
        assert_eq!(ask(http, KEY, &model, &format!("Count to {i}.")).status, 200);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !audit(&data, &["verify", chain.to_str().unwrap()]).1.contains("reaches the committed head, record 3") {
        assert!(Instant::now() < deadline, "the head was never committed");
        std::thread::sleep(Duration::from_millis(200));
    }
    // With no directory, the local cluster's chains are verified; a directory holding none is a failure, never
    // a silent pass.
    let (ok, text) = audit(&data, &["verify"]);
    assert!(ok && text.contains("ok: ") && text.contains("reaches the committed head"), "{text}");
    let empty = tempfile::tempdir().unwrap();
    let (ok, text) = audit(&data, &["verify", empty.path().to_str().unwrap(), "--allow-missing"]);
    assert!(!ok && text.contains("holds no audit segments"), "{text}");

    // A perfect chain under a frontend name no orchestrator knows fails, and so does leaving out the chain whose
    // head is committed; each has its flag for operators who know why.
    let scratch = tempfile::tempdir().unwrap();
    let forged = scratch.path().join("frontend-x");
    forge(&chain, &forged, "frontend-x");
    let (ok, text) = audit(&data, &["verify", forged.to_str().unwrap()]);
    assert!(!ok && text.contains("no orchestrator holds a head for this frontend"), "{text}");
    assert!(text.contains("frontend frontend-0 committed a head, but its chain was not among"), "{text}");
    let (ok, text) = audit(&data, &["verify", forged.to_str().unwrap(), "--allow-uncommitted", "--allow-missing"]);
    assert!(ok, "{text}");
    let (ok, text) = audit(&data, &["export", forged.to_str().unwrap()]);
    assert!(!ok && text.contains("nothing is exported"), "export checks heads like verify: {text}");

    // The frontend's audit directory is lost (a pod rescheduled onto an empty volume): restarted, it refuses
    // requests instead of starting a new chain, until an operator resets its head.
    let old = frontend_pid(&data);
    std::fs::remove_dir_all(&chain).unwrap();
    zl_e2e::signal(old, "-KILL");
    let deadline = Instant::now() + Duration::from_secs(60);
    let refusal = loop {
        // None while the frontend restarts (its port is closed).
        let r = try_ask(http, &model, "hello");
        if let Some(r) = r.as_ref().filter(|r| r.status == 529 && r.body.contains("audit-reset")) {
            break r.clone();
        }
        if Instant::now() > deadline {
            let log = |name: &str| std::fs::read_to_string(data.join("logs").join(name)).unwrap_or_default();
            panic!(
                "the restarted frontend never refused: {r:?}\n{}\n{}",
                log("frontend-0.log"),
                log("orchestrator-0.log")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_ne!(frontend_pid(&data), old, "the supervisor restarted the frontend");
    assert!(refusal.body.contains("record 3"), "{}", refusal.body);
    let written = zl_node_segments(&chain).iter().map(|(_, p)| std::fs::read(p).unwrap().len()).sum::<usize>();
    assert_eq!(written, 0, "nothing was written to a new chain meanwhile");

    up_admin(&data, &["audit-reset", "frontend-0"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while try_ask(http, &model, "hello again").is_none_or(|r| r.status != 200) {
        assert!(Instant::now() < deadline, "the frontend never served again after the reset");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The new chain verifies against its new committed head.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, text) = audit(&data, &["verify", chain.to_str().unwrap()]);
        if ok && text.contains("reaches the committed head") {
            break;
        }
        assert!(Instant::now() < deadline, "the new chain never verified: {text}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Evidence and secrets at rest are the owner's alone: the audit chain and the Raft log and snapshots.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let raft = data.join("orchestrator-0").join("raft");
    for d in [chain.clone(), raft.clone(), raft.join("log")] {
        assert_eq!(mode(&d), 0o700, "{}", d.display());
        for f in std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_file()) {
            assert_eq!(mode(&f), 0o600, "{}", f.display());
        }
    }
    assert!(up.terminate(Duration::from_secs(30)));
}
