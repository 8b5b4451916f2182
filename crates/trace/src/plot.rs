//! `braid trace plot`: a stored trace drawn as SVG, hand-written (no plotting
//! dependency): each file's offsets over time (the access pattern as Darshan's DXT
//! plots show it), and each job's operations per second over time.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::record::Op;
use crate::store::Entry;

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 500.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 260.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 10] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
/// Points drawn per file at most (evenly thinned past it).
const MAX_POINTS: usize = 5000;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A round step for an axis up to `max` with about five ticks.
fn step(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag)
}

fn bytes_label(v: f64) -> String {
    let units = ["", "K", "M", "G", "T", "P"];
    let mut v = v;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0}{}", units[u])
    } else {
        format!("{v:.1}{}", units[u])
    }
}

struct Chart {
    title: String,
    x_label: String,
    y_label: String,
    y_bytes: bool,
    /// Label and points of each series.
    series: Vec<(String, Vec<(f64, f64)>)>,
    lines: bool,
}

impl Chart {
    fn render(&self) -> String {
        let pw = WIDTH - LEFT - RIGHT;
        let ph = HEIGHT - TOP - BOTTOM;
        let all = self.series.iter().flat_map(|(_, p)| p.iter());
        let (x_max, y_max) = all.fold((0f64, 0f64), |(a, b), &(x, y)| (a.max(x), b.max(y)));
        let (xs, ys) = (step(x_max), if self.y_bytes { bytes_step(y_max) } else { step(y_max) });
        let x_top = (x_max / xs).ceil().max(1.0) * xs;
        let y_top = (y_max / ys).ceil().max(1.0) * ys;
        let px = |x: f64| LEFT + x / x_top * pw;
        let py = |y: f64| TOP + ph - y / y_top * ph;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="28" text-anchor="middle" font-size="16" font-weight="bold">{}</text>"#,
            LEFT + pw / 2.0,
            escape(&self.title)
        );
        let mut y = 0.0;
        while y <= y_top * 1.000_001 {
            let label = if self.y_bytes { bytes_label(y) } else { format!("{y}") };
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#e0e0e0"/>"##,
                py(y),
                LEFT + pw
            );
            let _ =
                writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"#, LEFT - 6.0, py(y) + 4.0);
            y += ys;
        }
        let mut x = 0.0;
        while x <= x_top * 1.000_001 {
            let _ = writeln!(
                s,
                r##"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="#333"/>"##,
                px(x),
                TOP + ph,
                TOP + ph + 5.0
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                px(x),
                TOP + ph + 18.0,
                round(x)
            );
            x += xs;
        }
        let _ = writeln!(s, r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##);
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + pw / 2.0,
            HEIGHT - 15.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text x="20" y="{0:.1}" text-anchor="middle" transform="rotate(-90 20 {0:.1})">{1}</text>"#,
            TOP + ph / 2.0,
            escape(&self.y_label)
        );
        for (i, (label, points)) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            if self.lines {
                let path: Vec<String> = points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
                let _ = writeln!(
                    s,
                    r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
                    path.join(" ")
                );
            } else {
                let thin = points.len().div_ceil(MAX_POINTS).max(1);
                for &(x, y) in points.iter().step_by(thin) {
                    let _ = writeln!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="1.6" fill="{color}"/>"#, px(x), py(y));
                }
            }
            let ly = TOP + 10.0 + i as f64 * 18.0;
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="12" height="12" fill="{color}"/>"#,
                LEFT + pw + 15.0,
                ly - 10.0
            );
            let _ = writeln!(s, r#"<text x="{:.1}" y="{ly:.1}">{}</text>"#, LEFT + pw + 32.0, escape(label));
        }
        s.push_str("</svg>\n");
        s
    }
}

fn round(x: f64) -> String {
    if x.fract().abs() < 1e-9 {
        format!("{x:.0}")
    } else {
        format!("{x:.3}").trim_end_matches('0').to_string()
    }
}

/// A power-of-two step for a byte axis up to `max`, with about five ticks.
fn bytes_step(max: f64) -> f64 {
    let mut s = 1.0;
    while max / s > 6.0 {
        s *= 2.0;
    }
    s
}

/// Offset of each read and write over time (seconds from the first operation), one
/// colour per file, the `max_files` files with the most transfers.
pub fn offsets(entries: &[Entry], max_files: usize) -> String {
    let t0 = entries.iter().map(|e| e.record.start_ns).min().unwrap_or(0);
    let mut files: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.record.op.is_data() && e.record.errno == 0) {
        let r = &e.record;
        let label = format!("{} {}", r.fid, if r.op == Op::Read { "read" } else { "write" });
        files.entry(label).or_default().push(((r.start_ns - t0) as f64 / 1e9, r.offset as f64));
    }
    let mut series: Vec<(String, Vec<(f64, f64)>)> = files.into_iter().collect();
    series.sort_by_key(|(_, p)| std::cmp::Reverse(p.len()));
    series.truncate(max_files);
    Chart {
        title: "Offset over time, per file".into(),
        x_label: "seconds".into(),
        y_label: "offset (bytes)".into(),
        y_bytes: true,
        series,
        lines: false,
    }
    .render()
}

/// Operations per second of each job over time, in `buckets` slices of the trace.
pub fn jobs(entries: &[Entry], buckets: usize) -> String {
    let buckets = buckets.max(1);
    let t0 = entries.iter().map(|e| e.record.start_ns).min().unwrap_or(0);
    let t1 = entries.iter().map(|e| e.record.start_ns).max().unwrap_or(0);
    let span = ((t1 - t0) as f64 / 1e9).max(1e-3);
    let width = span / buckets as f64;
    let mut per_job: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for e in entries {
        let job = e.job.as_deref().unwrap_or("-").to_string();
        let t = (e.record.start_ns - t0) as f64 / 1e9;
        let i = ((t / width) as usize).min(buckets - 1);
        per_job.entry(job).or_insert_with(|| vec![0.0; buckets])[i] += 1.0;
    }
    let series = per_job
        .into_iter()
        .map(|(job, counts)| {
            let label = if job == "-" { "no job".to_string() } else { format!("job {job}") };
            (label, counts.iter().enumerate().map(|(i, c)| ((i as f64 + 0.5) * width, c / width)).collect())
        })
        .collect();
    Chart {
        title: "Operations per second, per job".into(),
        x_label: "seconds".into(),
        y_label: "operations per second".into(),
        y_bytes: false,
        series,
        lines: true,
    }
    .render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Record, Target, NO_JOB};
    use proto::Fid;
    use std::sync::Arc;

    #[test]
    fn plots_are_svg_with_a_series_per_file_and_job() {
        let entries: Vec<Entry> = (0..100u64)
            .map(|i| Entry {
                record: Record {
                    start_ns: 1_000_000_000 + i * 10_000_000,
                    dur_ns: 1,
                    pid: 1,
                    uid: 0,
                    gid: 0,
                    fid: Fid { seq: 1, oid: (i % 2) as u32, ver: 0 },
                    offset: i * 4096,
                    len: 4096,
                    job: NO_JOB,
                    op: if i % 3 == 0 { Op::Open } else { Op::Write },
                    errno: 0,
                    target: Target::Ost(0),
                },
                client: Arc::from("c"),
                job: Some(Arc::from(if i < 50 { "a<b" } else { "b" })),
            })
            .collect();
        let svg = offsets(&entries, 10);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<circle").count(), 66, "one point per write");
        assert!(svg.contains("[0x1:0x0:0x0] write") && svg.contains("[0x1:0x1:0x0] write"));
        let j = jobs(&entries, 10);
        assert_eq!(j.matches("<polyline").count(), 2);
        assert!(j.contains("job a&lt;b"), "names are escaped");
        assert!(offsets(&[], 5).contains("</svg>"), "an empty trace still draws");
    }
}
