use super::*;
use crate::ledger::ReportEntry;

pub(crate) fn sha(n: u8) -> String {
    hex(&[n; 32])
}

pub(crate) fn spec(id: &str, model: &str, version: u8) -> WorkerSpec {
    WorkerSpec {
        id: NodeId::new(id).unwrap(),
        endpoint: format!("{id}:7100"),
        device_class: ComputePool::Cpu,
        models: vec![ModelVersion {
            id: model.into(),
            weights_sha256: sha(version),
            context_length: 8192,
            family: "llama".into(),
            weights_bytes: 0,
            embedding_dims: 0,
        }],
        kv_block_size: 16,
        kv_blocks_total: 1000,
        max_running_sequences: 32,
        kv_dtype: "f16".into(),
        kv_bytes_per_token: 0,
    }
}

fn id(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}

#[test]
fn same_commands_same_state_and_rejections_change_nothing() {
    let cmds = vec![
        Command::RegisterWorker(spec("w1", "llama", 1)),
        Command::RegisterWorker(spec("w2", "llama", 2)),
        Command::SetDrain { id: id("w3"), draining: true, migrate: false },
        Command::SetDrain { id: id("w1"), draining: true, migrate: false },
        Command::SetAlias { alias: "default".into(), target: Some("llama".into()) },
        Command::SetCanary { model: "llama".into(), weights: [(sha(1), 90), (sha(2), 10)].into() },
        Command::SetProject { name: "acme".into(), quota: Quota { requests_per_minute: 60, ..Quota::default() } },
        Command::CreateKey(ApiKey {
            key_id: "k1".into(),
            secret_sha256: secret_sha256("s3cret"),
            project: "acme".into(),
            regions: vec![],
        }),
        Command::CreateKey(ApiKey {
            key_id: "k2".into(),
            secret_sha256: sha(9),
            project: "acme".into(),
            regions: vec!["eu".into(), "eu".into()],
        }),
        Command::SetBillingWeights(BillingWeights { input: 0.2, output: 0.6, context: 0.2 }),
        Command::SetPoolThresholds(PoolThresholds { gpu: 0.2, hybrid: 0.5 }),
        Command::DeregisterWorker { id: id("w2") },
    ];
    let run = || {
        let mut s = RoutingState::default();
        let outcomes: Vec<bool> = cmds.iter().enumerate().map(|(i, c)| s.apply(i as u64 + 1, c).is_ok()).collect();
        (s, outcomes)
    };
    let (a, oa) = run();
    let (b, ob) = run();
    assert_eq!(a.snapshot(), b.snapshot());
    assert_eq!(oa, ob);
    assert_eq!(oa, vec![true, true, false, true, true, true, true, true, false, true, false, true]);
    assert_eq!(a.applied_index(), 12);
    assert!(a.workers()[&id("w1")].draining);
    assert_eq!(a.workers().len(), 1);
    assert_eq!(a.pool_thresholds(), &PoolThresholds::default(), "the rejected thresholds left no trace");
    assert_eq!(a.verify_key("s3cret").map(|k| k.key_id.as_str()), Some("k1"));
    assert!(a.verify_key("wrong").is_none());
    let mut restored = RoutingState::restore(&a.snapshot()).unwrap();
    assert_eq!(restored, a);
    assert_eq!(restored.index().by_model["llama"].len(), 1);
    assert_eq!(restored.verify_key("s3cret").map(|k| k.key_id.as_str()), Some("k1"));
    // Data residency: a key is bound to regions (checked names, no repeats) and unbound.
    let bind = |regions: &[&str]| Command::SetKeyRegions {
        key_id: "k1".into(),
        regions: regions.iter().map(|r| (*r).to_owned()).collect(),
    };
    restored.apply(13, &bind(&["eu-west", "eu-central"])).unwrap();
    assert_eq!(restored.keys()["k1"].regions, ["eu-west", "eu-central"]);
    assert!(restored.apply(14, &bind(&["EU"])).is_err());
    assert!(restored.apply(15, &Command::SetKeyRegions { key_id: "nope".into(), regions: vec![] }).is_err());
    let again = RoutingState::restore(&restored.snapshot()).unwrap();
    assert_eq!(again.keys()["k1"].regions, ["eu-west", "eu-central"], "bindings survive a snapshot");
    restored.apply(16, &bind(&[])).unwrap();
    assert!(restored.keys()["k1"].regions.is_empty());
    restored.apply(17, &Command::RevokeKey { key_id: "k1".into() }).unwrap();
    assert!(restored.verify_key("s3cret").is_none(), "a revoked key no longer verifies");
}

#[test]
fn aliases_resolve_and_refuse_cycles() {
    let mut s = RoutingState::default();
    s.apply(1, &Command::RegisterWorker(spec("w1", "smol", 1))).unwrap();
    let alias = |a: &str, t: &str| Command::SetAlias { alias: a.into(), target: Some(t.into()) };
    s.apply(2, &alias("a", "b")).unwrap();
    s.apply(3, &alias("b", "smol")).unwrap();
    assert_eq!(s.resolve_alias("a"), "smol");
    assert_eq!(s.resolve_alias("unknown"), "unknown");
    assert!(matches!(s.apply(4, &alias("smol", "a")), Err(CommandError::Invalid { .. })));
    assert!(s.apply(5, &alias("b", "a")).is_err());
    // A served model id wins over an alias of the same name.
    s.apply(6, &alias("c", "d")).unwrap();
    assert_eq!(s.resolve_alias("smol"), "smol");
}

#[test]
fn bad_input_is_rejected_with_the_field_named() {
    let mut s = RoutingState::default();
    let mut bad = spec("w1", "m", 1);
    bad.models[0].weights_sha256 = "xyz".into();
    let err = s.apply(1, &Command::RegisterWorker(bad)).unwrap_err();
    assert!(err.to_string().contains("weights_sha256"), "{err}");
    let err = s.apply(2, &Command::SetCanary { model: "m".into(), weights: [(sha(1), 0)].into() }).unwrap_err();
    assert!(err.to_string().contains("positive"));
    let err = s.apply(3, &Command::SetFallback { model: "m".into(), chain: vec!["m".into()] }).unwrap_err();
    assert!(err.to_string().contains("itself"));
    assert!(s.apply(4, &Command::SetAlias { alias: "has space".into(), target: Some("m".into()) }).is_err());
    let nan = BillingWeights { input: f32::NAN, output: 0.5, context: 0.2 };
    assert!(s.apply(5, &Command::SetBillingWeights(nan)).is_err());
    assert!(s.workers().is_empty());
}

#[test]
fn reregistration_keeps_the_drain_flag() {
    let mut s = RoutingState::default();
    s.apply(1, &Command::RegisterWorker(spec("w1", "m", 1))).unwrap();
    s.apply(2, &Command::SetDrain { id: id("w1"), draining: true, migrate: false }).unwrap();
    s.apply(3, &Command::RegisterWorker(spec("w1", "m", 2))).unwrap();
    assert!(s.workers()[&id("w1")].draining);
    assert_eq!(s.workers()[&id("w1")].spec.models[0].weights_sha256, sha(2));
}

#[test]
fn a_drain_with_migrate_asks_for_the_hand_over_until_undrained_and_old_commands_read() {
    let mut s = RoutingState::default();
    s.apply(1, &Command::RegisterWorker(spec("w1", "m", 1))).unwrap();
    s.apply(2, &Command::SetDrain { id: id("w1"), draining: true, migrate: true }).unwrap();
    assert!(s.workers()[&id("w1")].hand_over);
    s.apply(3, &Command::RegisterWorker(spec("w1", "m", 1))).unwrap();
    assert!(s.workers()[&id("w1")].hand_over, "a restarted worker is still to hand over");
    s.apply(4, &Command::SetDrain { id: id("w1"), draining: false, migrate: true }).unwrap();
    assert!(!s.workers()[&id("w1")].hand_over && !s.workers()[&id("w1")].draining);
    // A command written before `migrate` existed (in a Raft log) reads as a plain drain.
    let old: Command = serde_json::from_str(r#"{"set_drain":{"id":"w1","draining":true}}"#).unwrap();
    assert_eq!(old, Command::SetDrain { id: id("w1"), draining: true, migrate: false });
}

#[test]
fn cache_groups_are_per_project_and_survive_a_snapshot() {
    let mut s = RoutingState::default();
    let group = |project: &str, group: Option<&str>| Command::SetCacheGroup {
        project: project.into(),
        group: group.map(str::to_owned),
    };
    let err = s.apply(1, &group("acme", Some("shared"))).unwrap_err();
    assert!(err.to_string().contains("acme"), "an unknown project is refused: {err}");
    for (i, p) in ["acme", "beta"].into_iter().enumerate() {
        s.apply(2 + i as u64, &Command::SetProject { name: p.into(), quota: Quota::default() }).unwrap();
    }
    assert_eq!(s.cache_group("acme"), None, "each project's caches are its own by default");
    assert!(s.apply(4, &group("acme", Some("has space"))).is_err());
    s.apply(5, &group("acme", Some("shared"))).unwrap();
    s.apply(6, &group("beta", Some("shared"))).unwrap();
    let restored = RoutingState::restore(&s.snapshot()).unwrap();
    assert_eq!((restored.cache_group("acme"), restored.cache_group("beta")), (Some("shared"), Some("shared")));
    s.apply(7, &group("beta", None)).unwrap();
    assert_eq!(s.cache_group("beta"), None);
    // A snapshot written before cache groups existed still restores.
    let mut old: serde_json::Value = serde_json::from_slice(&RoutingState::default().snapshot()).unwrap();
    old.as_object_mut().unwrap().remove("cache_groups");
    assert!(RoutingState::restore(&serde_json::to_vec(&old).unwrap()).is_ok());
}

#[test]
fn ensuring_a_key_with_a_new_secret_rotates_it() {
    let mut s = RoutingState::default();
    for (i, p) in ["acme", "beta"].into_iter().enumerate() {
        s.apply(1 + i as u64, &Command::SetProject { name: p.into(), quota: Quota::default() }).unwrap();
    }
    let key = |secret: &str, project: &str, regions: &[&str]| {
        Command::EnsureKey(ApiKey {
            key_id: "k1".into(),
            secret_sha256: secret_sha256(secret),
            project: project.into(),
            regions: regions.iter().map(|r| (*r).to_owned()).collect(),
        })
    };
    s.apply(3, &key("first-secret-0123456789", "acme", &[])).unwrap();
    assert_eq!(s.verify_key("first-secret-0123456789").map(|k| k.key_id.as_str()), Some("k1"));
    s.apply(4, &key("first-secret-0123456789", "acme", &["eu"])).unwrap();
    assert_eq!(s.keys()["k1"].regions, vec!["eu".to_owned()]);
    // A changed secret replaces the old one at once: the old secret no longer opens the key.
    s.apply(5, &key("second-secret-0123456789", "acme", &["eu"])).unwrap();
    assert!(s.verify_key("first-secret-0123456789").is_none());
    assert_eq!(s.verify_key("second-secret-0123456789").map(|k| k.key_id.as_str()), Some("k1"));
    // A key never moves to another project this way.
    let err = s.apply(6, &key("second-secret-0123456789", "beta", &[])).unwrap_err();
    assert!(err.to_string().contains("revoke it first"), "{err}");
    assert_eq!(s.keys()["k1"].project, "acme");
}

#[test]
fn operators_writes_and_secret_reads_are_recorded_with_who_made_them() {
    let mut s = RoutingState::default();
    let admin = |by: &str, at_ms: u64, cmd: Command| Command::Admin { by: by.into(), at_ms, command: Box::new(cmd) };
    s.apply(1, &admin("alice", 10, Command::SetProject { name: "acme".into(), quota: Quota::default() })).unwrap();
    let key = ApiKey {
        key_id: "k1".into(),
        secret_sha256: secret_sha256("a-secret-of-sixteen"),
        project: "acme".into(),
        regions: vec![],
    };
    s.apply(2, &admin("bob", 20, Command::CreateKey(key))).unwrap();
    // An operator's key works at once: the wrapped command rebuilt the key index as a plain one would.
    assert_eq!(s.verify_key("a-secret-of-sixteen").map(|k| k.key_id.as_str()), Some("k1"));
    // A refused write changes nothing, the log included; wrapping is one level deep.
    assert!(s.apply(3, &admin("eve", 30, Command::RevokeKey { key_id: "nope".into() })).is_err());
    let nested = admin("eve", 31, admin("eve", 31, Command::RevokeKey { key_id: "k1".into() }));
    assert!(s.apply(4, &nested).is_err());
    assert!(s.verify_key("a-secret-of-sixteen").is_some());
    s.apply(5, &Command::AdminRead { by: "carol".into(), at_ms: 40, what: "data_keys:acme".into() }).unwrap();
    let log: Vec<(u64, &str, &str, &str)> =
        s.admin_log().entries().map(|e| (e.at_ms, e.by.as_str(), e.action.as_str(), e.subject.as_str())).collect();
    assert_eq!(
        log,
        vec![
            (10, "alice", "set_project", "acme"),
            (20, "bob", "create_key", "k1"),
            (40, "carol", "read:data_keys:acme", ""),
        ]
    );
    // It is part of the replicated state: a snapshot carries it.
    assert_eq!(RoutingState::restore(&s.snapshot()).unwrap().admin_log(), s.admin_log());
}

fn enroll(role: &str, node_id: &str, at_ms: u64) -> Command {
    Command::Enroll(EnrollEntry {
        role: role.into(),
        node_id: node_id.into(),
        key_sha256: sha(9),
        not_after_ms: at_ms + 86_400_000,
        at_ms,
        renewal: false,
    })
}

/// A bootstrap credential cannot claim the id of a node that runs here or ran here: a static worker between its
/// registrations (restarting), a frontend that reports but has committed no audit head yet. An operator who
/// vouches the old node is gone (`zl admin forget-node`) lets its id enroll again.
#[test]
fn enrollment_is_refused_for_any_node_that_ran_until_an_operator_forgets_it() {
    let mut s = RoutingState::default();
    let mut i = 0;
    let mut apply = |s: &mut RoutingState, cmd: Command| {
        i += 1;
        s.apply(i, &cmd)
    };
    apply(&mut s, Command::RegisterWorker(spec("w-static", "m", 1))).unwrap();
    apply(&mut s, Command::DeregisterWorker { id: id("w-static") }).unwrap();
    let err = apply(&mut s, enroll("worker", "w-static", 1_000)).unwrap_err();
    assert!(matches!(err, CommandError::Exists(_)), "{err}");
    let report = ReportEntry { report_seq: 1, ..ReportEntry::default() };
    apply(&mut s, Command::FrontendReport { frontend: "fe-1".into(), now_ms: 1_000, report }).unwrap();
    assert!(matches!(apply(&mut s, enroll("frontend", "fe-1", 1_000)), Err(CommandError::Exists(_))));
    // New ids enroll; the same id twice does not.
    apply(&mut s, enroll("frontend", "fe-2", 1_000)).unwrap();
    assert!(matches!(apply(&mut s, enroll("frontend", "fe-2", 2_000)), Err(CommandError::Exists(_))));

    // The operator forgets them: each may enroll once more.
    for (role, node) in [("worker", "w-static"), ("frontend", "fe-1"), ("frontend", "fe-2")] {
        apply(&mut s, Command::ForgetNode { role: role.into(), node_id: node.into() }).unwrap();
        apply(&mut s, enroll(role, node, 3_000)).unwrap();
    }
    // Nothing to forget, another role, or a worker still registered: refused by name.
    let forget = |role: &str, node: &str| Command::ForgetNode { role: role.into(), node_id: node.into() };
    assert!(matches!(apply(&mut s, forget("frontend", "never")), Err(CommandError::NotFound(_))));
    assert!(apply(&mut s, forget("orchestrator", "o1")).is_err());
    apply(&mut s, Command::RegisterWorker(spec("w-live", "m", 1))).unwrap();
    assert!(apply(&mut s, forget("worker", "w-live")).is_err());
    // It survives a snapshot.
    let restored = RoutingState::restore(&s.snapshot()).unwrap();
    assert!(restored.enrolled().seen("worker", "w-live"));
}
