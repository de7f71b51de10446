//! Plots, as PNG and SVG: latency CDFs, throughput and TTFT against load, and TTFT over time. What to draw is
//! worked out purely ([`Chart`] values from reports, tested); drawing is plotters, with the DejaVu Sans font the
//! binary carries, so nothing depends on the fonts a machine has.

use std::path::{Path, PathBuf};
use std::sync::Once;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::Report;

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// A line through the points.
    Line,
    /// A dot at each point.
    Dots,
    /// A cross at each point (failures).
    Crosses,
    /// A large dot at each point: a run with a single level, which a line could not show.
    Marker,
}

/// One series.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points, in drawing order.
    pub points: Vec<(f64, f64)>,
    /// How it is drawn.
    pub mark: Mark,
}

/// A chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    /// Title.
    pub title: String,
    /// x axis label.
    pub x: String,
    /// y axis label.
    pub y: String,
    /// Its series.
    pub series: Vec<Series>,
    /// Legend in the lower right (CDFs) rather than the upper left.
    pub legend_low: bool,
    /// The x axis counts something (clients): ticks at whole numbers only.
    pub integer_x: bool,
    /// Vertical lines across the chart at these x values, each with its label (where a level begins).
    pub dividers: Vec<(f64, String)>,
}

/// The empirical CDF of `samples` (seconds) as a step line in milliseconds against the share at or below.
pub fn cdf(samples: &[f64]) -> Vec<(f64, f64)> {
    let mut xs: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    xs.sort_by(f64::total_cmp);
    let n = xs.len() as f64;
    let mut points = Vec::with_capacity(2 * xs.len());
    for (i, x) in xs.iter().enumerate() {
        points.push((x * 1e3, i as f64 / n));
        points.push((x * 1e3, (i + 1) as f64 / n));
    }
    points
}

/// A latency CDF chart: one line per (run, level).
pub fn latency_cdf(reports: &[&Report], what: &str, pick: fn(&crate::record::Record) -> Option<f64>) -> Chart {
    let mut series = Vec::new();
    for r in reports {
        for l in &r.levels {
            let samples: Vec<f64> = l.records.iter().filter(|x| x.ok()).filter_map(pick).collect();
            let label = if reports.len() > 1 { format!("{}: {}", r.label, l.shape) } else { l.shape.to_string() };
            series.push(Series { label, points: cdf(&samples), mark: Mark::Line });
        }
    }
    Chart {
        title: format!("{what} (CDF)"),
        x: format!("{what} (ms)"),
        y: "share of requests at or below".into(),
        series,
        legend_low: true,
        integer_x: false,
        dividers: Vec::new(),
    }
}

/// A figure against the offered load, one line per run (a marker for a run of one level). The axis is the first
/// run's kind of load (clients or arrival rate); levels of the other kind are left out.
pub fn against_load(reports: &[&Report], title: &str, y: &str, pick: fn(&crate::stats::Summary) -> f64) -> Chart {
    let first = reports.first().and_then(|r| r.levels.first()).map(|l| l.shape);
    let x = first.map_or("load", |s| s.axis()).to_owned();
    let series = reports
        .iter()
        .map(|r| {
            let points: Vec<(f64, f64)> = r
                .levels
                .iter()
                .filter(|l| first.is_none_or(|f| f.axis() == l.shape.axis()))
                .map(|l| (l.shape.level(), pick(&l.summary)))
                .filter(|p| p.1.is_finite())
                .collect();
            let mark = if points.len() == 1 { Mark::Marker } else { Mark::Line };
            Series { label: r.label.clone(), points, mark }
        })
        .collect();
    let integer_x = matches!(first, Some(crate::load::Shape::Closed { .. }));
    Chart { title: title.into(), x, y: y.into(), series, legend_low: false, integer_x, dividers: Vec::new() }
}

/// TTFT of each request against when it was sent, levels one after another; failures as crosses at the bottom.
pub fn timeline(report: &Report) -> Chart {
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    let mut offset = 0.0;
    let mut dividers = Vec::new();
    for l in &report.levels {
        if report.levels.len() > 1 {
            dividers.push((offset, l.shape.to_string()));
        }
        for r in &l.records {
            match r.ttft() {
                Some(t) if r.ok() => ok.push((offset + r.start_s, t * 1e3)),
                _ if !r.ok() => failed.push((offset + r.start_s, 0.0)),
                _ => {}
            }
        }
        offset += l.records.iter().map(|r| r.end_s).fold(0.0, f64::max);
    }
    ok.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut series = vec![Series { label: "time to first token".into(), points: ok, mark: Mark::Dots }];
    if !failed.is_empty() {
        series.push(Series {
            label: format!("failed requests ({})", failed.len()),
            points: failed,
            mark: Mark::Crosses,
        });
    }
    Chart {
        title: format!("{}: TTFT over time", report.label),
        x: "request sent at (s since the start)".into(),
        y: "TTFT (ms)".into(),
        series,
        legend_low: false,
        integer_x: false,
        dividers,
    }
}

fn bounds(chart: &Chart) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
    let pts = chart.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64, f64::NEG_INFINITY);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        return (0.0..1.0, 0.0..1.0);
    }
    x0 = x0.min(0.0);
    let pad = |lo: f64, hi: f64| if hi > lo { hi + (hi - lo) * 0.05 } else { lo + 1.0 };
    (x0..pad(x0, x1), y0..pad(y0, y1))
}

/// Line colours (the "tab10" palette: distinguishable, and readable on white).
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(23, 190, 207),
];

fn font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The embedded font is valid TrueType; were it not, text would be missing and the plots still drawn.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
    });
}

fn render<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &Chart) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (xr, yr) = bounds(chart);
    let (x_end, y_range) = (xr.end, yr.clone());
    let mut c = ChartBuilder::on(root)
        .caption(&chart.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(xr, yr)
        .map_err(e)?;
    let mut mesh = c.configure_mesh();
    let int_label = |x: &f64| format!("{x:.0}");
    if chart.integer_x {
        // plotters puts ticks on multiples of 1, 2 or 5 times a power of ten, the finest that keeps within the
        // count asked: asking for no more ticks than there are whole numbers in the range keeps them whole.
        let whole = (x_end + 1.0).floor().clamp(2.0, 11.0) as usize;
        mesh.x_labels(whole).x_label_formatter(&int_label);
    }
    mesh.x_desc(&chart.x)
        .y_desc(&chart.y)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(e)?;
    for (x, label) in &chart.dividers {
        let grey = RGBColor(150, 150, 150);
        c.draw_series(std::iter::once(PathElement::new(
            vec![(*x, y_range.start), (*x, y_range.end)],
            grey.stroke_width(1),
        )))
        .map_err(e)?;
        let top = y_range.end - (y_range.end - y_range.start) * 0.02;
        c.draw_series(std::iter::once(Text::new(
            label.clone(),
            (*x, top),
            ("sans-serif", 13).into_font().color(&grey),
        )))
        .map_err(e)?;
    }
    for (i, s) in chart.series.iter().enumerate() {
        let color = if s.mark == Mark::Crosses { RED.to_rgba() } else { COLOURS[i % COLOURS.len()].to_rgba() };
        let drawn = match s.mark {
            Mark::Line => c.draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2))).map_err(e)?,
            Mark::Dots => c.draw_series(s.points.iter().map(|&p| Circle::new(p, 2, color.filled()))).map_err(e)?,
            Mark::Marker => c.draw_series(s.points.iter().map(|&p| Circle::new(p, 6, color.filled()))).map_err(e)?,
            Mark::Crosses => {
                c.draw_series(s.points.iter().map(|&p| Cross::new(p, 5, color.stroke_width(2)))).map_err(e)?
            }
        };
        drawn
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3)));
    }
    let position = if chart.legend_low { SeriesLabelPosition::LowerRight } else { SeriesLabelPosition::UpperLeft };
    c.configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

/// Draw `chart` to `dir/name.png` and `dir/name.svg`; the files written.
pub fn draw(chart: &Chart, dir: &Path, name: &str) -> Result<Vec<PathBuf>> {
    font();
    let size = (1000, 620);
    let png = dir.join(format!("{name}.png"));
    let svg = dir.join(format!("{name}.svg"));
    render(&BitMapBackend::new(&png, size).into_drawing_area(), chart)
        .map_err(|e| anyhow!("drawing {}: {e}", png.display()))?;
    render(&SVGBackend::new(&svg, size).into_drawing_area(), chart)
        .map_err(|e| anyhow!("drawing {}: {e}", svg.display()))?;
    Ok(vec![png, svg])
}

/// Every plot of one run, into `dir`.
pub fn run_plots(report: &Report, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let one = [report];
    files.extend(draw(&latency_cdf(&one, "time to first token", |r| r.ttft()), dir, "ttft_cdf")?);
    files.extend(draw(&latency_cdf(&one, "end-to-end latency", |r| Some(r.e2e())), dir, "e2e_cdf")?);
    files.extend(draw(&timeline(report), dir, "ttft_timeline")?);
    if report.levels.len() > 1 {
        files.extend(draw(&throughput(&one), dir, "throughput")?);
        files.extend(draw(&ttft_p90(&one), dir, "ttft_vs_load")?);
        if has_goodput(&one) {
            files.extend(draw(&goodput(&one), dir, "goodput")?);
        }
    }
    Ok(files)
}

/// Output tokens per second against load.
pub fn throughput(reports: &[&Report]) -> Chart {
    against_load(reports, "Output throughput", "output tokens/s", |s| s.output_tokens_per_s)
}

/// p90 TTFT against load.
pub fn ttft_p90(reports: &[&Report]) -> Chart {
    against_load(reports, "p90 time to first token", "p90 TTFT (ms)", |s| s.ttft.p90 * 1e3)
}

/// Goodput (requests per second within the run's targets) against load.
pub fn goodput(reports: &[&Report]) -> Chart {
    against_load(reports, "Goodput", "requests/s within the targets", |s| {
        s.goodput.as_ref().map_or(f64::NAN, |g| g.per_s)
    })
}

/// Whether any level of the runs measured goodput (targets were given).
pub fn has_goodput(reports: &[&Report]) -> bool {
    reports.iter().flat_map(|r| &r.levels).any(|l| l.summary.goodput.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;

    fn report(label: &str) -> Report {
        let level = |clients: usize, ttft: f64| {
            let records: Vec<Record> = (0..4)
                .map(|i| Record {
                    start_s: f64::from(i),
                    chunks_s: vec![f64::from(i) + ttft, f64::from(i) + ttft + 0.1],
                    end_s: f64::from(i) + ttft + 0.2,
                    output_tokens: 2,
                    error: (i == 3).then(|| "http_5xx".to_owned()),
                    ..Record::default()
                })
                .collect();
            (clients, records)
        };
        crate::report::test_report(label, vec![level(1, 0.1), level(4, 0.3)])
    }

    #[test]
    fn charts_from_reports() {
        assert_eq!(cdf(&[0.003, 0.001, f64::NAN]), vec![(1.0, 0.0), (1.0, 0.5), (3.0, 0.5), (3.0, 1.0)]);
        let a = report("a");
        let b = report("b");
        let c = latency_cdf(&[&a, &b], "TTFT", |r| r.ttft());
        assert_eq!(c.series.len(), 4);
        assert_eq!(c.series[2].label, "b: 1 client");
        assert_eq!(c.series[0].points.len(), 6, "failures are not latencies");
        assert!((c.series[1].points[0].0 - 300.0).abs() < 1e-9);
        let t = throughput(&[&a]);
        assert_eq!(t.x, "concurrent clients");
        assert_eq!(t.series[0].points.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1.0, 4.0]);
        let tl = timeline(&a);
        assert_eq!(tl.series[0].points.len(), 6);
        assert_eq!(tl.series[1].points.len(), 2);
        // The second level's requests come after the first level's end (3.3 s), where a divider marks it.
        assert!(tl.series[0].points.iter().any(|p| (p.0 - 3.3).abs() < 1e-9));
        assert_eq!(tl.dividers.len(), 2);
        assert!((tl.dividers[1].0 - 3.3).abs() < 1e-9 && tl.dividers[1].1 == "4 clients", "{:?}", tl.dividers);
        // Clients are counted in whole numbers; a run of one level is a marker, not an invisible line.
        assert!(t.integer_x && t.series[0].mark == Mark::Line);
        let one = crate::report::Report { levels: vec![a.levels[1].clone()], ..a.clone() };
        let both = throughput(&[&a, &one]);
        assert_eq!(both.series[1].mark, Mark::Marker);
        assert_eq!(both.series[1].points.len(), 1);
    }

    #[test]
    fn client_axes_have_whole_ticks() {
        let dir = tempfile::tempdir().unwrap();
        for end in [1.0, 4.0, 16.0, 64.0] {
            let chart = Chart {
                title: "t".into(),
                x: "concurrent clients".into(),
                y: "y".into(),
                series: vec![Series { label: "a".into(), points: vec![(1.0, 100.0), (end, 400.0)], mark: Mark::Line }],
                legend_low: false,
                integer_x: true,
                dividers: vec![],
            };
            draw(&chart, dir.path(), "ticks").unwrap();
            let svg = std::fs::read_to_string(dir.path().join("ticks.svg")).unwrap();
            // The y axis labels read `50.0`; the x axis's are whole, so a fractional tick would show as a repeat.
            let mut x: Vec<&str> = svg
                .split('>')
                .filter_map(|t| t.split('<').next())
                .map(str::trim)
                .filter(|t| !t.is_empty() && !t.contains('.') && t.parse::<u32>().is_ok())
                .collect();
            assert!(x.len() >= 2 && x.contains(&"0"), "{x:?}");
            let n = x.len();
            x.dedup();
            assert_eq!(x.len(), n, "repeated (fractional) ticks up to {end}: {x:?}");
        }
    }

    #[test]
    fn files_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let files = run_plots(&report("a"), dir.path()).unwrap();
        assert_eq!(files.len(), 10);
        for f in files {
            let bytes = std::fs::read(&f).unwrap();
            if f.extension().unwrap() == "png" {
                assert_eq!(&bytes[1..4], b"PNG");
            } else {
                let text = String::from_utf8(bytes).unwrap();
                assert!(text.contains("<svg") && text.contains("<text"), "{}", f.display());
            }
        }
        // A chart without points still draws.
        let empty = Chart {
            title: "e".into(),
            x: "x".into(),
            y: "y".into(),
            series: vec![],
            legend_low: false,
            integer_x: true,
            dividers: vec![(1.0, "level".into())],
        };
        assert_eq!(draw(&empty, dir.path(), "empty").unwrap().len(), 2);
    }
}
