//! Line plots as hand-written SVG: one file per figure, x = the varied parameter, y = MiB/s or
//! ops/s, one line per target and phase, labelled axes. No plotting dependency: a plot here is
//! a few hundred bytes of markup that any browser or Markdown viewer shows.
//!
//! SVG text does not wrap and the viewer picks the font, so a title is laid out here from
//! an estimate of its width (DejaVu Sans Bold's advances, the widest of the usual
//! sans-serif fonts): one that would spill past the picture's edges is wrapped onto a
//! second line, at a smaller size if it must be, and the plot moves down to make room.

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
/// Space kept clear between a title and the picture's edges.
const TITLE_MARGIN: f64 = 10.0;
/// Baseline of a title's first line.
const TITLE_BASELINE: f64 = 28.0;
/// Title sizes tried in turn, largest first, until the title fits in [`TITLE_LINES_MAX`].
const TITLE_FONT_SIZES: [f64; 4] = [16.0, 14.0, 12.0, 10.0];
/// Lines a title may take; a longer one is cut, with an ellipsis, at the smallest size.
const TITLE_LINES_MAX: usize = 2;

const COLORS: [&str; 10] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

/// The SVG document for `plot`.
pub fn render(plot: &Plot) -> String {
    let plot_width = WIDTH - LEFT - RIGHT;
    let title = layout_title(&plot.title, LEFT + plot_width / 2.0);
    // Each line past the first pushes the plot down.
    let top = TOP + (title.lines.len().max(1) - 1) as f64 * title.line_height();
    let plot_height = HEIGHT - top - BOTTOM;
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
    let py = |y: f64| top + plot_height - y / y_max * plot_height;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, line) in title.lines.iter().enumerate() {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="{}" font-weight="bold">{}</text>"#,
            title.center_x,
            TITLE_BASELINE + i as f64 * title.line_height(),
            title.font_size,
            escape(line)
        );
    }
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
            top + plot_height,
            top + plot_height + 5.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            top + plot_height + 20.0,
            escape(&label)
        );
    }
    // Axes and their labels.
    let _ = writeln!(
        svg,
        r##"<polyline points="{LEFT},{top} {LEFT},{:.1} {:.1},{:.1}" fill="none" stroke="#333"/>"##,
        top + plot_height,
        LEFT + plot_width,
        top + plot_height
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
        top + plot_height / 2.0,
        top + plot_height / 2.0,
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
        let ly = top + 10.0 + i as f64 * 18.0;
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

/// Advance widths of printable ASCII (space to `~`) in DejaVu Sans Bold, in thousandths
/// of the font size, rounded up. Other characters count as a full em.
const BOLD_ADVANCE_MILLI_EM: [u16; 95] = [
    349, 457, 521, 838, 696, 1002, 873, 307, 458, 458, 523, 838, 380, 416, 380, 366, 696, 696, 696, 696, 696, 696, 696,
    696, 696, 696, 400, 400, 838, 838, 838, 581, 1000, 774, 763, 734, 831, 684, 684, 821, 837, 373, 373, 775, 638, 996,
    837, 851, 733, 851, 771, 721, 683, 813, 774, 1104, 771, 725, 726, 458, 366, 458, 838, 500, 500, 675, 716, 593, 716,
    679, 436, 716, 712, 343, 343, 666, 343, 1042, 712, 688, 716, 716, 494, 596, 479, 712, 652, 924, 646, 652, 583, 712,
    366, 712, 838,
];

/// The estimated width in pixels of `text` drawn bold at `font_size` pixels.
fn bold_text_width(text: &str, font_size: f64) -> f64 {
    let milli_em: u64 = text
        .chars()
        .map(|c| match c {
            ' '..='~' => u64::from(BOLD_ADVANCE_MILLI_EM[c as usize - ' ' as usize]),
            _ => 1000,
        })
        .sum();
    milli_em as f64 / 1000.0 * font_size
}

/// A title as drawn: its lines, at one size, centred on one x.
#[derive(Debug, Clone, PartialEq)]
struct TitleLayout {
    font_size: f64,
    center_x: f64,
    lines: Vec<String>,
}

impl TitleLayout {
    fn line_height(&self) -> f64 {
        (self.font_size * 1.2).round()
    }
}

/// Lays `title` out to stay inside the picture: at the largest of [`TITLE_FONT_SIZES`]
/// at which it wraps into [`TITLE_LINES_MAX`] lines, else at the smallest, cut to that
/// many lines with an ellipsis. Lines are balanced (a two-line title breaks near its
/// middle, not after all but its last word) and centred on `preferred_center_x` (the
/// plot's middle) where the widest fits there, else moved towards the picture's middle
/// as far as it must.
fn layout_title(title: &str, preferred_center_x: f64) -> TitleLayout {
    let room = WIDTH - 2.0 * TITLE_MARGIN;
    let smallest = TITLE_FONT_SIZES[TITLE_FONT_SIZES.len() - 1];
    let (font_size, mut lines) = TITLE_FONT_SIZES
        .iter()
        .map(|&size| (size, wrap(title, size, room)))
        .find(|(_, lines)| lines.len() <= TITLE_LINES_MAX)
        .unwrap_or_else(|| (smallest, wrap(title, smallest, room)));
    if lines.len() > TITLE_LINES_MAX {
        lines.truncate(TITLE_LINES_MAX);
        let last = lines.last_mut().expect("at least one line");
        while !last.is_empty() && bold_text_width(&format!("{last}\u{2026}"), font_size) > room {
            last.pop();
        }
        last.push('\u{2026}');
    }
    let lines = balance(title, font_size, lines);
    let half = lines.iter().map(|l| bold_text_width(l, font_size)).fold(0.0, f64::max) / 2.0;
    // Whole pixels; the margin leaves room for the rounding.
    let center_x = preferred_center_x.min(WIDTH - TITLE_MARGIN - half).max(TITLE_MARGIN + half).round();
    TitleLayout { font_size, center_x, lines }
}

/// `lines`, the greedy wrapping of `text`, rewrapped as narrow as it can be in as many
/// lines: the narrowest room (to a pixel, by bisection) that wraps into no more. A cut
/// title (ending in an ellipsis) is kept as it is.
fn balance(text: &str, font_size: f64, lines: Vec<String>) -> Vec<String> {
    if lines.len() < 2 || lines.last().is_some_and(|l| l.ends_with('\u{2026}')) {
        return lines;
    }
    let widest = |ls: &[String]| ls.iter().map(|l| bold_text_width(l, font_size)).fold(0.0, f64::max);
    let (mut narrow, mut wide) = (0.0, widest(&lines));
    // At most log2(WIDTH) rounds: each halves the gap, down to a pixel.
    while wide - narrow > 1.0 {
        let mid = (narrow + wide) / 2.0;
        if wrap(text, font_size, mid).len() <= lines.len() {
            wide = mid;
        } else {
            narrow = mid;
        }
    }
    let balanced = wrap(text, font_size, wide);
    if balanced.len() <= lines.len() {
        balanced
    } else {
        lines
    }
}

/// `text` broken into lines no wider than `room` pixels at `font_size`: at spaces,
/// and inside a word only when the word alone is wider than the room.
fn wrap(text: &str, font_size: f64, room: f64) -> Vec<String> {
    let fits = |s: &str| bold_text_width(s, font_size) <= room;
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let joined = if line.is_empty() { word.to_string() } else { format!("{line} {word}") };
        if fits(&joined) {
            line = joined;
            continue;
        }
        if !line.is_empty() {
            lines.push(std::mem::take(&mut line));
        }
        for c in word.chars() {
            line.push(c);
            if !fits(&line) {
                line.pop();
                lines.push(std::mem::replace(&mut line, c.to_string()));
            }
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
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

    /// Seed 004 figure 3's title, as the nbd preset names it: wider than the picture
    /// in one line at 16 px.
    const LONG_TITLE: &str =
        "Write bandwidth by amount written, 64 KiB, one in flight, and the model (seed 004 figure 3)";

    /// Each title line of `svg`: its x (the middle), font size and text.
    fn title_lines(svg: &str) -> Vec<(f64, f64, String)> {
        svg.lines()
            .filter(|l| l.starts_with("<text") && l.contains(r#"font-weight="bold""#))
            .map(|l| {
                let attribute = |name: &str| -> f64 {
                    let start = l.find(&format!(" {name}=\"")).expect(name) + name.len() + 3;
                    l[start..start + l[start..].find('"').unwrap()].parse().expect("a number")
                };
                let text = &l[l.find('>').unwrap() + 1..l.rfind("</text>").unwrap()];
                (attribute("x"), attribute("font-size"), text.to_string())
            })
            .collect()
    }

    fn plot_titled(title: &str) -> Plot {
        Plot {
            title: title.into(),
            x_label: "bytes written".into(),
            y_label: "MiB/s".into(),
            x_axis: XAxis::Log2Bytes,
            series: vec![Series { label: "nbd write".into(), points: vec![(65536.0, 90.0), (1048576.0, 400.0)] }],
        }
    }

    #[test]
    fn the_width_estimate_is_dejavu_sans_bold() {
        // Measured from DejaVuSans-Bold.ttf's advance widths: 834.9 px at 16 px.
        let measured = 834.93;
        // Rounded up per character: never narrower than the font, at most a pixel wider.
        let estimate = bold_text_width(LONG_TITLE, 16.0);
        assert!((measured..measured + 1.0).contains(&estimate), "{estimate}");
        assert!(measured > WIDTH, "the title does not fit on one line, so the test below has something to wrap");
        assert_eq!(bold_text_width("ij", 10.0), bold_text_width("i", 10.0) * 2.0);
        assert_eq!(bold_text_width("\u{e9}", 10.0), 10.0, "outside ASCII, an em");
    }

    #[test]
    fn long_titles_stay_inside_the_picture() {
        let very_long = [LONG_TITLE; 5].join(" ");
        let unbroken = "x".repeat(150);
        for title in [LONG_TITLE, very_long.as_str(), unbroken.as_str(), "Short"] {
            let svg = render(&plot_titled(title));
            let lines = title_lines(&svg);
            assert!(!lines.is_empty() && lines.len() <= TITLE_LINES_MAX, "{svg}");
            for (x, size, text) in &lines {
                let half = bold_text_width(text, *size) / 2.0;
                assert!(x - half >= 0.0 && x + half <= WIDTH, "{text:?} spans {:.1}..{:.1}", x - half, x + half);
            }
            let drawn: Vec<&str> = lines.iter().map(|(_, _, t)| t.as_str()).collect();
            if title == very_long {
                assert!(drawn.last().unwrap().ends_with('\u{2026}'), "a cut title says so: {drawn:?}");
            } else {
                let sep = if title == unbroken { "" } else { " " };
                assert_eq!(drawn.join(sep), title, "every word drawn, in order");
            }
        }
        // Seed 004 figure 3 keeps its size on two lines, and the plot moves down
        // below the second.
        let svg = render(&plot_titled(LONG_TITLE));
        let lines = title_lines(&svg);
        assert_eq!(lines.len(), 2);
        assert!(lines.iter().all(|(_, size, _)| *size == 16.0));
        let axes = svg.lines().find(|l| l.starts_with("<polyline") && l.contains("#333")).unwrap();
        assert!(axes.contains(&format!(r#"points="{LEFT},{} "#, TOP + 19.0)), "{axes}");
        // Broken near its middle, not before its last words.
        let widths: Vec<f64> = lines.iter().map(|(_, size, t)| bold_text_width(t, *size)).collect();
        assert!((widths[0] - widths[1]).abs() < 0.25 * widths[0], "{lines:?}");
        // A short title stays over the middle of the plot, where it was.
        let short = title_lines(&render(&plot_titled("Short")));
        assert_eq!(short, vec![(LEFT + (WIDTH - LEFT - RIGHT) / 2.0, 16.0, "Short".to_string())]);
    }
}
