//! Pictures for `nightshift-atlas report`, each written as PNG and SVG with plotters: a layer ×
//! expert heatmap of activations relative to the layer mean, and coverage curves (share of
//! activations taken by the hottest x% of experts, per layer and overall). PNG text is rendered
//! with ab_glyph from DejaVu Sans Mono embedded in the binary (assets/, Bitstream Vera licence),
//! so no system font or fontconfig is needed; SVG text is plain `<text>`.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::stats::{coverage_curve, flatten};
use crate::trace::Counts;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSansMono.ttf");
static REGISTER: Once = Once::new();

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("cannot draw {path}: {message}")]
    Draw { path: PathBuf, message: String },
    #[error("cannot create output directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("embedded font is not a valid TrueType font")]
    Font,
}

fn register_font() -> Result<(), PlotError> {
    let mut result = Ok(());
    REGISTER.call_once(|| {
        for style in [FontStyle::Normal, FontStyle::Bold] {
            if plotters::style::register_font("sans-serif", style, FONT).is_err() {
                result = Err(PlotError::Font);
            }
        }
    });
    result
}

/// Viridis-like gradient for `t` in [0, 1].
fn gradient(t: f64) -> RGBColor {
    const STOPS: [(f64, f64, f64); 5] = [
        (68.0, 1.0, 84.0),
        (59.0, 82.0, 139.0),
        (33.0, 145.0, 140.0),
        (94.0, 201.0, 98.0),
        (253.0, 231.0, 37.0),
    ];
    let t = t.clamp(0.0, 1.0) * (STOPS.len() - 1) as f64;
    let i = (t.floor() as usize).min(STOPS.len() - 2);
    let f = t - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |x: f64, y: f64| (x + (y - x) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Heatmap colour scale: log2(count / layer mean) from -LOG_SPAN (dark) to +LOG_SPAN (yellow).
const LOG_SPAN: f64 = 4.0;

type DrawResult = Result<(), String>;

fn heatmap<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    layers: &[usize],
    counts: &Counts,
    title: &str,
) -> DrawResult {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (w, _) = root.dim_in_pixel();
    let (main, legend) = root.split_horizontally(w.saturating_sub(110));
    let n_layers = layers.len();
    let n_experts = counts.activations.first().map_or(0, Vec::len);
    let mut chart = ChartBuilder::on(&main)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0..n_experts, 0..n_layers)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("expert id")
        .label_style(("sans-serif", 13))
        .y_desc("MoE layer")
        .y_label_formatter(&|s| layers.get(*s).map_or(String::new(), |l| l.to_string()))
        .draw()
        .map_err(|e| err(&e))?;
    let cells = counts.activations.iter().enumerate().flat_map(|(s, row)| {
        let mean = row.iter().sum::<u64>() as f64 / row.len().max(1) as f64;
        row.iter().enumerate().map(move |(x, &c)| {
            let rel = if mean > 0.0 && c > 0 {
                (c as f64 / mean).log2()
            } else {
                -LOG_SPAN
            };
            let t = (rel + LOG_SPAN) / (2.0 * LOG_SPAN);
            Rectangle::new([(x, s), (x + 1, s + 1)], gradient(t).filled())
        })
    });
    chart.draw_series(cells).map_err(|e| err(&e))?;

    let mut bar = ChartBuilder::on(&legend)
        .margin_top(40)
        .margin_bottom(50)
        .margin_right(10)
        .y_label_area_size(45)
        .caption("log2(x/mean)", ("sans-serif", 12))
        .build_cartesian_2d(0..1, -LOG_SPAN..LOG_SPAN)
        .map_err(|e| err(&e))?;
    bar.configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_labels(9)
        .y_label_style(("sans-serif", 13))
        .y_label_formatter(&|v| format!("{v:+.0}"))
        .draw()
        .map_err(|e| err(&e))?;
    let steps = 64;
    bar.draw_series((0..steps).map(|i| {
        let lo = -LOG_SPAN + 2.0 * LOG_SPAN * i as f64 / steps as f64;
        let hi = -LOG_SPAN + 2.0 * LOG_SPAN * (i + 1) as f64 / steps as f64;
        Rectangle::new(
            [(0, lo), (1, hi)],
            gradient((i as f64 + 0.5) / steps as f64).filled(),
        )
    }))
    .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

fn coverage<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    counts: &Counts,
    title: &str,
) -> DrawResult {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..100.0, 0.0..100.0)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("hottest experts (% of experts)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .y_desc("activations covered (%)")
        .label_style(("sans-serif", 13))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(|e| err(&e))?;
    let points = |curve: Vec<f64>| -> Vec<(f64, f64)> {
        let n = curve.len() as f64;
        std::iter::once((0.0, 0.0))
            .chain(
                curve
                    .iter()
                    .enumerate()
                    .map(|(i, &y)| (100.0 * (i + 1) as f64 / n, 100.0 * y)),
            )
            .collect()
    };
    let grey = RGBColor(190, 190, 190);
    for (i, row) in counts.activations.iter().enumerate() {
        let s = chart
            .draw_series(LineSeries::new(
                points(coverage_curve(row)),
                grey.stroke_width(1),
            ))
            .map_err(|e| err(&e))?;
        if i == 0 {
            s.label("one MoE layer")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey));
        }
    }
    let overall = coverage_curve(&flatten(counts));
    let at50 = overall
        .get(overall.len().div_ceil(2).saturating_sub(1))
        .copied()
        .unwrap_or(0.0)
        * 100.0;
    chart
        .draw_series(LineSeries::new(points(overall), BLUE.stroke_width(3)))
        .map_err(|e| err(&e))?
        .label(format!("all layers (50% -> {at50:.1}%)"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(3)));
    chart
        .draw_series(LineSeries::new(
            vec![(0.0, 0.0), (100.0, 100.0)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| err(&e))?
        .label("uniform routing")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

/// Writes heatmap.{png,svg} and coverage.{png,svg} into `dir`; returns the paths written.
pub fn write_all(
    dir: &Path,
    layers: &[usize],
    counts: &Counts,
    model: &str,
) -> Result<Vec<PathBuf>, PlotError> {
    register_font()?;
    std::fs::create_dir_all(dir).map_err(|source| PlotError::Dir {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    let heat_title = format!("{model}: activations per (layer, expert)");
    let cov_title = format!("{model}: coverage");
    let h = (layers.len() * 8).clamp(240, 1200) as u32 + 110;
    let jobs: [(&str, (u32, u32)); 2] = [("heatmap", (1500, h)), ("coverage", (900, 700))];
    for (name, size) in jobs {
        for ext in ["png", "svg"] {
            let path = dir.join(format!("{name}.{ext}"));
            let result = match (name, ext) {
                ("heatmap", "png") => heatmap(
                    BitMapBackend::new(&path, size).into_drawing_area(),
                    layers,
                    counts,
                    &heat_title,
                ),
                ("heatmap", _) => heatmap(
                    SVGBackend::new(&path, size).into_drawing_area(),
                    layers,
                    counts,
                    &heat_title,
                ),
                (_, "png") => coverage(
                    BitMapBackend::new(&path, size).into_drawing_area(),
                    counts,
                    &cov_title,
                ),
                _ => coverage(
                    SVGBackend::new(&path, size).into_drawing_area(),
                    counts,
                    &cov_title,
                ),
            };
            result.map_err(|message| PlotError::Draw {
                path: path.clone(),
                message,
            })?;
            written.push(path);
        }
    }
    Ok(written)
}
