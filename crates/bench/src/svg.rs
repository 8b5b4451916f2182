//! Line plots as hand-written SVG: one file per figure, x = the varied parameter, y = MiB/s or
//! ops/s, one line per target and phase, labelled axes. No plotting dependency: a plot here is
//! a few hundred bytes of markup that any browser or Markdown viewer shows.

use std::fmt::Write;

use crate::units::format_size;

/// How x values are placed and labelled.
#[derive(Debug, Clone, PartialEq)]
pub enum XAxis {
    /// Evenly spaced by value.
    Linear,
    /// Evenly spaced by doubling (tasks 1, 2, 4, ...).
    Log2,
    /// Byte sizes, evenly spaced by doubling, labelled `4k`, `1m`.
    Log2Bytes,
    /// Named categories; point x values are indices into the names.
    Categories(Vec<String>),
}

#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    /// (x, y) in data units.
    pub points: Vec<(f64, f64)>,
}

#[derive(Debug, Clone)]
pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_axis: XAxis,
    pub series: Vec<Series>,
}

const WIDTH: f64 = 820.0;
const HEIGHT: f64 = 480.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
const COLORS: [&str; 10] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

/// The SVG document for `plot`.
pub fn render(plot: &Plot) -> String {
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let mut xs: Vec<f64> = plot.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
    if let XAxis::Categories(names) = &plot.x_axis {
        xs = (0..names.len()).map(|i| i as f64).collect();
    }
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let position = |x: f64| -> f64 {
        match plot.x_axis {
            XAxis::Log2 | XAxis::Log2Bytes => x.max(f64::MIN_POSITIVE).log2(),
            _ => x,
        }
    };
    let (x_min, x_max) = match (xs.first(), xs.last()) {
        (Some(&a), Some(&b)) if position(b) > position(a) => (position(a), position(b)),
        (Some(&a), _) => (position(a) - 1.0, position(a) + 1.0),
        _ => (0.0, 1.0),
    };
    // Categories get half a slot of margin on each side.
    let (x_min, x_max) =
        if matches!(plot.x_axis, XAxis::Categories(_)) { (x_min - 0.5, x_max + 0.5) } else { (x_min, x_max) };
    let y_data_max = plot.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(0.0, f64::max);
    let (y_max, y_step) = nice_axis(y_data_max);
    let px = |x: f64| LEFT + (position(x) - x_min) / (x_max - x_min) * plot_width;
    let py = |y: f64| TOP + plot_height - y / y_max * plot_height;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="28" text-anchor="middle" font-size="16" font-weight="bold">{}</text>"#,
        LEFT + plot_width / 2.0,
        escape(&plot.title)
    );
    // Grid and y ticks.
    let mut y = 0.0;
    while y <= y_max * 1.000_001 {
        let yy = py(y);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e0e0e0"/>"##,
            LEFT + plot_width
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            yy + 4.0,
            format_number(y)
        );
        y += y_step;
    }
    // x ticks at the data's x values.
    for &x in &xs {
        let xx = px(x);
        let label = match &plot.x_axis {
            XAxis::Log2Bytes => format_size(x as u64),
            XAxis::Categories(names) => names.get(x as usize).cloned().unwrap_or_default(),
            _ => format_number(x),
        };
        let _ = writeln!(
            svg,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#333"/>"##,
            TOP + plot_height,
            TOP + plot_height + 5.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + plot_height + 20.0,
            escape(&label)
        );
    }
    // Axes and their labels.
    let _ = writeln!(
        svg,
        r##"<polyline points="{LEFT},{TOP} {LEFT},{:.1} {:.1},{:.1}" fill="none" stroke="#333"/>"##,
        TOP + plot_height,
        LEFT + plot_width,
        TOP + plot_height
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + plot_width / 2.0,
        HEIGHT - 25.0,
        escape(&plot.x_label)
    );
    let _ = writeln!(
        svg,
        r#"<text x="20" y="{:.1}" text-anchor="middle" transform="rotate(-90 20 {:.1})">{}</text>"#,
        TOP + plot_height / 2.0,
        TOP + plot_height / 2.0,
        escape(&plot.y_label)
    );
    // Lines, markers and the legend.
    for (i, series) in plot.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let dash = if (i / COLORS.len()) % 2 == 1 { r#" stroke-dasharray="6 3""# } else { "" };
        let mut points: Vec<(f64, f64)> = series.points.clone();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
            path.join(" ")
        );
        for &(x, y) in &points {
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"><title>{}: {}</title></circle>"#,
                px(x),
                py(y),
                escape(&series.label),
                format_number(y)
            );
        }
        let ly = TOP + 10.0 + i as f64 * 18.0;
        let lx = LEFT + plot_width + 15.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/>"#,
            lx + 22.0
        );
        let _ = writeln!(svg, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, lx + 28.0, ly + 4.0, escape(&series.label));
    }
    svg.push_str("</svg>\n");
    svg
}

/// A round axis maximum at or above `max` and a step giving about five ticks.
fn nice_axis(max: f64) -> (f64, f64) {
    if max.is_nan() || max <= 0.0 || !max.is_finite() {
        return (1.0, 0.2);
    }
    let rough_step = max / 5.0;
    let magnitude = 10f64.powf(rough_step.log10().floor());
    let step =
        [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * magnitude).find(|&s| s >= rough_step).unwrap_or(10.0 * magnitude);
    ((max / step).ceil() * step, step)
}

/// Numbers for labels: integers without decimals, small values with a few.
pub fn format_number(value: f64) -> String {
    if value == value.round() && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 1.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.3}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_are_round() {
        assert_eq!(nice_axis(0.0), (1.0, 0.2));
        assert_eq!(nice_axis(95.0), (100.0, 20.0));
        assert_eq!(nice_axis(1234.0), (1250.0, 250.0));
        let (max, step) = nice_axis(3.3);
        assert!(max >= 3.3 && step > 0.0 && (max / step) <= 6.0);
    }

    #[test]
    fn renders_lines_labels_and_legend() {
        let plot = Plot {
            title: "Bandwidth by transfer size <test>".into(),
            x_label: "transfer size (bytes)".into(),
            y_label: "MiB/s".into(),
            x_axis: XAxis::Log2Bytes,
            series: vec![
                Series { label: "local write".into(), points: vec![(4096.0, 100.0), (1048576.0, 900.0)] },
                Series { label: "local read".into(), points: vec![(4096.0, 300.0), (1048576.0, 2000.0)] },
            ],
        };
        let svg = render(&plot);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("&lt;test&gt;"));
        assert!(svg.contains(">4k<") && svg.contains(">1m<"));
        assert!(svg.contains("MiB/s") && svg.contains("transfer size (bytes)"));
        assert_eq!(svg.matches("<polyline").count(), 3, "two lines and the axes");
        assert!(svg.contains("local write") && svg.contains("local read"));
    }

    #[test]
    fn renders_categories_and_empty_plots() {
        let plot = Plot {
            title: "pattern".into(),
            x_label: "access pattern".into(),
            y_label: "MiB/s".into(),
            x_axis: XAxis::Categories(vec!["sequential".into(), "random".into()]),
            series: vec![Series { label: "a".into(), points: vec![(0.0, 5.0), (1.0, 2.0)] }],
        };
        let svg = render(&plot);
        assert!(svg.contains(">sequential<") && svg.contains(">random<"));
        let empty = render(&Plot { series: vec![], x_axis: XAxis::Linear, ..plot });
        assert!(empty.contains("</svg>"));
    }
}
