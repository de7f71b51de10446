//! `zl bench compare A.json B.json`: two runs side by side, level by level, as B/A ratios, and both on one plot.

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

/// The side-by-side table.
pub fn table(a: &Report, b: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "A = {} ({}), B = {} ({})", a.label, a.url, b.label, b.url);
    if a.workload != b.workload {
        let _ = writeln!(out, "note: the workloads differ:\n  A: {}\n  B: {}", a.workload, b.workload);
    }
    for (i, (la, lb)) in a.levels.iter().zip(&b.levels).enumerate() {
        let shape =
            if la.shape == lb.shape { la.shape.to_string() } else { format!("A {} / B {}", la.shape, lb.shape) };
        let _ = writeln!(out, "\nlevel {}: {shape}", i + 1);
        let _ = writeln!(out, "  {:<18} {:>10} {:>10} {:>8}   ", "", "A", "B", "B/A");
        for (name, lower_better, pick) in FIGURES {
            let (x, y) = (pick(&la.summary), pick(&lb.summary));
            let r = ratio(x, y);
            let verdict = match r.is_finite() {
                true if (r < 1.0) == *lower_better && r != 1.0 => "B better",
                true if r != 1.0 => "A better",
                _ => "",
            };
            let _ = writeln!(out, "  {name:<18} {:>10} {:>10} {:>8}   {verdict}", num(x), num(y), num(r));
        }
    }
    if a.levels.len() != b.levels.len() {
        let _ = writeln!(
            out,
            "\n(A has {} levels, B {}: only the first {} are compared)",
            a.levels.len(),
            b.levels.len(),
            a.levels.len().min(b.levels.len())
        );
    }
    out
}

/// Both runs on one set of plots, into `dir`.
pub fn plots(a: &Report, b: &Report, dir: &Path) -> Result<Vec<PathBuf>> {
    let both = [a, b];
    let mut files = Vec::new();
    files.extend(plot::draw(&plot::latency_cdf(&both, "time to first token", |r| r.ttft()), dir, "ttft_cdf")?);
    files.extend(plot::draw(&plot::latency_cdf(&both, "end-to-end latency", |r| Some(r.e2e())), dir, "e2e_cdf")?);
    if a.levels.len() > 1 || b.levels.len() > 1 {
        files.extend(plot::draw(&plot::throughput(&both), dir, "throughput")?);
        files.extend(plot::draw(&plot::ttft_p90(&both), dir, "ttft_vs_load")?);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::Shape;
    use crate::record::Record;
    use crate::report::{FORMAT, LevelResult};
    use crate::stats::{Targets, summarize};

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
        Report {
            format: FORMAT,
            label: label.into(),
            url: "u".into(),
            api: "anthropic".into(),
            model: "m".into(),
            workload: "w".into(),
            started_unix_s: 0,
            levels: vec![LevelResult {
                shape: Shape::Closed { clients: 2 },
                summary: summarize(&records, Targets::default()),
                records,
            }],
        }
    }

    #[test]
    fn ratios_side_by_side() {
        assert_eq!(ratio(2.0, 1.0), 0.5);
        assert!(ratio(0.0, 1.0).is_nan());
        let t = table(&report("round-robin", 0.4), &report("prefix-aware", 0.1));
        let line = t.lines().find(|l| l.contains("TTFT p50")).unwrap();
        // 400 ms against 100 ms: B/A = 0.25, B better.
        assert!(
            line.contains("400") && line.contains("100") && line.contains("0.25") && line.contains("B better"),
            "{line}"
        );
        assert!(t.contains("A = round-robin"));
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(plots(&report("a", 0.4), &report("b", 0.1), dir.path()).unwrap().len(), 4);
    }
}
