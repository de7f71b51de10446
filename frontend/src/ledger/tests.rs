use zl_wire::message::BudgetGrant;

use super::*;

const NOW: u64 = 1_767_225_600;

fn budget(limit: u64) -> Budget {
    Budget { metric: BudgetMetric::Tokens, period: BudgetPeriod::Month, limit }
}

fn grant(allotment: u64, spent: u64) -> FrontendGrant {
    FrontendGrant {
        grants: vec![BudgetGrant {
            project: "acme".into(),
            period_start: NOW,
            resets_at: NOW + 31 * 86_400,
            limit: 1000,
            spent,
            allotment,
        }],
        ..FrontendGrant::default()
    }
}

fn spent(input: u64, output: u64) -> Spent {
    Spent { key_id: "k".into(), project: "acme".into(), input_tokens: input, output_tokens: output, ..Spent::default() }
}

/// A ledger whose first request for "acme" was refused for want of allotment, and whose next report's answer
/// leased it 100.
fn leased() -> Ledger {
    let mut l = Ledger::new(0.1, 0);
    assert_eq!(l.reserve("acme", budget(1000), 20, 80, NOW), Err(Short::Allotment));
    l.report(None, NOW * 1000, 5000);
    l.granted(grant(100, 0));
    // The request that waited gives up (as the gateway's retry would, before it reserves).
    l.unwait_budget("acme", budget(1000), 20, 80);
    l
}

#[test]
fn a_request_waits_for_an_allotment_then_fits_and_settles_its_real_cost() {
    let mut l = Ledger::new(0.1, 0);
    assert_eq!(l.reserve("acme", budget(1000), 20, 80, NOW), Err(Short::Allotment));
    let r = l.report(None, NOW * 1000, 5000);
    assert_eq!(r.asks[0].target, 100, "the lease (10%) covers the worst case (100)");
    l.granted(grant(100, 0));
    // The request retries: it waits no more, and fits.
    l.unwait_budget("acme", budget(1000), 20, 80);
    let hold = l.reserve("acme", budget(1000), 20, 80, NOW).unwrap();
    assert_eq!(l.reserve("acme", budget(1000), 1, 1, NOW), Err(Short::Allotment), "all reserved");
    l.settle(&spent(20, 30), Some(&hold), NOW);
    let h = l.held("acme").unwrap();
    assert_eq!((h.used, h.reserved), (50, 0));
    let r = l.report(None, NOW * 1000, 5000);
    assert_eq!(r.usage.len(), 1);
    assert_eq!((r.usage[0].requests, r.usage[0].input_tokens, r.usage[0].output_tokens), (1, 20, 30));
    assert_eq!(
        (r.asks[0].used, r.asks[0].target),
        (50, 150),
        "used, plus the lease (which covers the refused worst case)"
    );
}

#[test]
fn a_spent_budget_is_refused_with_its_reset_and_an_unacknowledged_report_is_resent() {
    let mut l = Ledger::new(0.1, 0);
    assert_eq!(l.reserve("acme", budget(1000), 10, 10, NOW), Err(Short::Allotment));
    let first = l.report(Some((3, [7; 32])), NOW * 1000, 5000);
    l.granted(grant(0, 1000));
    assert_eq!(l.reserve("acme", budget(1000), 10, 10, NOW), Err(Short::Allotment));
    l.exhausted("acme");
    match l.reserve("acme", budget(1000), 10, 10, NOW) {
        Err(Short::Spent { message, retry_after }) => {
            assert!(message.contains("monthly budget of 1000 tokens"), "{message}");
            assert_eq!(retry_after, 31 * 86_400);
        }
        other => panic!("{other:?}"),
    }
    // More allotment (another frontend returned some) lifts the refusal.
    l.granted(grant(40, 960));
    assert!(l.reserve("acme", budget(1000), 10, 10, NOW).is_ok());
    // A report that got no answer goes again with the same number and usage.
    l.settle(&spent(1, 1), None, NOW);
    let a = l.report(None, NOW * 1000, 5000);
    let b = l.report(None, NOW * 1000 + 1, 5000);
    assert_eq!(a.report_seq, first.report_seq + 1);
    assert_eq!((a.report_seq, &a.usage), (b.report_seq, &b.usage));
    assert!(
        l.reserve("acme", budget(1000), 0, 5000, NOW).is_err_and(|e| matches!(e, Short::Spent { .. })),
        "more than the whole budget"
    );
}

fn need(bucket: &str, dim: Dim, per_minute: u64, worst: u64) -> Need {
    Need { bucket: bucket.into(), dim, per_minute, worst }
}

#[test]
fn shared_rate_limits_reserve_all_or_nothing_and_settle_real_costs() {
    let mut l = Ledger::new(0.1, 0);
    let needs = [need("key/k/requests", Dim::Requests, 60, 1), need("key/k/output_tokens", Dim::OutputTokens, 600, 80)];
    assert_eq!(l.reserve_rates(&needs, NOW), Err(RateShort::Allotment));
    let r = l.report(None, NOW * 1000, 5000);
    let targets: Vec<(String, u64)> = r.rate_asks.iter().map(|a| (a.bucket.clone(), a.target)).collect();
    assert!(targets.contains(&("key/k/requests".into(), 6)) && targets.contains(&("key/k/output_tokens".into(), 80)));
    // Only the requests bucket is granted: nothing is taken from it either.
    let grant = |req: u64, out: u64| FrontendGrant {
        rate_grants: vec![
            zl_wire::message::RateGrant { bucket: "key/k/requests".into(), allotment: req, available: 0 },
            zl_wire::message::RateGrant { bucket: "key/k/output_tokens".into(), allotment: out, available: 0 },
        ],
        ..FrontendGrant::default()
    };
    l.granted(grant(6, 0));
    assert_eq!(l.reserve_rates(&needs, NOW), Err(RateShort::Allotment));
    assert_eq!(l.rate_held("key/k/requests").unwrap().reserved, 0);
    l.rates_exhausted(&needs);
    match l.reserve_rates(&needs, NOW) {
        Err(RateShort::Limited { bucket, retry_after }) => {
            assert_eq!(bucket, "key/k/output_tokens");
            assert_eq!(retry_after, 8, "80 tokens of a 600-per-minute limit come back in 8 s");
        }
        other => panic!("{other:?}"),
    }
    l.granted(grant(6, 100));
    let holds = l.reserve_rates(&needs, NOW).unwrap();
    l.settle_rates(&holds, Some(&spent(20, 5)));
    let out = l.rate_held("key/k/output_tokens").unwrap();
    assert_eq!((out.used, out.reserved), (5, 0), "the real output, not the worst case");
    assert_eq!(l.rate_held("key/k/requests").unwrap().used, 1);
    // A request that never ran counts nothing.
    let holds = l.reserve_rates(&needs, NOW).unwrap();
    l.settle_rates(&holds, None);
    assert_eq!(l.rate_held("key/k/requests").unwrap().used, 1);
}

#[test]
fn concurrency_slots_are_held_while_requests_run_and_asked_for_as_they_come() {
    let mut l = Ledger::new(0.05, 0);
    let needs = [need("project/p/concurrent", Dim::Concurrent, 2, 1)];
    assert_eq!(l.reserve_rates(&needs, NOW), Err(RateShort::Allotment));
    // It asks for the slot the refused request wanted, no idle spare (a limit of 2 is too small to hold one).
    let ask = |l: &mut Ledger, t: u64| l.report(None, t * 1000, 5000).rate_asks[0].clone();
    assert_eq!((ask(&mut l, NOW).used, ask(&mut l, NOW).target), (0, 1));
    let grant = |n: u64| FrontendGrant {
        rate_grants: vec![zl_wire::message::RateGrant {
            bucket: "project/p/concurrent".into(),
            allotment: n,
            available: 0,
        }],
        ..FrontendGrant::default()
    };
    l.granted(grant(1));
    let first = l.reserve_rates(&needs, NOW).unwrap();
    // The slot is taken while the request runs: a second one waits for a grant, and is refused for a second
    // when the grant brings none.
    assert_eq!(l.reserve_rates(&needs, NOW), Err(RateShort::Allotment));
    l.rates_exhausted(&needs);
    assert!(matches!(l.reserve_rates(&needs, NOW), Err(RateShort::Limited { retry_after: 1, .. })));
    // The first ends: its slot is free again here, and nothing is used up.
    l.settle_rates(&first, Some(&spent(20, 5)));
    let held = l.rate_held("project/p/concurrent").unwrap();
    assert_eq!((held.used, held.reserved), (0, 0));
    assert!(l.reserve_rates(&needs, NOW).is_ok());
    // Idle, it asks to hold no slot at all.
    assert_eq!(ask(&mut l, NOW + LEASE_IDLE_S + 1).target, 1, "the one still in flight");
}

#[test]
fn a_project_first_held_while_a_report_is_on_its_way_is_asked_for_in_the_next() {
    let mut l = Ledger::new(0.1, 0);
    // A periodic report leaves before the project's first request.
    let r = l.report(None, NOW * 1000, 5000);
    assert!(r.asks.is_empty());
    assert_eq!(l.reserve("acme", budget(1000), 20, 80, NOW), Err(Short::Allotment));
    // Its answer cannot hold the project: the project was not in it.
    l.granted(FrontendGrant::default());
    assert_eq!(l.held("acme").map(|h| h.waiting), Some(100), "kept with what it waits for");
    let r = l.report(None, NOW * 1000, 5000);
    assert_eq!(r.asks.len(), 1);
    assert_eq!(r.asks[0].target, 100);
    l.granted(grant(100, 0));
    l.unwait_budget("acme", budget(1000), 20, 80);
    assert!(l.reserve("acme", budget(1000), 20, 80, NOW).is_ok());
    // A project asked about and not granted had its budget cleared: no longer held.
    l.report(None, NOW * 1000, 5000);
    l.granted(FrontendGrant::default());
    assert!(l.held("acme").is_none());
}

#[test]
fn a_want_that_comes_while_a_report_is_on_its_way_is_asked_for_in_the_next() {
    let mut l = leased();
    // The next report leaves; then a request wants more than the lease (300 against 100).
    assert_eq!(l.report(None, NOW * 1000, 5000).asks[0].target, 100);
    assert_eq!(l.reserve("acme", budget(1000), 100, 200, NOW), Err(Short::Allotment));
    // That report's answer does not settle the want it did not carry.
    l.granted(grant(100, 0));
    assert_eq!(l.report(None, NOW * 1000, 5000).asks[0].target, 300);
    l.granted(grant(300, 0));
    l.unwait_budget("acme", budget(1000), 100, 200);
    assert!(l.reserve("acme", budget(1000), 100, 200, NOW).is_ok());
    // Its retry took it: nothing waits.
    assert_eq!(l.held("acme").map(|h| h.waiting), Some(0));
}

#[test]
fn an_idle_frontend_returns_its_lease_and_forgets_the_project() {
    let mut l = leased();
    let hold = l.reserve("acme", budget(1000), 20, 80, NOW).unwrap();
    l.settle(&spent(20, 30), Some(&hold), NOW);
    // Requests keep coming: the lease is kept.
    assert_eq!(l.report(None, (NOW + 5) * 1000, 5000).asks[0].target, 150);
    // None for longer than the idle time: only what was used is held.
    let r = l.report(None, (NOW + LEASE_IDLE_S + 1) * 1000, 5000);
    assert_eq!((r.asks[0].used, r.asks[0].target), (50, 50));
    // Long idle: no longer reported at all.
    l.granted(grant(50, 50));
    assert!(l.report(None, (NOW + FORGET_IDLE_S + 1) * 1000, 5000).asks.is_empty());
}

#[test]
fn usage_on_an_adapter_is_its_own_row_naming_the_adapter_and_its_version() {
    let mut l = Ledger::new(0.1, 0);
    let on = |name: &str, sha: u8| Spent { adapter: Some((name.into(), [sha; 32])), ..spent(10, 5) };
    l.settle(&spent(1, 1), None, NOW);
    l.settle(&on("support-bot", 1), None, NOW);
    l.settle(&on("support-bot", 1), None, NOW);
    l.settle(&on("support-bot", 2), None, NOW);
    let r = l.report(None, NOW * 1000, 5000);
    let rows: Vec<(&str, Option<[u8; 32]>, u64, u64)> =
        r.usage.iter().map(|u| (u.adapter.as_str(), u.adapter_sha256, u.requests, u.input_tokens)).collect();
    assert_eq!(
        rows,
        [("", None, 1, 1), ("support-bot", Some([1; 32]), 2, 20), ("support-bot", Some([2; 32]), 1, 10)],
        "the base, and each version of the adapter apart"
    );
    assert!(r.usage.iter().all(|u| u.key_id == "k" && u.project == "acme"));
}

/// A burst waits for one report: it asks for every waiting request's worst case at once (not one request's worth),
/// keeps asking until they retry, and a report on its way bounds what may be taken meanwhile (its answer hands the
/// rest to other frontends).
#[test]
fn a_burst_asks_for_all_it_waits_for_and_a_report_on_its_way_bounds_the_room() {
    let mut l = Ledger::new(0.05, 0);
    for _ in 0..5 {
        assert_eq!(l.reserve("acme", budget(1000), 20, 80, NOW), Err(Short::Allotment));
    }
    assert_eq!(l.report(None, NOW * 1000, 5000).asks[0].target, 500, "five worst cases, not one");
    l.granted(grant(500, 0));
    // They retry one by one; a periodic report built meanwhile still asks for the ones not yet retried.
    for i in 0..5 {
        l.unwait_budget("acme", budget(1000), 20, 80);
        assert!(l.reserve("acme", budget(1000), 20, 80, NOW).is_ok(), "request {i}");
        if i == 1 {
            assert_eq!(l.report(None, NOW * 1000, 5000).asks[0].target, 500, "200 reserved, 300 waiting");
            l.granted(grant(500, 0));
        }
    }
    // Every request ended having used 30: a report leaves asking for 150 + the lease (50).
    let hold =
        |n: u64| Hold { project: "acme".into(), metric: BudgetMetric::Tokens, reserved: 100 * n, period_start: NOW };
    l.settle(&spent(20, 10), Some(&hold(5)), NOW);
    assert_eq!(l.report(None, NOW * 1000, 5000).asks[0].target, 80);
    // While it is on its way, nothing beyond what it asks for is taken: its answer returns the rest to the
    // others.
    assert_eq!(l.reserve("acme", budget(1000), 20, 80, NOW), Err(Short::Allotment));
    l.granted(grant(80, 0));
    l.unwait_budget("acme", budget(1000), 20, 80);
    assert_eq!(l.held("acme").map(|h| (h.allotment, h.used)), Some((80, 30)));
}
