//! Discovery through a real Consul agent (1.8.7, `consul agent -dev` on loopback): what a worker registers is
//! what Consul accepts and shows, within its Meta limits, and the health answers and blocking-query indexes the
//! watch loops read are Consul's own.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use zl_e2e::consul::{ConsulAgent, documented_policy};
use zl_node::consul::catalog::{WORKER_SERVICE, parse_health};
use zl_node::consul::meta::{MAX_KEYS, MAX_VALUE_LEN};
use zl_node::consul::{BlockingIndex, IndexChange, ModelEntry, Registration, WorkerMeta};

fn worker_meta(models: usize) -> WorkerMeta {
    WorkerMeta {
        version: "0.1.0".into(),
        device: "cpu".into(),
        region: "local".into(),
        kv_blocks_total: 1456,
        kv_blocks_free: 1400,
        kv_blocks_cached: 12,
        kv_fragmentation: 0.125,
        kv_dtype: "f16".into(),
        kv_bytes_per_token: 23_040,
        memory_total_bytes: 512 << 20,
        memory_free_bytes: 480 << 20,
        max_running: 32,
        models: (0..models)
            .map(|i| ModelEntry {
                id: format!("org-{i}/model-{i}-instruct"),
                sha256: format!("{:064x}", i + 1),
                weights_bytes: 0,
            })
            .collect(),
        // As many adapters as fit, some left out: Consul takes the Meta as encoded.
        adapters: (0..40).map(|i| format!("tenant-{i}-support-adapter")).collect(),
    }
}

fn registration(id: &str, meta: BTreeMap<String, String>) -> Registration {
    Registration {
        id: id.into(),
        name: WORKER_SERVICE.into(),
        address: "127.0.0.1".into(),
        port: 7100,
        tags: vec!["cpu".into()],
        meta,
        ttl: Duration::from_secs(10),
        deregister_after: Duration::from_secs(60),
    }
}

#[test]
fn consul_accepts_a_workers_registration_and_shows_its_meta_and_health() {
    let agent = ConsulAgent::start("");

    // A worker with 70 models registers; its Meta reads back through Consul's own API.
    let meta = worker_meta(70);
    let reg = registration("worker-0", meta.encode());
    let r = agent.put("/v1/agent/service/register", &reg.body().unwrap()).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let all =
        parse_health(agent.get(&format!("/v1/health/service/{WORKER_SERVICE}")).unwrap().body.as_bytes()).unwrap();
    assert_eq!(all.len(), 1);
    let seen = WorkerMeta::decode(&all[0].meta).unwrap();
    assert_eq!(seen.models.len(), 70);
    assert_eq!((seen.kv_blocks_total, seen.kv_fragmentation), (1456, 0.125));
    assert_eq!(seen.models[69].id, "org-69/model-69-instruct");
    assert_eq!(seen.adapters[..], meta.adapters[..seen.adapters.len()], "the adapters that fit, in order");
    assert!(seen.adapters.len() >= 15, "{} adapters fit", seen.adapters.len());
    assert_eq!(all[0].meta["adapters_omitted"].parse::<usize>().unwrap() + seen.adapters.len(), 40);

    // A worker registers once it serves: its check starts passing.
    let passing = format!("/v1/health/service/{WORKER_SERVICE}?passing");
    let r = agent.get(&passing).unwrap();
    let up = parse_health(r.body.as_bytes()).unwrap();
    assert_eq!((up.len(), up[0].id.as_str(), up[0].port, up[0].passing), (1, "worker-0", 7100, true), "{}", r.body);
    let mut index = BlockingIndex::default();
    assert_eq!(index.update(r.header("x-consul-index")), IndexChange::Advanced);
    // A check that goes critical wakes a blocking query on the old index (bounded by its wait).
    let r = agent.put(&format!("/v1/agent/check/fail/{}?note=stopped", reg.check_id()), b"").unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let started = Instant::now();
    let mut woke = false;
    for _ in 0..5 {
        let r = agent.get(&format!("{passing}&{}", index.query(Duration::from_secs(5)))).unwrap();
        assert_eq!(index.update(r.header("x-consul-index")), IndexChange::Advanced, "the query waited it out");
        if parse_health(r.body.as_bytes()).unwrap().is_empty() {
            woke = true;
            break;
        }
    }
    assert!(woke && started.elapsed() < Duration::from_secs(5), "the change did not wake the blocking query");
    // Without `?passing` it is listed, as not passing.
    let all =
        parse_health(agent.get(&format!("/v1/health/service/{WORKER_SERVICE}")).unwrap().body.as_bytes()).unwrap();
    assert_eq!((all.len(), all[0].passing), (1, false));
    // Passing it again (with a load note as its output) brings it back.
    let note = "load%3A%200%20running";
    let r = agent.put(&format!("/v1/agent/check/pass/{}?note={note}", reg.check_id()), b"").unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    // (The agent syncs a check's status to the catalog in the background: a query may wake for another change
    // first, so it asks again, a bounded number of times.)
    let mut back = Vec::new();
    for _ in 0..5 {
        let r = agent.get(&format!("{passing}&{}", index.query(Duration::from_secs(5)))).unwrap();
        index.update(r.header("x-consul-index"));
        back = parse_health(r.body.as_bytes()).unwrap();
        if back == up {
            break;
        }
    }
    assert_eq!(back, up);
    // No change: the query waits out its wait and the index stays. (Consul also wakes a query for changes
    // elsewhere in the health table, such as its own node check settling after start: those come back as a new
    // index with the same list, so a few queries in a row end with one that waited.)
    let mut waited = false;
    for _ in 0..5 {
        let started = Instant::now();
        let r = agent.get(&format!("{passing}&{}", index.query(Duration::from_secs(1)))).unwrap();
        assert_eq!(parse_health(r.body.as_bytes()).unwrap(), up);
        if index.update(r.header("x-consul-index")) == IndexChange::Same {
            assert!(
                started.elapsed() >= Duration::from_millis(900),
                "a blocking query without a change returned early"
            );
            waited = true;
            break;
        }
    }
    assert!(waited, "every blocking query returned with a new index");

    // Maintenance (a draining worker) takes it out of the passing list; leaving maintenance brings it back.
    let r = agent.put("/v1/agent/service/maintenance/worker-0?enable=true&reason=draining", b"").unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(parse_health(agent.get(&passing).unwrap().body.as_bytes()).unwrap().is_empty());
    agent.put("/v1/agent/service/maintenance/worker-0?enable=false", b"").unwrap();
    assert_eq!(parse_health(agent.get(&passing).unwrap().body.as_bytes()).unwrap().len(), 1);

    // A clean stop deregisters.
    let r = agent.put("/v1/agent/service/deregister/worker-0", b"").unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(parse_health(agent.get(&passing).unwrap().body.as_bytes()).unwrap().is_empty());
}

#[test]
fn our_meta_limits_are_consuls() {
    let agent = ConsulAgent::start("");
    let register = |meta: BTreeMap<String, String>| {
        // Sent as is, past our own check, to see what Consul itself says.
        let mut body: serde_json::Value =
            serde_json::from_slice(&registration("w", BTreeMap::new()).body().unwrap()).unwrap();
        body["Meta"] = serde_json::to_value(&meta).unwrap();
        agent.put("/v1/agent/service/register", body.to_string().as_bytes()).unwrap().status
    };
    let one = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
    let most: BTreeMap<_, _> = (0..MAX_KEYS).map(|i| (format!("k{i}"), String::new())).collect();
    let mut too_many = most.clone();
    too_many.insert("one-more".into(), String::new());
    for (meta, ours) in [
        (one("a-b_C9", &"v".repeat(MAX_VALUE_LEN)), true),
        (one("k", &"v".repeat(MAX_VALUE_LEN + 1)), false),
        (one("consul-x", "v"), false),
        (one("a.b", "v"), false),
        (one(&"k".repeat(129), "v"), false),
        (most, true),
        (too_many, false),
    ] {
        assert_eq!(zl_node::consul::meta::check(&meta).is_ok(), ours, "{:?}", meta.keys().next());
        let status = register(meta.clone());
        assert_eq!(status == 200, ours, "consul answered {status} for {:?}", meta.keys().next());
    }
    // What encode makes of a huge worker passes Consul too.
    let status = register(worker_meta(5000).encode());
    assert_eq!(status, 200);
}

#[tokio::test]
async fn the_client_works_with_only_the_documented_acl_policy() {
    use zl_node::consul::{ConsulClient, ConsulSettings};
    const ROOT: &str = "root-token-for-tests";
    let agent = ConsulAgent::start(&format!(
        "acl {{\n  enabled = true\n  default_policy = \"deny\"\n  tokens {{\n    master = \"{ROOT}\"\n    agent = \"{ROOT}\"\n  }}\n}}\n"
    ));
    let policy =
        serde_json::json!({"Name": "zerolayer-worker", "Rules": documented_policy(WORKER_SERVICE)}).to_string();
    let r = agent.put_as(ROOT, "/v1/acl/policy", policy.as_bytes()).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let token = serde_json::json!({"Policies": [{"Name": "zerolayer-worker"}]}).to_string();
    let r = agent.put_as(ROOT, "/v1/acl/token", token.as_bytes()).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let secret = serde_json::from_str::<serde_json::Value>(&r.body).unwrap()["SecretID"].as_str().unwrap().to_owned();

    let settings = |token: Option<String>| ConsulSettings { addr: agent.http.to_string(), token, ..Default::default() };
    let reg = registration("worker-0", worker_meta(3).encode());
    // No token: refused, with Consul's reason in the error.
    let anonymous = ConsulClient::new(settings(None)).unwrap();
    let err = anonymous.register(&reg).await.unwrap_err().to_string();
    assert!(err.contains("403"), "{err}");

    let worker = ConsulClient::new(settings(Some(secret))).unwrap();
    worker.register(&reg).await.unwrap();
    let mut index = BlockingIndex::default();
    let (_, up) = worker.instances(WORKER_SERVICE, true, &mut index, Duration::from_secs(5)).await.unwrap();
    assert_eq!(up.len(), 1, "registered passing");
    assert_eq!(WorkerMeta::decode(&up[0].meta).unwrap().models.len(), 3);
    worker.pass(&reg.check_id(), "load: 0 running, 0 waiting").await.unwrap();
    // Maintenance (a draining worker) wakes the blocking query a watch has open (Consul may also wake it for
    // changes elsewhere in the health table: a watch loops until its answer changes).
    let watch = {
        let (worker, mut index) = (worker.clone(), index);
        tokio::spawn(async move {
            loop {
                let (change, up) = worker.instances(WORKER_SERVICE, true, &mut index, Duration::from_secs(20)).await?;
                if up.is_empty() {
                    return anyhow::Ok(change);
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    worker.maintenance("worker-0", true, "draining").await.unwrap();
    let change = tokio::time::timeout(Duration::from_secs(10), watch)
        .await
        .expect("maintenance did not wake the watch")
        .unwrap()
        .unwrap();
    assert_eq!(change, IndexChange::Advanced);
    let (_, listed) =
        worker.instances(WORKER_SERVICE, false, &mut BlockingIndex::default(), Duration::from_secs(1)).await.unwrap();
    assert_eq!((listed.len(), listed[0].passing), (1, false), "in maintenance: listed, not passing");
    worker.maintenance("worker-0", false, "").await.unwrap();

    // The policy covers its own service only.
    let mut other = registration("orchestrator-0", BTreeMap::new());
    other.name = "zerolayer-orchestrator".into();
    let err = worker.register(&other).await.unwrap_err().to_string();
    assert!(err.contains("403"), "{err}");

    worker.deregister("worker-0").await.unwrap();
    let (_, gone) =
        worker.instances(WORKER_SERVICE, false, &mut BlockingIndex::default(), Duration::from_secs(1)).await.unwrap();
    assert!(gone.is_empty());
    // An agent that is not there is an error in bounded time, not a hang.
    let nowhere = ConsulClient::new(ConsulSettings { addr: zl_e2e::free_tcp().to_string(), ..Default::default() });
    let started = Instant::now();
    assert!(nowhere.unwrap().register(&reg).await.is_err());
    assert!(started.elapsed() < Duration::from_secs(6));
}
