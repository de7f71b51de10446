use super::{BudgetPosition, ReportEntry, UsageEntry};

use super::*;

const T0: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z in ms

fn ask(project: &str, period_start: u64, used: u64, target: u64) -> BudgetPosition {
    BudgetPosition { project: project.into(), period_start, used, target }
}

fn report(seq: u64, asks: Vec<BudgetPosition>) -> ReportEntry {
    ReportEntry { report_seq: seq, asks, ..ReportEntry::default() }
}

fn budget(limit: u64) -> Ledger {
    let mut l = Ledger::default();
    l.set_budget("acme", Some(BudgetSpec { tokens: true, monthly: true, limit }));
    l
}

#[test]
fn periods_follow_the_utc_calendar() {
    let monthly = BudgetSpec { tokens: true, monthly: true, limit: 1 };
    // 2026-02-15 12:00 UTC is in February, which has 28 days in 2026.
    let feb = 1_771_156_800;
    let (start, end) = monthly.period(feb);
    assert_eq!(start, 1_769_904_000, "2026-02-01");
    assert_eq!(end - start, 28 * 86_400);
    let daily = BudgetSpec { monthly: false, ..monthly };
    assert_eq!(daily.period(feb), (feb - 43_200, feb + 43_200));
    // December rolls into the next year.
    let (s, e) = monthly.period(1_796_083_200); // 2026-12-01
    assert_eq!((e - s) / 86_400, 31);
}

#[test]
fn allotments_never_exceed_the_budget_however_many_frontends_ask() {
    let mut l = budget(1000);
    let start = T0 / 1000;
    for (i, f) in ["fe-a", "fe-b", "fe-c"].iter().enumerate() {
        l.report(f, T0 + i as u64, &report(1, vec![ask("acme", start, 0, 400)]));
    }
    let held: Vec<u64> = ["fe-a", "fe-b", "fe-c"].iter().map(|f| l.grants(f, T0, ["acme"])[0].allotment).collect();
    assert_eq!(held, vec![400, 400, 200], "the third gets what is left");
    // fe-a used 350 and gives back what it will not use; fe-c asks for more and gets what fe-a returned.
    l.report("fe-a", T0 + 10, &report(2, vec![ask("acme", start, 350, 350)]));
    l.report("fe-c", T0 + 11, &report(2, vec![ask("acme", start, 200, 600)]));
    assert_eq!(l.grants("fe-c", T0, ["acme"])[0].allotment, 250);
    assert_eq!(l.periods["acme"].committed(), 1000);
    // A repeated report changes nothing.
    let before = l.clone();
    l.report("fe-c", T0 + 11, &report(2, vec![ask("acme", start, 200, 600)]));
    assert_eq!(l.periods, before.periods);
}

#[test]
fn a_silent_frontend_is_charged_its_whole_lease() {
    let mut l = budget(1000);
    let start = T0 / 1000;
    l.report("fe-a", T0, &report(1, vec![ask("acme", start, 0, 300)]));
    l.report("fe-b", T0, &report(1, vec![ask("acme", start, 0, 300)]));
    l.report("fe-a", T0 + 1000, &report(2, vec![ask("acme", start, 100, 300)]));
    // fe-a dies; fe-b keeps reporting past the lease time.
    l.report("fe-b", T0 + LEASE_TTL_MS + 5000, &report(2, vec![ask("acme", start, 50, 300)]));
    let p = &l.periods["acme"];
    assert!(!p.frontends.contains_key("fe-a"));
    assert_eq!(p.charged, 300, "fe-a's lease is lost, not refunded: 200 unused");
    assert_eq!(p.spent(), 350);
    // fe-b restarts and counts from 0: its lease so far is charged, and it starts a new one.
    l.report("fe-b", T0 + LEASE_TTL_MS + 6000, &report(1, vec![ask("acme", start, 0, 300)]));
    let p = &l.periods["acme"];
    assert_eq!(p.charged, 600, "fe-a's 300 and fe-b's old 300");
    assert_eq!(p.frontends["fe-b"].allotment, 300);
    // A new month starts afresh.
    let next = T0 + 31 * 86_400_000;
    l.report("fe-b", next, &report(2, vec![ask("acme", start, 50, 300)]));
    let g = &l.grants("fe-b", next, ["acme"])[0];
    assert_eq!((g.spent, g.allotment), (0, 250), "old-period figures count as a fresh start");
}

#[test]
fn usage_is_summed_once_per_report_and_heads_only_advance() {
    let mut l = Ledger::default();
    let u = UsageEntry {
        hour: 1_767_225_600,
        key_id: "k".into(),
        project: "p".into(),
        requests: 2,
        input_tokens: 10,
        output_tokens: 5,
        milli_units: 300,
        ..UsageEntry::default()
    };
    let mut r = ReportEntry { report_seq: 1, usage: vec![u], ..ReportEntry::default() };
    r.audit_seq = 5;
    r.audit_hash = Some([1; 32]);
    l.report("fe", T0, &r);
    l.report("fe", T0, &r);
    let rows = l.usage_rows(0, None);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].3.requests, 2, "a repeated report is not counted twice");
    r.report_seq = 2;
    r.audit_seq = 3;
    r.audit_hash = Some([2; 32]);
    l.report("fe", T0, &r);
    assert_eq!(l.heads["fe"].head.seq, 5, "a head never moves back");
    assert_eq!(l.usage_rows(0, Some("other")).len(), 0);
    // Rows are counted as they come and go; old hours leave.
    assert_eq!(l.row_count, 1);
    let later = T0 + (USAGE_HOURS + 2) * 3_600_000;
    l.report("fe", later, &ReportEntry { report_seq: 3, ..ReportEntry::default() });
    assert_eq!((l.usage.len(), l.row_count), (0, 0));
    assert_eq!(l.shred("p"), None);
    l.set_data_key("p", DataKey { key_id: "dk_1".into(), key: "00".repeat(32) });
    assert_eq!(l.shred("p").as_deref(), Some("dk_1"));
    assert_eq!(l.shredded["p"], ["dk_1"]);
}

#[test]
fn requests_on_an_adapter_count_per_key_and_per_adapter_version() {
    let mut l = Ledger::default();
    let hour = 1_767_225_600;
    let row = |adapter: &str, sha: &str, requests: u64| UsageEntry {
        hour,
        key_id: "k".into(),
        project: "p".into(),
        requests,
        input_tokens: 10 * requests,
        output_tokens: 2 * requests,
        milli_units: 100 * requests,
        adapter: adapter.into(),
        adapter_sha256: sha.into(),
    };
    let usage = vec![row("", "", 1), row("bot", "aa", 2), row("bot", "bb", 3), row("bot", "aa", 4)];
    l.report("fe", T0, &ReportEntry { report_seq: 1, usage, ..ReportEntry::default() });
    let keys = l.usage_rows(0, None);
    assert_eq!((keys.len(), keys[0].3.requests, keys[0].3.input_tokens), (1, 10, 100), "the key counts all of them");
    let adapters: Vec<(&str, &str, u64, u64)> = l
        .adapter_usage_rows(0, Some("p"))
        .into_iter()
        .map(|(_, _, a, s, u)| (a, s, u.requests, u.milli_units))
        .collect();
    assert_eq!(adapters, [("bot", "aa", 6, 600), ("bot", "bb", 3, 300)], "each version of the adapter its own row");
    assert!(l.adapter_usage_rows(0, Some("other")).is_empty());
    assert_eq!(l.row_count, 3);
    let mut restored = l.clone();
    restored.row_count = 0;
    restored.recount();
    assert_eq!(restored.row_count, 3, "recounted after a restore");
    // Old hours leave with their adapter rows.
    let later = T0 + (USAGE_HOURS + 2) * 3_600_000;
    l.report("fe", later, &ReportEntry { report_seq: 2, ..ReportEntry::default() });
    assert_eq!((l.usage.len(), l.adapter_usage.len(), l.row_count), (0, 0, 0));
}
