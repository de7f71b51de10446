//! `zl bench compare A.json B.json [C.json ...]`: runs side by side, level by level, as ratios to the first (B/A,
//! C/A, ...), and all on one set of plots. Levels are matched by their load (the same number of clients, or the
//! same arrival rate), never by position: a level that A or no other run has is listed apart, not compared.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::load::Shape;
use crate::plot;
use crate::report::{LevelResult, Report};
use crate::stats::Summary;

/// A figure compared: its name, whether lower is better, and how to read it from a level's summary.
type Figure = (&'static str, bool, fn(&Summary) -> f64);

/// The figures compared.
const FIGURES: &[Figure] = &[
    ("TTFT p50 (ms)", true, |s| s.ttft.p50 * 1e3),
    ("TTFT p90 (ms)", true, |s| s.ttft.p90 * 1e3),
    ("TTFT p99 (ms)", true, |s| s.ttft.p99 * 1e3),
    ("TPOT p50 (ms)", true, |s| s.tpot.p50 * 1e3),
    ("ITL p50 (ms)", true, |s| s.itl.p50 * 1e3),
    ("e2e p50 (ms)", true, |s| s.e2e.p50 * 1e3),
    ("e2e p99 (ms)", true, |s| s.e2e.p99 * 1e3),
    ("output tokens/s", false, |s| s.output_tokens_per_s),
    ("requests/s", false, |s| s.requests_per_s),
    ("errors", true, |s| (s.requests - s.ok) as f64),
];

/// `b / a`, or NaN where it means nothing.
pub fn ratio(a: f64, b: f64) -> f64 {
    if a.is_finite() && b.is_finite() && a != 0.0 { b / a } else { f64::NAN }
}

fn num(x: f64) -> String {
    if !x.is_finite() {
        "-".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

/// The letters naming the runs compared: A, B, C...
fn letter(i: usize) -> char {
    char::from(b'A' + (i % 26) as u8)
}

/// The same load: as many clients, or the same arrival rate.
fn same_load(a: &Shape, b: &Shape) -> bool {
    match (a, b) {
        (Shape::Closed { clients: x }, Shape::Closed { clients: y }) => x == y,
        (Shape::Open { rate: x }, Shape::Open { rate: y })
        | (Shape::Replay { speed: x }, Shape::Replay { speed: y }) => (x - y).abs() <= 1e-9 * x.abs().max(y.abs()),
        _ => false,
    }
}

/// Each distinct load of the runs, in the order first met, with each run's level at that load (if it has one).
fn loads<'a>(reports: &[&'a Report]) -> Vec<(Shape, Vec<Option<&'a LevelResult>>)> {
    let mut out: Vec<(Shape, Vec<Option<&'a LevelResult>>)> = Vec::new();
    for r in reports {
        for l in &r.levels {
            if !out.iter().any(|(s, _)| same_load(s, &l.shape)) {
                let at = reports.iter().map(|r| r.levels.iter().find(|m| same_load(&m.shape, &l.shape))).collect();
                out.push((l.shape, at));
            }
        }
    }
    out
}

/// The side-by-side table: each run's figures and its ratio to the first run's (A); with two runs, which is better.
pub fn table(reports: &[&Report]) -> String {
    let mut out = String::new();
    let Some(a) = reports.first() else { return out };
    for (i, r) in reports.iter().enumerate() {
        let _ = writeln!(out, "{} = {} ({})", letter(i), r.label, r.url);
    }
    if reports.iter().any(|r| r.workload != a.workload) {
        let _ = writeln!(out, "note: the workloads differ:");
        for (i, r) in reports.iter().enumerate() {
            let _ = writeln!(out, "  {}: {}", letter(i), r.workload);
        }
    }
    let mut apart = Vec::new();
    for (shape, at) in loads(reports) {
        // Compared where A and at least one other run have this load; the rest is listed below.
        let (Some(base), true) = (at[0], at[1..].iter().any(Option::is_some)) else {
            let held: Vec<String> =
                at.iter().enumerate().filter(|(_, l)| l.is_some()).map(|(i, _)| letter(i).to_string()).collect();
            apart.push(format!("{shape} ({} only)", held.join(", ")));
            continue;
        };
        let _ = writeln!(out, "\n{shape}:");
        let mut head = format!("  {:<18} {:>10}", "", "A");
        for i in 1..reports.len() {
            head.push_str(&format!(" {:>10} {:>8}", letter(i), format!("{}/A", letter(i))));
        }
        let _ = writeln!(out, "{head}");
        for (name, lower_better, pick) in FIGURES {
            let x = pick(&base.summary);
            let mut row = format!("  {name:<18} {:>10}", num(x));
            let mut verdict = "";
            for level in &at[1..] {
                let y = level.map_or(f64::NAN, |l| pick(&l.summary));
                let q = ratio(x, y);
                row.push_str(&format!(" {:>10} {:>8}", num(y), num(q)));
                verdict = match q.is_finite() && q != 1.0 {
                    true if (q < 1.0) == *lower_better => "B better",
                    true => "A better",
                    false => "",
                };
            }
            if reports.len() == 2 {
                row.push_str(&format!("   {verdict}"));
            }
            let _ = writeln!(out, "{}", row.trim_end());
        }
    }
    if !apart.is_empty() {
        let _ = writeln!(out, "\nnot compared (no other run at the same load): {}", apart.join("; "));
    }
    out
}

/// All the runs on one set of plots, into `dir`.
pub fn plots(reports: &[&Report], dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    files.extend(plot::draw(&plot::latency_cdf(reports, "time to first token", |r| r.ttft()), dir, "ttft_cdf")?);
    files.extend(plot::draw(&plot::latency_cdf(reports, "end-to-end latency", |r| Some(r.e2e())), dir, "e2e_cdf")?);
    if loads(reports).len() > 1 {
        files.extend(plot::draw(&plot::throughput(reports), dir, "throughput")?);
        files.extend(plot::draw(&plot::ttft_p90(reports), dir, "ttft_vs_load")?);
        if plot::has_goodput(reports) {
            files.extend(plot::draw(&plot::goodput(reports), dir, "goodput")?);
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;

    /// A run of closed-loop levels (clients, TTFT in seconds).
    fn levels(label: &str, levels: &[(usize, f64)]) -> Report {
        let records = |ttft: f64| -> Vec<Record> {
            (0..3)
                .map(|i| Record {
                    start_s: f64::from(i),
                    chunks_s: vec![f64::from(i) + ttft, f64::from(i) + ttft + 0.05],
                    end_s: f64::from(i) + ttft + 0.05,
                    output_tokens: 2,
                    ..Record::default()
                })
                .collect()
        };
        crate::report::test_report(label, levels.iter().map(|&(c, ttft)| (c, records(ttft))).collect())
    }

    fn report(label: &str, ttft: f64) -> Report {
        levels(label, &[(2, ttft)])
    }

    #[test]
    fn levels_are_matched_by_load_not_position() {
        // A sweep of 1 and 4 clients against a run of 4 only: 4 is compared with 4, 1 is listed apart.
        let t = table(&[&levels("sweep", &[(1, 0.1), (4, 0.4)]), &levels("four", &[(4, 0.2)])]);
        let four = t.split("\n4 clients:").nth(1).expect("4 clients compared");
        let line = four.lines().find(|l| l.contains("TTFT p50")).unwrap();
        assert!(
            line.contains("400") && line.contains("200") && line.contains("0.50") && line.contains("B better"),
            "{t}"
        );
        assert!(!t.contains("\n1 client:"), "{t}");
        assert!(t.contains("not compared (no other run at the same load): 1 client (A only)"), "{t}");
        // Seen from the other side: B's extra level is B's only.
        let t = table(&[&levels("four", &[(4, 0.2)]), &levels("sweep", &[(1, 0.1), (4, 0.4)])]);
        assert!(t.contains("4 clients:") && t.contains("1 client (B only)"), "{t}");
        // Closed and open loops never match.
        assert!(!same_load(&Shape::Closed { clients: 2 }, &Shape::Open { rate: 2.0 }));
        assert!(same_load(&Shape::Open { rate: 0.5 }, &Shape::Open { rate: 0.5 }));
    }

    #[test]
    fn ratios_side_by_side() {
        assert_eq!(ratio(2.0, 1.0), 0.5);
        assert!(ratio(0.0, 1.0).is_nan());
        let t = table(&[&report("round-robin", 0.4), &report("prefix-aware", 0.1)]);
        let line = t.lines().find(|l| l.contains("TTFT p50")).unwrap();
        // 400 ms against 100 ms: B/A = 0.25, B better.
        assert!(
            line.contains("400") && line.contains("100") && line.contains("0.25") && line.contains("B better"),
            "{line}"
        );
        assert!(t.contains("A = round-robin"));
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(plots(&[&report("a", 0.4), &report("b", 0.1)], dir.path()).unwrap().len(), 4);
        // Three runs: each against A, no verdict.
        let t = table(&[&report("a", 0.4), &report("b", 0.1), &report("c", 0.8)]);
        let line = t.lines().find(|l| l.contains("TTFT p50")).unwrap();
        assert!(line.contains("0.25") && line.contains("2.00") && !line.contains("better"), "{line}");
        assert!(t.contains("C/A"));
    }
}
