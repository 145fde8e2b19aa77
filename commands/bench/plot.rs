//! PNG bar charts for the benchmark reports: shapes drawn with plotters'
//! bitmap backend, text with a bitmap font compiled into the binary
//! (embedded-graphics), so nothing depends on the fonts a machine has.

use std::path::Path;

use anyhow::{anyhow, Result};
use embedded_graphics::mono_font::ascii::{FONT_6X10, FONT_9X15};
use embedded_graphics::mono_font::{MonoFont, MonoTextStyle};
use embedded_graphics::pixelcolor::{Rgb888, RgbColor};
use embedded_graphics::prelude::{DrawTarget, OriginDimensions, Pixel, Point, Size};
use embedded_graphics::text::{Alignment, Text};
use embedded_graphics::Drawable;
use plotters::coord::Shift;
use plotters::prelude::*;

/// One group of bars: a cell's value with the prompt cache cold and warm.
pub struct Bar {
    pub label: String,
    pub cold: Option<f64>,
    pub warm: Option<f64>,
}

struct Canvas<'a, 'b>(&'a DrawingArea<BitMapBackend<'b>, Shift>);

impl OriginDimensions for Canvas<'_, '_> {
    fn size(&self) -> Size {
        let (w, h) = self.0.dim_in_pixel();
        Size::new(w, h)
    }
}

impl DrawTarget for Canvas<'_, '_> {
    type Color = Rgb888;
    type Error = std::convert::Infallible;

    fn draw_iter<I: IntoIterator<Item = Pixel<Rgb888>>>(
        &mut self,
        pixels: I,
    ) -> Result<(), Self::Error> {
        for Pixel(p, c) in pixels {
            let _ = self
                .0
                .draw_pixel((p.x, p.y), &RGBColor(c.r(), c.g(), c.b()));
        }
        Ok(())
    }
}

fn text(
    area: &DrawingArea<BitMapBackend, Shift>,
    s: &str,
    at: (i32, i32),
    font: &MonoFont,
    align: Alignment,
) {
    let style = MonoTextStyle::new(font, Rgb888::BLACK);
    let _ = Text::with_alignment(s, Point::new(at.0, at.1), style, align).draw(&mut Canvas(area));
}

const COLD: RGBColor = RGBColor(70, 110, 190);
const WARM: RGBColor = RGBColor(235, 140, 50);

/// Grouped bars of aggregate tok/s per cell, cold and warm; a missing value
/// (a failed cell) is marked "failed".
pub fn feature_matrix(path: &Path, bars: &[Bar]) -> Result<()> {
    let (w, h) = ((140 * bars.len().max(1) as u32 + 120).max(640), 480u32);
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("drawing {}: {e:?}", path.display());
    let area = BitMapBackend::new(path, (w, h)).into_drawing_area();
    area.fill(&WHITE).map_err(err)?;
    let (left, top, bottom) = (70i32, 50i32, h as i32 - 60);
    let right = w as i32 - 20;
    let max = bars
        .iter()
        .flat_map(|b| [b.cold, b.warm])
        .flatten()
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.15;
    let y = |v: f64| bottom - ((v / max) * (bottom - top) as f64) as i32;
    // Axes, grid and ticks.
    for i in 0..=5 {
        let v = max * i as f64 / 5.0;
        area.draw(&PathElement::new(
            vec![(left, y(v)), (right, y(v))],
            RGBColor(225, 225, 225),
        ))
        .map_err(err)?;
        text(
            &area,
            &format!("{v:.1}"),
            (left - 6, y(v) + 4),
            &FONT_6X10,
            Alignment::Right,
        );
    }
    area.draw(&PathElement::new(
        vec![(left, top), (left, bottom), (right, bottom)],
        BLACK,
    ))
    .map_err(err)?;
    text(
        &area,
        "aggregate tok/s per cell (prompt cache cold / warm)",
        (w as i32 / 2, 25),
        &FONT_9X15,
        Alignment::Center,
    );
    let group = (right - left) / bars.len().max(1) as i32;
    for (i, b) in bars.iter().enumerate() {
        let x0 = left + i as i32 * group + group / 6;
        let bw = group / 3;
        for (j, (v, color)) in [(b.cold, COLD), (b.warm, WARM)].into_iter().enumerate() {
            let x = x0 + j as i32 * bw;
            match v {
                Some(v) => {
                    area.draw(&Rectangle::new(
                        [(x, y(v)), (x + bw - 2, bottom)],
                        color.filled(),
                    ))
                    .map_err(err)?;
                    text(
                        &area,
                        &format!("{v:.1}"),
                        (x + bw / 2, y(v) - 4),
                        &FONT_6X10,
                        Alignment::Center,
                    );
                }
                None if j == 0 => {
                    text(
                        &area,
                        "failed",
                        (x + bw, bottom - 8),
                        &FONT_6X10,
                        Alignment::Center,
                    );
                }
                None => {}
            }
        }
        text(
            &area,
            &b.label,
            (x0 + bw, bottom + 16),
            &FONT_6X10,
            Alignment::Center,
        );
    }
    // Legend.
    for (j, (name, color)) in [("cold", COLD), ("warm", WARM)].into_iter().enumerate() {
        let x = left + 10 + j as i32 * 90;
        let yl = h as i32 - 25;
        area.draw(&Rectangle::new(
            [(x, yl - 8), (x + 14, yl + 2)],
            color.filled(),
        ))
        .map_err(err)?;
        text(&area, name, (x + 20, yl + 1), &FONT_6X10, Alignment::Left);
    }
    area.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_png_with_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.png");
        let bars = vec![
            Bar {
                label: "serial".into(),
                cold: Some(5.0),
                warm: Some(6.0),
            },
            Bar {
                label: "batch4".into(),
                cold: None,
                warm: None,
            },
        ];
        feature_matrix(&path, &bars).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 2000, "{} bytes", bytes.len());
    }
}
