//! `zl bench` against a real `zl up` cluster: every load shape, workload and API flavour runs and writes its
//! results and plots, the direct worker path runs, `zl bench compare` prints ratios, and a wrong key is a clear
//! error. The figures themselves are checked on known timings in the zl-loadgen unit tests; nothing here is timed.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use zl_e2e::{zl, zl_up};

const KEY: &str = "sk-zl-bench-test-key-0123456789abcdef";

fn bench(data: &Path, out: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["bench", "--data-dir", data.to_str().unwrap(), "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let run = zl(&args);
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "zl bench {extra:?} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("TTFT p50/p90/p99 ms") && stdout.contains("results: "), "{stdout}");
    // The table is printed once: its head, then each level's row as it ends.
    assert_eq!(format!("{stdout}{stderr}").matches("TTFT p50/p90/p99 ms").count(), 1, "{stdout}\n{stderr}");
    serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap()
}

fn plots_written(dir: &Path, names: &[&str]) {
    for name in names {
        let png = std::fs::read(dir.join(format!("{name}.png"))).unwrap_or_else(|e| panic!("{name}.png: {e}"));
        assert_eq!(&png[1..4], b"PNG", "{name}.png");
        let svg = std::fs::read_to_string(dir.join(format!("{name}.svg"))).unwrap();
        assert!(svg.contains("<svg") && svg.contains("<text"), "{name}.svg");
    }
}

#[test]
fn zl_bench_runs_against_zl_up_and_compares() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = ["--workers", "2", "--kv-memory-mb", "128", "--policy", "round-robin"];
    let (mut up, http_addr, _) = zl_up(dir.path(), "data", KEY, &args, &[]);

    // A closed-loop sweep over a shared-prefix workload, Anthropic flavour, with goodput targets.
    let rr = dir.path().join("rr");
    let report = bench(
        &data,
        &rr,
        &[
            "--label",
            "round-robin",
            "--workload",
            "shared-prefix",
            "--groups",
            "2",
            "--prefix-tokens",
            "60",
            "--input-tokens",
            "8",
            "--output-tokens",
            "6",
            "--concurrency",
            "1,2",
            "--requests",
            "6",
            "--ttft-target-ms",
            "600000",
            "--tpot-target-ms",
            "600000",
        ],
    );
    let levels = report["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    assert_eq!(levels[1]["shape"], serde_json::json!({"kind": "closed", "clients": 2}));
    for level in levels {
        let s = &level["summary"];
        assert_eq!((s["requests"].as_u64(), s["ok"].as_u64()), (Some(6), Some(6)), "{s}");
        assert!(s["output_tokens"].as_u64().unwrap() > 0 && s["input_tokens"].as_u64().unwrap() > 6 * 60, "{s}");
        assert!(
            s["ttft"]["p50"].as_f64().unwrap() > 0.0
                && s["e2e"]["max"].as_f64().unwrap() >= s["ttft"]["max"].as_f64().unwrap()
        );
        // Generous targets: every request is good.
        assert_eq!(s["goodput"]["share"].as_f64(), Some(1.0), "{s}");
        // The cluster's own figures: round-robin spreads the requests over both workers; every route is timed.
        assert_eq!(s["workers"].as_object().unwrap().len(), 2, "{s}");
        assert_eq!(s["cache"]["miss"].as_u64(), Some(6), "{s}");
        assert_eq!(s["route_ms"]["count"].as_u64(), Some(6), "{s}");
        let records = level["records"].as_array().unwrap();
        assert_eq!(records.len(), 6);
        assert!(records.iter().all(|r| r["request_id"].as_str().is_some_and(|id| !id.is_empty())));
    }
    plots_written(&rr, &["ttft_cdf", "e2e_cdf", "ttft_timeline", "throughput", "ttft_vs_load"]);

    // An open loop over multi-turn conversations, OpenAI flavour (base URL with /v1, as the SDK takes it).
    let open = dir.path().join("open");
    let report = bench(
        &data,
        &open,
        &[
            "--api",
            "openai",
            "--url",
            &format!("http://{http_addr}/v1"),
            "--workload",
            "multi-turn",
            "--turns",
            "2",
            "--input-tokens",
            "6",
            "--output-tokens",
            "6",
            "--rate",
            "4",
            "--requests",
            "4",
            "--no-plots",
            "--quiet",
        ],
    );
    let level = &report["levels"][0];
    assert_eq!(level["shape"]["kind"], "open");
    assert_eq!(level["summary"]["ok"].as_u64(), Some(4), "{level}");
    let turns: Vec<u64> = level["records"].as_array().unwrap().iter().map(|r| r["turn"].as_u64().unwrap()).collect();
    assert!(turns.contains(&1), "conversations went on to their second turn: {turns:?}");
    assert!(!open.join("ttft_cdf.png").exists());
    // Its plots, drawn afterwards from the results file.
    let run = zl(&["bench", "plot", open.join("results.json").to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    plots_written(&open, &["ttft_cdf", "e2e_cdf", "ttft_timeline"]);

    // A JSONL file of requests, straight to a worker over the cluster RPC.
    let file = dir.path().join("requests.jsonl");
    std::fs::write(&file, "{\"prompt\": \"What is the capital of France?\", \"max_tokens\": 5}\n{\"system\": \"Be brief.\", \"messages\": [{\"role\": \"user\", \"content\": \"Name a colour.\"}]}\n").unwrap();
    let direct = dir.path().join("direct");
    let report = bench(
        &data,
        &direct,
        &[
            "--api",
            "zl-worker",
            "--workload",
            "file",
            "--file",
            file.to_str().unwrap(),
            "--output-tokens",
            "5",
            "--requests",
            "3",
            "--label",
            "direct",
            "--quiet",
        ],
    );
    assert_eq!(report["api"], "zl-worker");
    assert_eq!(report["levels"][0]["summary"]["ok"].as_u64(), Some(3), "{report}");

    // A seeded Mooncake-style trace, replayed at twice its speed: each request sent when its line says.
    let trace = dir.path().join("trace.jsonl");
    let t = trace.to_str().unwrap();
    let write = |seed: &str| {
        let run = zl(&[
            "bench",
            "trace",
            "--out",
            t,
            "--requests",
            "5",
            "--rate",
            "4",
            "--prefixes",
            "2",
            "--prefix-blocks",
            "3",
            "--unique-blocks",
            "1",
            "--block-tokens",
            "16",
            "--output-tokens",
            "4",
            "--seed",
            seed,
        ]);
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        std::fs::read_to_string(&trace).unwrap()
    };
    let (a, b, lines) = (write("2"), write("3"), write("2"));
    assert!(a == lines && a != b, "seeded");
    let stamps: Vec<f64> =
        lines.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["timestamp"].as_f64().unwrap() / 1e3).collect();
    let replay = dir.path().join("replay");
    let report = bench(
        &data,
        &replay,
        &[
            "--workload",
            "file",
            "--file",
            t,
            "--trace-block-tokens",
            "16",
            "--replay-speed",
            "2",
            "--requests",
            "5",
            "--warmup",
            "0",
            "--no-plots",
            "--quiet",
        ],
    );
    assert!(report["workload"].as_str().unwrap().starts_with("trace: 5 requests"), "{report}");
    let level = &report["levels"][0];
    assert_eq!(level["shape"], serde_json::json!({"kind": "replay", "speed": 2.0}));
    assert_eq!(level["summary"]["ok"].as_u64(), Some(5), "{level}");
    let mut starts: Vec<(u64, f64)> = level["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["session"].as_u64().unwrap(), r["start_s"].as_f64().unwrap()))
        .collect();
    starts.sort_by_key(|s| s.0);
    for (i, (session, start)) in starts.iter().enumerate() {
        assert_eq!(*session, i as u64);
        assert!((start - (stamps[i] - stamps[0]) / 2.0).abs() < 1e-9, "{starts:?} {stamps:?}");
    }
    // Prompts of the trace's lengths: the server counted at least the trace's tokens (the template adds some).
    assert!(level["summary"]["input_tokens"].as_u64().unwrap() >= 5 * 33, "{level}");

    // compare: the figures side by side with their ratio, and both runs on one plot.
    let cmp = dir.path().join("cmp");
    let run = zl(&[
        "bench",
        "compare",
        rr.join("results.json").to_str().unwrap(),
        direct.join("results.json").to_str().unwrap(),
        "--out",
        cmp.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{text}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(text.contains("A = round-robin") && text.contains("B = direct") && text.contains("B/A"), "{text}");
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("TTFT p50 (ms)") && l.split_whitespace().count() >= 6),
        "{text}"
    );
    // Levels meet by load: the sweep's 1-client level against the direct run's only level; 2 clients apart.
    assert!(text.contains("\n1 client:") && !text.contains("\n2 clients:"), "{text}");
    assert!(text.contains("not compared (no other run at the same load): 2 clients (A only)"), "{text}");
    plots_written(&cmp, &["ttft_cdf", "e2e_cdf", "throughput", "ttft_vs_load"]);

    // Without --out nothing lands in the working directory: the run goes to the data dir's bench/, named (and
    // labelled) by its own directory; so does a comparison.
    let cwd = dir.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let here = |args: &[&str]| {
        let out = std::process::Command::new(zl_e2e::bin("zl")).args(args).current_dir(&cwd).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let data_s = data.to_str().unwrap();
    let runs: Vec<String> = (0..2)
        .map(|_| {
            let said = here(&["bench", "--data-dir", data_s, "--requests", "2", "--output-tokens", "4", "--quiet"]);
            said.lines().find_map(|l| l.strip_prefix("results: ")).unwrap().to_owned()
        })
        .collect();
    assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 0, "zl bench wrote to the working directory");
    let labels: Vec<String> = runs
        .iter()
        .map(|r| {
            assert!(Path::new(r).starts_with(data.join("bench")), "{r}");
            let v: Value = serde_json::from_slice(&std::fs::read(r).unwrap()).unwrap();
            v["label"].as_str().unwrap().to_owned()
        })
        .collect();
    assert!(labels[0].starts_with("run-") && labels[0] != labels[1], "distinct default labels: {labels:?}");
    let said = here(&["bench", "compare", &runs[0], &runs[1], "--data-dir", data_s]);
    assert!(said.contains(&format!("A = {}", labels[0])) && said.contains(&format!("B = {}", labels[1])), "{said}");
    assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 0, "zl bench compare wrote to the working directory");
    let compared = said.lines().find_map(|l| l.strip_prefix("plots: ")).unwrap().split(", ").next().unwrap();
    assert!(Path::new(compared).starts_with(data.join("bench")), "{said}");

    // A wrong key fails the warm-up with the endpoint's own error, and no results are written.
    let bad = dir.path().join("bad");
    let run =
        zl(&["bench", "--data-dir", data.to_str().unwrap(), "--api-key", "sk-wrong", "--out", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success() && err.contains("warm-up request failed (http_401"), "{err}");
    assert!(!bad.join("results.json").exists());

    assert!(up.terminate(Duration::from_secs(30)), "zl up stops cleanly");
}
