//! What a sweep's report is made of: its targets, its figures (series of points on
//! an axis) and the runs behind them. Shared by [`crate::sweep`], which writes the
//! report, and the presets that measure something other than a directory
//! ([`crate::nbd`]).

use serde::Serialize;

use crate::svg::XAxis;

/// One target: `LABEL=DIR` (or a URL the preset measures).
#[derive(Debug, Clone, Serialize)]
pub struct SweepTarget {
    pub label: String,
    pub location: String,
    pub file_system: String,
}

/// A figure of the report, with its data.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub id: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<FigureSeries>,
    #[serde(skip)]
    pub x_axis: XAxis,
}

#[derive(Debug, Clone, Serialize)]
pub struct FigureSeries {
    pub label: String,
    pub points: Vec<FigurePoint>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FigurePoint {
    pub x: f64,
    pub x_label: String,
    pub y: f64,
}

/// One engine run behind some points.
#[derive(Debug, Clone, Serialize)]
pub struct SweepRun {
    pub target: String,
    pub command: String,
    pub report: serde_json::Value,
}

/// Collects points into figures as runs finish.
pub struct Figures {
    pub figures: Vec<Figure>,
}

impl Figures {
    pub fn add(&mut self, figure: &str, series: String, x: f64, x_label: String, y: f64) {
        let figure = self.figures.iter_mut().find(|f| f.id == figure).expect("figure declared before use");
        let point = FigurePoint { x, x_label, y };
        match figure.series.iter_mut().find(|s| s.label == series) {
            Some(s) => s.points.push(point),
            None => figure.series.push(FigureSeries { label: series, points: vec![point] }),
        }
    }
}

pub fn figure(id: &str, title: &str, x_label: &str, y_label: &str, x_axis: XAxis) -> Figure {
    Figure {
        id: id.into(),
        title: title.into(),
        x_label: x_label.into(),
        y_label: y_label.into(),
        series: Vec::new(),
        x_axis,
    }
}
