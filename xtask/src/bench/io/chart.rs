//! PNG charts of the neighbour's fdatasync latency over time, one panel
//! per arm, with the update window shaded.
//!
//! plotters draws into [`Canvas`], a small in-memory RGB backend whose text
//! is rasterised by ab_glyph from a TrueType file (DejaVu Sans, Debian's
//! fonts-dejavu-core): plotters' own text needs font-kit and the system
//! fontconfig, which a fresh machine may lack. The PNG is encoded by the
//! png crate. If the font is missing the chart is still drawn, without
//! text, and the caller is told.

use ab_glyph::{Font, FontVec, PxScale, ScaleFont};
use anyhow::{Context, Result};
use plotters::prelude::*;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendTextStyle, DrawingBackend, DrawingErrorKind,
};
use std::path::Path;

/// Debian's fonts-dejavu-core.
pub const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
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

/// Draws the panels stacked, sharing the axes' ranges, into `path`.
/// Returns whether text could be drawn (the font was found).
pub fn draw(path: &Path, title: &str, panels: &[Panel]) -> Result<bool> {
    let font = std::fs::read(FONT)
        .ok()
        .and_then(|b| FontVec::try_from_vec(b).ok());
    let height = 60 + PANEL_HEIGHT * panels.len().max(1) as u32;
    let mut rgb = vec![255u8; (WIDTH * height * 3) as usize];
    let canvas = Canvas {
        width: WIDTH,
        height,
        rgb: &mut rgb,
        font: font.as_ref(),
    };
    render(canvas, title, panels).map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    write_png(path, WIDTH, height, &rgb)?;
    Ok(font.is_some())
}

fn render(
    canvas: Canvas<'_, '_>,
    title: &str,
    panels: &[Panel],
) -> Result<(), Box<dyn std::error::Error>> {
    let root = canvas.into_drawing_area();
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

/// An RGB pixel buffer that plotters draws into.
struct Canvas<'b, 'f> {
    width: u32,
    height: u32,
    rgb: &'b mut [u8],
    font: Option<&'f FontVec>,
}

#[derive(Debug)]
struct CanvasError;

impl std::fmt::Display for CanvasError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("canvas error")
    }
}

impl std::error::Error for CanvasError {}

impl Canvas<'_, '_> {
    fn blend(&mut self, (x, y): BackendCoord, rgb: (u8, u8, u8), alpha: f64) {
        if x < 0 || y < 0 || x >= self.width as i32 || y >= self.height as i32 || alpha <= 0.0 {
            return;
        }
        let a = alpha.min(1.0);
        let i = (y as usize * self.width as usize + x as usize) * 3;
        for (k, c) in [rgb.0, rgb.1, rgb.2].into_iter().enumerate() {
            let old = f64::from(self.rgb[i + k]);
            self.rgb[i + k] = (f64::from(c) * a + old * (1.0 - a)).round() as u8;
        }
    }
}

fn write_png(path: &Path, width: u32, height: u32, rgb: &[u8]) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc
        .write_header()
        .with_context(|| format!("writing {}", path.display()))?;
    w.write_image_data(rgb)
        .with_context(|| format!("writing {}", path.display()))?;
    w.finish()
        .with_context(|| format!("writing {}", path.display()))
}

/// A line of glyphs laid out from (0, 0) at the top left: the glyphs, the
/// advance width and the line height.
fn layout(font: &FontVec, px: f32, text: &str) -> (Vec<ab_glyph::Glyph>, f32, f32) {
    let scaled = font.as_scaled(PxScale::from(px));
    let mut x = 0.0;
    let mut prev = None;
    let mut glyphs = Vec::with_capacity(text.len());
    for c in text.chars() {
        let id = scaled.glyph_id(c);
        if let Some(p) = prev {
            x += scaled.kern(p, id);
        }
        glyphs.push(id.with_scale_and_position(px, ab_glyph::point(x, scaled.ascent())));
        x += scaled.h_advance(id);
        prev = Some(id);
    }
    (glyphs, x, scaled.ascent() - scaled.descent())
}

impl DrawingBackend for Canvas<'_, '_> {
    type ErrorType = CanvasError;

    fn get_size(&self) -> (u32, u32) {
        (self.width, self.height)
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<CanvasError>> {
        Ok(())
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<CanvasError>> {
        Ok(())
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        self.blend(point, color.rgb, color.alpha);
        Ok(())
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<CanvasError>> {
        let Some(font) = self.font else {
            return Ok(());
        };
        let color = style.color();
        let (glyphs, w, h) = layout(font, style.size() as f32, text);
        let (w, h) = (w.round() as i32, h.round() as i32);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -w,
            HPos::Center => -w / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -h / 2,
            VPos::Bottom => -h,
        };
        let trans = style.transform();
        for g in glyphs {
            let Some(outline) = font.outline_glyph(g) else {
                continue;
            };
            let bounds = outline.px_bounds();
            let mut pixels = Vec::new();
            outline.draw(|gx, gy, coverage| {
                let x = bounds.min.x as i32 + gx as i32 + dx;
                let y = bounds.min.y as i32 + gy as i32 + dy;
                let (x, y) = trans.transform(x, y);
                pixels.push(((pos.0 + x, pos.1 + y), coverage));
            });
            for (p, coverage) in pixels {
                self.blend(p, color.rgb, color.alpha * f64::from(coverage));
            }
        }
        Ok(())
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<CanvasError>> {
        let px = style.size();
        Ok(match self.font {
            Some(font) => {
                let (_, w, h) = layout(font, px as f32, text);
                (w.ceil() as u32, h.ceil() as u32)
            }
            None => ((px * 0.6 * text.len() as f64) as u32, px as u32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.png");
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
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let reader = decoder.read_info().unwrap();
        assert_eq!(reader.info().width, WIDTH);
        assert_eq!(reader.info().height, 60 + 2 * PANEL_HEIGHT);
    }
}
