//! SVG charts of the neighbour's fdatasync latency over time, one panel
//! per arm, with the update window shaded.
//!
//! plotters draws into its `SVGBackend` (no default features: no font-kit,
//! no system fontconfig). Text stays SVG `<text>`, set by whatever views
//! the file, so no font is needed here; plotters only estimates text sizes
//! for the layout.

use anyhow::{Context, Result};
use plotters::prelude::*;
use std::path::Path;

const PANEL_HEIGHT: u32 = 300;
const WIDTH: u32 = 1400;

/// One arm's trial, as drawn.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    /// (seconds since the neighbour started, fdatasync ms).
    pub points: Vec<(f64, f64)>,
    /// The update window (the baseline's compared window), seconds.
    pub window: (f64, f64),
    /// The `sync` after the pull, seconds, if any.
    pub sync: Option<(f64, f64)>,
    /// Horizontal reference lines: (label, ms): the baseline's p99 and max
    /// over a window of the same length.
    pub references: Vec<(String, f64)>,
    pub color: (u8, u8, u8),
}

/// Draws the panels stacked, sharing the axes' ranges, into `path` (SVG).
pub fn draw(path: &Path, title: &str, panels: &[Panel]) -> Result<()> {
    let height = 60 + PANEL_HEIGHT * panels.len().max(1) as u32;
    let mut svg = String::new();
    render(
        SVGBackend::with_string(&mut svg, (WIDTH, height)),
        title,
        panels,
    )
    .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))
}

fn render(
    backend: SVGBackend<'_>,
    title: &str,
    panels: &[Panel],
) -> Result<(), Box<dyn std::error::Error>> {
    let root = backend.into_drawing_area();
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(60);
    head.draw_text(
        title,
        &("sans-serif", 22).into_font().color(&BLACK),
        (20, 18),
    )?;
    let x_max = panels
        .iter()
        .flat_map(|p| {
            p.points
                .iter()
                .map(|q| q.0)
                .chain([p.window.1, p.sync.map_or(0.0, |s| s.1)])
        })
        .fold(1.0f64, f64::max)
        * 1.02;
    let y_max = panels
        .iter()
        .flat_map(|p| p.points.iter().map(|q| q.1))
        .fold(1.0f64, f64::max)
        * 1.5;
    let y_min = panels
        .iter()
        .flat_map(|p| p.points.iter().map(|q| q.1))
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min)
        .min(0.1)
        * 0.8;
    let areas = body.split_evenly((panels.len().max(1), 1));
    for (area, p) in areas.iter().zip(panels) {
        let mut chart = ChartBuilder::on(area)
            .caption(&p.title, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_max, (y_min..y_max).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("seconds since the neighbour started")
            .y_desc("fdatasync ms")
            .light_line_style(WHITE)
            .label_style(("sans-serif", 12))
            .draw()?;
        let shade = |a: f64, b: f64, c: RGBColor| {
            Rectangle::new([(a, y_min), (b, y_max)], c.mix(0.25).filled())
        };
        chart.draw_series([shade(p.window.0, p.window.1, RGBColor(80, 140, 255))])?;
        if let Some((a, b)) = p.sync {
            chart.draw_series([shade(a, b, RGBColor(255, 160, 40))])?;
        }
        let (r, g, b) = p.color;
        chart.draw_series(
            p.points
                .iter()
                .filter(|q| q.1 > 0.0)
                .map(|&q| Circle::new(q, 1, RGBColor(r, g, b).filled())),
        )?;
        for (label, ms) in &p.references {
            chart.draw_series(LineSeries::new(
                [(0.0, *ms), (x_max, *ms)],
                RGBColor(200, 0, 0).stroke_width(1),
            ))?;
            chart.draw_series([Text::new(
                label.clone(),
                (x_max * 0.005, *ms * 1.08),
                ("sans-serif", 12).into_font().color(&RGBColor(200, 0, 0)),
            )])?;
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_an_svg() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.svg");
        let panel = Panel {
            title: "arm".into(),
            points: (0..200)
                .map(|i| (i as f64 * 0.05, 0.5 + (i % 7) as f64))
                .collect(),
            window: (2.0, 6.0),
            sync: Some((6.0, 6.5)),
            references: vec![("baseline p99".into(), 3.0)],
            color: (0, 0, 200),
        };
        draw(&path, "test", &[panel.clone(), panel]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..text.len().min(80)]);
        let size = format!("width=\"{WIDTH}\" height=\"{}\"", 60 + 2 * PANEL_HEIGHT);
        assert!(text.contains(&size), "no {size}");
        assert!(text.contains(">\nbaseline p99\n</text>"));
        assert!(text.trim_end().ends_with("</svg>"));
    }
}
