//! Charts of a [`Report`], drawn with plotters' SVG backend (text stays `<text>`: no font is
//! read or rasterised): per scenario, time per op as grouped bars ([`bars`]); `msix`'s Enable
//! cost per device as lines ([`msix`]); `iommu`'s high-water-mark sweep as a trade-off between
//! frames/s and exposure ([`iommu`]). `exitless bench --svg DIR` writes each to its own file.
//!
//! Every chart names its scenario and the host inside the canvas.

// Pixel arithmetic: sizes and counts a few thousand at most, far inside u32 and i32.
#![allow(clippy::cast_possible_truncation)]

mod bars;
mod iommu;
mod msix;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::model::Report;

/// One chart: the file name it is written to in the `--svg` folder, and its SVG.
#[derive(Debug)]
pub struct Chart {
    /// File name, e.g. `pci.svg`.
    pub file: String,
    /// The SVG document.
    pub svg: String,
}

/// Every chart the report has data for, in scenario order.
pub fn charts(r: &Report) -> Result<Vec<Chart>, String> {
    let mut out = Vec::new();
    for s in &r.scenarios {
        if let Some(svg) = bars::draw(s, &r.host)? {
            out.push(Chart {
                file: format!("{}.svg", s.name),
                svg,
            });
        }
        if let Some(svg) = msix::draw(s, &r.host)? {
            out.push(Chart {
                file: format!("{}-per-device.svg", s.name),
                svg,
            });
        }
        if let Some(svg) = iommu::draw(s, &r.host)? {
            out.push(Chart {
                file: format!("{}-hwm-sweep.svg", s.name),
                svg,
            });
        }
    }
    Ok(out)
}

/// The SVG backend's drawing area.
type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Width of every chart, in pixels.
const WIDTH: u32 = 960;
/// The font every chart uses.
const FONT: &str = "sans-serif";
/// Series colours, in order (colour-blind safe: Okabe and Ito's palette).
const PALETTE: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(80, 80, 80),
];

/// The `i`th series colour.
fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Any plotters error, as the report's error text.
/// A chart's series legend at `at`, on a white box so that it reads over the grid.
fn legend<'a, 'b: 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, CT>,
    at: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font((FONT, 12))
        .draw()
        .map_err(err)
}

fn err(e: impl std::fmt::Display) -> String {
    format!("drawing a chart: {e}")
}

/// Draw the title, a subtitle (wrapped) and the host at the top of `root`, white behind;
/// returns the area below them.
fn header<'a>(
    root: &Area<'a>,
    title: &str,
    subtitle: &str,
    host: &str,
) -> Result<Area<'a>, String> {
    root.fill(&WHITE).map_err(err)?;
    // The naive font's width estimate: about 0.45 em per character.
    let chars = |size: f64| (f64::from(WIDTH - 20) / (size * 0.5)) as usize;
    let mut lines = vec![(title.to_owned(), 20.0, true)];
    lines.extend(
        wrap(subtitle, chars(13.0))
            .into_iter()
            .map(|l| (l, 13.0, false)),
    );
    lines.extend(
        wrap(&format!("host: {host}"), chars(12.0))
            .into_iter()
            .map(|l| (l, 12.0, false)),
    );
    let mut y = 8;
    for (text, size, bold) in &lines {
        let font = (FONT, *size).into_font();
        let font = if *bold {
            font.style(FontStyle::Bold)
        } else {
            font
        };
        root.draw(&Text::new(text.as_str(), (10, y), font.color(&BLACK)))
            .map_err(err)?;
        y += (*size * 1.35) as i32;
    }
    Ok(root.split_vertically(y + 6).1)
}

/// `text` cut at spaces into lines of at most `width` characters (a longer word gets its
/// own line).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// A linear axis whose ticks sit at given values only (a bar's centre, a device's number).
#[derive(Clone)]
struct Keyed {
    range: std::ops::Range<f64>,
    keys: Vec<f64>,
}

impl Ranged for Keyed {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let share = (v - self.range.start) / (self.range.end - self.range.start);
        limit.0 + (f64::from(limit.1 - limit.0) * share).round() as i32
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, _: Hint) -> Vec<f64> {
        self.keys.clone()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

/// Lowest and highest of the positive, finite `values`, or `None` if there are none.
fn positive_span(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .into_iter()
        .filter(|x| x.is_finite() && *x > 0.0)
        .fold(None, |span, x| match span {
            None => Some((x, x)),
            Some((lo, hi)) => Some((f64::min(lo, x), f64::max(hi, x))),
        })
}

#[cfg(test)]
mod tests;
