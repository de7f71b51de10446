//! A run's results: the JSON file (settings, each level's figures and raw records) and the table printed for people.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::load::Shape;
use crate::record::Record;
use crate::stats::Summary;

/// The results file's format version.
pub const FORMAT: u32 = 1;

/// One load level's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LevelResult {
    /// Its shape.
    pub shape: Shape,
    /// Its figures.
    pub summary: Summary,
    /// Every request it sent.
    pub records: Vec<Record>,
}

/// A whole run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`FORMAT`].
    pub format: u32,
    /// A name for plots and comparisons.
    pub label: String,
    /// The target (URL, or `quic://` for a worker).
    pub url: String,
    /// `anthropic`, `openai` or `zl-worker`.
    pub api: String,
    /// Model id.
    pub model: String,
    /// The workload, described.
    pub workload: String,
    /// When the run started, Unix seconds.
    pub started_unix_s: u64,
    /// Levels, in the order run.
    pub levels: Vec<LevelResult>,
}

impl Report {
    /// Write it as JSON.
    pub fn write(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_vec(self)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))
    }

    /// Read a results file.
    pub fn read(path: &Path) -> Result<Report> {
        let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let report: Report = serde_json::from_slice(&text)
            .with_context(|| format!("{}: not a zl bench results file", path.display()))?;
        if report.format != FORMAT {
            bail!("{}: results format {} (this zl bench reads {FORMAT})", path.display(), report.format);
        }
        Ok(report)
    }
}

fn ms(s: f64) -> String {
    if s.is_finite() { format!("{:.1}", s * 1e3) } else { "-".into() }
}

/// The table of a run's levels.
pub fn table(report: &Report) -> String {
    let mut out = table_head(report);
    for l in &report.levels {
        out.push_str(&level_rows(l));
    }
    out
}

/// The table's head: the run, its workload, the column names.
pub fn table_head(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{} -> {} ({}, {})", report.label, report.url, report.api, report.model);
    let _ = writeln!(out, "workload: {}", report.workload);
    let _ = writeln!(
        out,
        "{:<14} {:>8} {:>6} {:>8} {:>10} {:>26} {:>9} {:>9} {:>18} {:>9}",
        "level",
        "ok/sent",
        "err",
        "req/s",
        "out tok/s",
        "TTFT p50/p90/p99 ms",
        "TPOT p50",
        "ITL p50",
        "e2e p50/p99 ms",
        "goodput"
    );
    out
}

/// One level's rows of the table.
pub fn level_rows(l: &LevelResult) -> String {
    let mut out = String::new();
    {
        let s = &l.summary;
        let good = s.goodput.map_or("-".into(), |g| format!("{:.0}%", g.share * 100.0));
        let _ = writeln!(
            out,
            "{:<14} {:>8} {:>6} {:>8.2} {:>10.1} {:>26} {:>9} {:>9} {:>18} {:>9}",
            l.shape.to_string(),
            format!("{}/{}", s.ok, s.requests),
            s.requests - s.ok,
            s.requests_per_s,
            s.output_tokens_per_s,
            format!("{}/{}/{}", ms(s.ttft.p50), ms(s.ttft.p90), ms(s.ttft.p99)),
            ms(s.tpot.p50),
            ms(s.itl.p50),
            format!("{}/{}", ms(s.e2e.p50), ms(s.e2e.p99)),
            good
        );
        if !s.errors.is_empty() {
            let errors: Vec<String> = s.errors.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(out, "{:<14} errors: {}", "", errors.join(", "));
        }
        if s.resent > 0 {
            let _ = writeln!(
                out,
                "{:<14} resent: {} (the server had closed the kept-alive connection; not its errors)",
                "", s.resent
            );
        }
        if !s.cache.is_empty() || !s.workers.is_empty() || s.route_ms.is_some() {
            let cache: Vec<String> = s.cache.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let workers: Vec<String> = s.workers.iter().map(|(k, n)| format!("{k}: {n}")).collect();
            let route = s.route_ms.map_or("-".into(), |r| format!("{:.3}/{:.3} ms", r.p50, r.p99));
            let _ = writeln!(
                out,
                "{:<14} cluster: cache {}; route p50/p99 {route}; per worker {}",
                "",
                if cache.is_empty() { "-".into() } else { cache.join(", ") },
                if workers.is_empty() { "-".into() } else { workers.join(", ") }
            );
        }
    }
    out
}

/// A report of closed-loop levels (`clients`, records) for tests, figures computed without targets.
#[cfg(test)]
pub(crate) fn test_report(label: &str, levels: Vec<(usize, Vec<Record>)>) -> Report {
    use crate::stats::{Targets, summarize};
    Report {
        format: FORMAT,
        label: label.into(),
        url: format!("http://{label}"),
        api: "anthropic".into(),
        model: "m".into(),
        workload: "w".into(),
        started_unix_s: 0,
        levels: levels
            .into_iter()
            .map(|(clients, records)| LevelResult {
                shape: Shape::Closed { clients },
                summary: summarize(&records, Targets::default()),
                records,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{Targets, summarize};

    #[test]
    fn round_trip_and_table() {
        let records = vec![Record {
            start_s: 0.0,
            chunks_s: vec![0.1, 0.2],
            end_s: 0.25,
            output_tokens: 2,
            status: 200,
            worker: Some("w1".into()),
            cache: Some("miss".into()),
            route_ms: Some(0.2),
            ..Record::default()
        }];
        let report = Report {
            format: FORMAT,
            label: "a".into(),
            url: "http://x".into(),
            api: "anthropic".into(),
            model: "m".into(),
            workload: "synthetic".into(),
            started_unix_s: 1,
            levels: vec![LevelResult {
                shape: Shape::Closed { clients: 2 },
                summary: summarize(&records, Targets { ttft_s: Some(1.0), tpot_s: None }),
                records,
            }],
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        report.write(&path).unwrap();
        assert_eq!(Report::read(&path).unwrap(), report);
        let t = table(&report);
        assert!(t.contains("2 clients") && t.contains("100.0/") && t.contains("100%") && t.contains("w1: 1"), "{t}");
        std::fs::write(&path, "{}").unwrap();
        assert!(Report::read(&path).is_err());
    }
}
