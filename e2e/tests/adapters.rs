//! LoRA adapters through a real `zl up --workers 2` cluster (docs/adapters.md): seeded random PEFT adapters for the
//! bundled SmolLM2 written on an adapter volume, registered with `zl admin adapters add`, used through both SDKs
//! and raw HTTP, routed to the worker that holds them (`x-zl-worker`), evicted and loaded again under
//! `--max-adapters 1` (the same greedy answer before and after), removed while a request runs on it without failing
//! that request, and private to their project.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use zl_e2e::{metric_sum, metrics, request, up_admin, up_projects, zl_up};

const KEY: &str = "sk-zl-adapters-test-key-0123456789";
const KEY_A: &str = "sk-zl-adapters-alpha-0123456789abcd";
const KEY_B: &str = "sk-zl-adapters-beta-0123456789abcde";

/// SmolLM2-135M's shape: 30 layers, 576 wide, Q 9 heads and K/V 3 heads of 64.
const LAYERS: usize = 30;
const HIDDEN: usize = 576;
const KV: usize = 192;

/// A PEFT adapter of rank 8 over every layer's Q and V projections, values from `seed`, in `dir`; returns the
/// SHA-256 of its weights file.
fn write_adapter(dir: &Path, seed: u64) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let config = serde_json::json!({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
        "target_modules": ["q_proj", "v_proj"], "bias": "none"});
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    let mut s = seed;
    let mut values = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5) * 0.3
            })
            .collect()
    };
    let mut tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)> = BTreeMap::new();
    for layer in 0..LAYERS {
        for (module, outputs) in [("q_proj", HIDDEN), ("v_proj", KV)] {
            let p = format!("base_model.model.model.layers.{layer}.self_attn.{module}");
            tensors.insert(format!("{p}.lora_A.weight"), (vec![8, HIDDEN], values(8 * HIDDEN)));
            tensors.insert(format!("{p}.lora_B.weight"), (vec![outputs, 8], values(outputs * 8)));
        }
    }
    // safetensors: an 8-byte little-endian header length, the JSON header, then the data.
    let (mut header, mut data) = (serde_json::Map::new(), Vec::new());
    for (name, (shape, v)) in &tensors {
        let start = data.len();
        data.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let header = serde_json::Value::Object(header).to_string();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend(header.as_bytes());
    file.extend(&data);
    let path = dir.join("adapter_model.safetensors");
    std::fs::write(&path, &file).unwrap();
    let out = Command::new("sha256sum").arg(&path).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_owned()
}

/// Ask greedily through `model` with `key`, past the response cache: (status, answer text, worker).
fn ask(http: SocketAddr, key: &str, model: &str, max_tokens: u32) -> (u16, String, String) {
    ask_about(http, key, model, max_tokens, "Who wrote Romeo and Juliet?")
}

/// [`ask`] a given question.
fn ask_about(http: SocketAddr, key: &str, model: &str, max_tokens: u32, question: &str) -> (u16, String, String) {
    let body = serde_json::json!({"model": model, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": question}]})
    .to_string();
    // Past the response cache: every answer here is computed (its worker is the point).
    let headers = [("x-api-key", key), ("x-zl-cache", "bypass")];
    let r = request(http, "POST", "/v1/messages", &headers, &body).expect("the frontend answers");
    let text = serde_json::from_str::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|j| j["content"][0]["text"].as_str().map(str::to_owned))
        .unwrap_or_else(|| r.body.clone());
    (r.status, text, r.header("x-zl-worker").unwrap_or_default().to_owned())
}

/// The model ids `key` lists.
fn listed(http: SocketAddr, key: &str) -> Vec<String> {
    let r = request(http, "GET", "/v1/models", &[("x-api-key", key)], "").expect("the frontend answers");
    let json: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    json["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect()
}

/// Wait (bounded) until `key` lists or stops listing `model`.
fn wait_listed(http: SocketAddr, key: &str, model: &str, present: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while listed(http, key).iter().any(|m| m == model) != present {
        assert!(Instant::now() < deadline, "{model} never {} for {key}", if present { "listed" } else { "unlisted" });
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait (bounded) until `zl admin adapters list` shows `name` loaded on `worker`.
fn wait_resident(data: &Path, name: &str, worker: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = up_admin(data, &["adapters", "list"]);
        if list.lines().any(|l| l.starts_with(&format!("{name} ")) && l.contains(worker)) {
            return;
        }
        assert!(Instant::now() < deadline, "{name} never shown loaded on {worker}:\n{list}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn adapters_are_served_routed_to_where_they_live_evicted_removed_and_kept_private() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("adapters");
    let shas: Vec<String> = (1..=3).map(|i| write_adapter(&root.join(format!("a{i}")), 100 + i)).collect();
    let env = [("ZL_ADAPTER_ROOT", root.to_str().unwrap()), ("ZL_MAX_ADAPTERS", "1")];
    let (_up, http, state) = zl_up(dir.path(), "data", KEY, &["--workers", "2"], &env);
    let data = dir.path().join("data");
    let model = state["model"].as_str().unwrap().to_owned();
    up_projects(&data, http, &[("alpha", "ka", KEY_A), ("beta", "kb", KEY_B)]);
    // a1 is alpha's own; a2 and a3 every project's.
    up_admin(
        &data,
        &["adapters", "add", "a1", "--base", &model, "--path", "a1", "--sha256", &shas[0], "--project", "alpha"],
    );
    for (i, sha) in shas.iter().enumerate().skip(1) {
        let (name, path) = (format!("a{}", i + 1), format!("a{}", i + 1));
        up_admin(&data, &["adapters", "add", &name, "--base", &model, "--path", &path, "--sha256", sha]);
    }
    // A wrong checksum is registered (the registry cannot read the volume) but refused by the worker.
    up_admin(&data, &["adapters", "add", "bad", "--base", &model, "--path", "a1", "--sha256", &"0".repeat(64)]);
    wait_listed(http, KEY_A, "a1", true);
    wait_listed(http, KEY_B, "a3", true);
    assert!(!listed(http, KEY_B).contains(&"a1".to_owned()), "beta sees alpha's adapter");

    // Private: beta cannot use alpha's adapter, by either name; alpha can, and it changes the answer.
    assert_eq!(ask(http, KEY_B, "a1", 8).0, 404);
    assert_eq!(ask(http, KEY_B, &format!("{model}:a1"), 8).0, 404);
    let (status, base_answer, _) = ask(http, KEY_A, &model, 16);
    assert_eq!(status, 200, "{base_answer}");
    let (status, a1_answer, w1) = ask(http, KEY_A, "a1", 16);
    assert_eq!(status, 200, "{a1_answer}");
    assert_ne!(a1_answer, base_answer, "the adapter changed nothing");
    // The audit record names the adapter and its version.
    let chain = Path::new(state["audit_dir"].as_str().unwrap()).join("frontend-0");
    let deadline = Instant::now() + Duration::from_secs(10);
    let named = format!("\"adapter\":\"a1\",\"adapter_sha256\":\"{}\"", shas[0]);
    while !std::fs::read_dir(&chain)
        .map(|d| d.flatten().any(|f| std::fs::read_to_string(f.path()).unwrap_or_default().contains(&named)))
        .unwrap_or(false)
    {
        assert!(Instant::now() < deadline, "no audit record names {named}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // And the usage ledger bills it per adapter version, beside the key's row (frontends report about once a
    // second).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let usage: serde_json::Value =
            serde_json::from_str(&up_admin(&data, &["usage", "--project", "alpha", "--json"])).unwrap();
        let billed =
            usage["adapters"].as_array().unwrap().iter().any(|r| {
                r["adapter"] == "a1" && r["sha256"] == shas[0].as_str() && r["requests"].as_u64().unwrap() >= 1
            });
        if billed {
            assert!(usage["usage"].as_array().unwrap().iter().any(|r| r["key_id"] == "ka"), "{usage}");
            break;
        }
        assert!(Instant::now() < deadline, "no usage row names adapter a1: {usage}");
        std::thread::sleep(Duration::from_millis(250));
    }
    let (status, body, _) = ask(http, KEY_A, "bad", 8);
    assert_eq!(status, 400, "a file that does not match its SHA-256 is refused: {body}");
    assert!(body.contains("SHA-256"), "{body}");

    // Routed to where it is resident: the same question (its answer unchanged), and other questions, which the
    // base's routing would spread over both workers.
    wait_resident(&data, "a1", &w1);
    let workers = up_admin(&data, &["workers"]);
    assert!(workers.contains("adapters loaded: a1"), "zl admin workers does not show a1 loaded:\n{workers}");
    let (status, again, w) = ask(http, KEY_A, &format!("{model}:a1"), 16);
    assert_eq!((status, again.as_str(), w.as_str()), (200, a1_answer.as_str(), w1.as_str()));
    let spread: std::collections::HashSet<String> =
        (0..8).map(|i| ask_about(http, KEY_A, &model, 2, &format!("Question {i}: name a colour.")).2).collect();
    assert_eq!(spread.len(), 2, "the base's requests should use both workers");
    for i in 0..8 {
        let (status, _, w) = ask_about(http, KEY_A, "a1", 2, &format!("Question {i}: name a colour."));
        assert_eq!((status, w.as_str()), (200, w1.as_str()), "question {i} went elsewhere");
    }

    // Both SDKs, through the shared adapters.
    let url = format!("http://{http}");
    let script = format!(
        r#"
import anthropic, openai
a = anthropic.Anthropic(base_url="{url}", api_key="{KEY_B}")
m = a.messages.create(model="a2", max_tokens=8, messages=[{{"role": "user", "content": "Hi"}}])
print("anthropic", m.model, len(m.content[0].text) > 0)
o = openai.OpenAI(base_url="{url}/v1", api_key="{KEY_B}")
c = o.chat.completions.create(model="a3", max_tokens=8, temperature=0, messages=[{{"role": "user", "content": "Hi"}}])
print("openai", c.model, len(c.choices[0].message.content) > 0)
"#
    );
    let out = Command::new(zl_e2e::python()).arg("-c").arg(&script).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("anthropic a2 True") && said.contains("openai a3 True"), "{said}");

    // Three adapters on two workers holding one each: some were evicted; a1 loads again and answers as before.
    let (status, again, _) = ask(http, KEY_A, "a1", 16);
    assert_eq!((status, again.as_str()), (200, a1_answer.as_str()));
    let list = up_admin(&data, &["adapters", "list"]);
    let loaded: usize = list
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().last().unwrap_or("-"))
        .filter(|w| *w != "-")
        .map(|w| w.split(',').count())
        .sum();
    assert!(loaded <= 2, "more adapters resident than two workers of --max-adapters 1 hold:\n{list}");
    let workers = state["workers"].as_array().unwrap();
    let sum = |name: &str| -> f64 {
        workers
            .iter()
            .map(|w| metric_sum(&metrics(w["metrics"].as_str().unwrap().parse().unwrap()).unwrap_or_default(), name))
            .sum()
    };
    assert!(sum("zl_worker_adapter_evictions_total") >= 1.0, "no adapter was evicted");
    assert!(sum("zl_worker_adapter_loads_total") >= 4.0, "a1, a2, a3 and a1 again are loads");

    // Removed while a request runs on it: that request finishes; the next is refused.
    let long = std::thread::spawn(move || ask(http, KEY_A, "a1", 200));
    std::thread::sleep(Duration::from_millis(300));
    up_admin(&data, &["adapters", "remove", "a1"]);
    let (status, text, _) = long.join().unwrap();
    assert_eq!(status, 200, "{text}");
    wait_listed(http, KEY_A, "a1", false);
    assert_eq!(ask(http, KEY_A, "a1", 8).0, 404);
}
