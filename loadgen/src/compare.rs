//! `zl bench compare A.json B.json [C.json ...]`: runs side by side, level by level, as ratios to the first (B/A,
//! C/A, ...), and all on one set of plots.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::plot;
use crate::report::Report;
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
    let levels = reports.iter().map(|r| r.levels.len()).min().unwrap_or(0);
    for level in 0..levels {
        let shapes: Vec<String> = reports.iter().map(|r| r.levels[level].shape.to_string()).collect();
        let shape = if shapes.iter().all(|s| s == &shapes[0]) { shapes[0].clone() } else { shapes.join(" / ") };
        let _ = writeln!(out, "\nlevel {}: {shape}", level + 1);
        let mut head = format!("  {:<18} {:>10}", "", "A");
        for i in 1..reports.len() {
            head.push_str(&format!(" {:>10} {:>8}", letter(i), format!("{}/A", letter(i))));
        }
        let _ = writeln!(out, "{head}");
        for (name, lower_better, pick) in FIGURES {
            let x = pick(&a.levels[level].summary);
            let mut row = format!("  {name:<18} {:>10}", num(x));
            let mut verdict = "";
            for r in &reports[1..] {
                let y = pick(&r.levels[level].summary);
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
    if reports.iter().any(|r| r.levels.len() != levels) {
        let _ = writeln!(out, "\n(the runs have different numbers of levels: only the first {levels} are compared)");
    }
    out
}

/// All the runs on one set of plots, into `dir`.
pub fn plots(reports: &[&Report], dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    files.extend(plot::draw(&plot::latency_cdf(reports, "time to first token", |r| r.ttft()), dir, "ttft_cdf")?);
    files.extend(plot::draw(&plot::latency_cdf(reports, "end-to-end latency", |r| Some(r.e2e())), dir, "e2e_cdf")?);
    if reports.iter().any(|r| r.levels.len() > 1) {
        files.extend(plot::draw(&plot::throughput(reports), dir, "throughput")?);
        files.extend(plot::draw(&plot::ttft_p90(reports), dir, "ttft_vs_load")?);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;

    fn report(label: &str, ttft: f64) -> Report {
        let records: Vec<Record> = (0..3)
            .map(|i| Record {
                start_s: f64::from(i),
                chunks_s: vec![f64::from(i) + ttft, f64::from(i) + ttft + 0.05],
                end_s: f64::from(i) + ttft + 0.05,
                output_tokens: 2,
                ..Record::default()
            })
            .collect();
        crate::report::test_report(label, vec![(2, records)])
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
