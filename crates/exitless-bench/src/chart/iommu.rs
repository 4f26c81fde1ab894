//! `iommu`: the high-water-mark sweep of `deferred-array` as a trade-off, frames/s against
//! how long an unmapped page stays reachable (mean and p99 exposure), one point per mark, the
//! seed's default marked; `none`'s frames/s as the ceiling, `strict` as the other corner.

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{Area, FONT, WIDTH, colour, err, header, legend, positive_span};
use crate::iommu::DEFAULT_HWM;
use crate::model::{IommuFigures, ScenarioReport};

/// The sweep's variants: `deferred-array` (at the default mark) and `deferred-array-hwmN`.
const SWEPT: &str = "deferred-array";

/// One point of the sweep: the mark and its figures.
type Mark<'a> = (u64, &'a IommuFigures);

/// The sweep's points by mark, or none.
fn sweep(s: &ScenarioReport) -> Vec<Mark<'_>> {
    let mut marks: Vec<Mark> = s
        .variants
        .iter()
        .filter_map(|v| {
            let mark = match v.name.strip_prefix(SWEPT)? {
                "" => DEFAULT_HWM,
                rest => rest.strip_prefix("-hwm")?.parse().ok()?,
            };
            Some((mark, v.iommu.as_ref()?))
        })
        .collect();
    marks.sort_by_key(|&(mark, _)| mark);
    marks
}

/// The sweep's plotting area: exposure on a log x axis, frames/s on a linear y axis.
type SweepChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<LogCoord<f64>, RangedCoordf64>>;

/// The chart, or `None` when the scenario has no sweep with exposures to draw.
pub(super) fn draw(s: &ScenarioReport, host: &str) -> Result<Option<String>, String> {
    let marks = sweep(s);
    let (none, strict) = (named(s, "none"), named(s, "strict"));
    let mut refs = Vec::new();
    refs.extend(strict.map(|f| ("strict", f)));
    let Some(((x_lo, x_hi), y_span)) = spans(&marks, &refs, none) else {
        return Ok(None);
    };
    if marks.len() < 2 {
        return Ok(None);
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 620)).into_drawing_area();
        let subtitle = "deferred-array's high-water mark swept (label: pages pending before a \
                        flush): frames/s of the small-frame stream against the exposure, per \
                        unmapped page the time from its unmap to the completed invalidation \
                        (circles: mean; triangles: p99, the upper end of its power-of-two bucket). Up \
                        and left is better.";
        let title = format!("exitless bench {}: throughput against exposure", s.name);
        let area = header(&root, &title, subtitle, host)?;
        let x_range = (x_lo / 2.0, x_hi * 3.0);
        let mut chart = axes(&area, x_range, y_span)?;
        means(&mut chart, &marks)?;
        p99s(&mut chart, &marks)?;
        mark_labels(&mut chart, &marks)?;
        default_rings(&mut chart, &marks)?;
        references(&mut chart, &refs)?;
        if let Some(none) = none {
            ceiling(&mut chart, none, x_range)?;
        }
        legend(&mut chart, SeriesLabelPosition::MiddleLeft)?;
        root.present().map_err(err)?;
    }
    Ok(Some(svg))
}

/// The figures of `s`'s variant `name`, if it has them.
fn named<'s>(s: &'s ScenarioReport, name: &str) -> Option<&'s IommuFigures> {
    s.variants
        .iter()
        .find(|v| v.name == name)
        .and_then(|v| v.iommu.as_ref())
}

/// The positive spans of the exposures (of the marks and the references `refs`) and of the
/// frames/s (theirs and `none`'s), or `None` where either has no positive figure.
fn spans(
    marks: &[Mark],
    refs: &[(&str, &IommuFigures)],
    none: Option<&IommuFigures>,
) -> Option<((f64, f64), (f64, f64))> {
    let exposures = marks
        .iter()
        .chain(refs.iter().map(|(_, f)| (0, *f)).collect::<Vec<_>>().iter())
        .flat_map(|(_, f)| [f.exposure_mean_us, f.exposure_p99_us])
        .collect::<Vec<_>>();
    let rates = marks
        .iter()
        .map(|(_, f)| f.packets_per_s)
        .chain(refs.iter().map(|(_, f)| f.packets_per_s))
        .chain(none.map(|f| f.packets_per_s));
    Some((positive_span(exposures)?, positive_span(rates)?))
}

/// The plotting area and its grid: exposure from `x.0` to `x.1` on a log x axis, and frames/s
/// over `y` with a tenth (and one frame) to spare at either end.
fn axes<'a, 'b>(
    area: &'a Area<'b>,
    x: (f64, f64),
    (y_lo, y_hi): (f64, f64),
) -> Result<SweepChart<'a, 'b>, String> {
    let span = y_hi - y_lo;
    let mut chart = ChartBuilder::on(area)
        .margin_right(30)
        .margin_bottom(6)
        .x_label_area_size(44)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x.0..x.1).log_scale(),
            (y_lo - span * 0.1 - 1.0)..(y_hi + span * 0.1 + 1.0),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("exposure per unmapped page, us (log scale)")
        .y_desc("streamed frames/s")
        .x_label_formatter(&|us| format!("{us}"))
        .y_label_formatter(&|fps| format!("{fps:.0}"))
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()
        .map_err(err)?;
    Ok(chart)
}

/// Where `f` plots: its mean (or `p99`) exposure and its frames/s, if that exposure is positive.
fn at(f: &IommuFigures, p99: bool) -> Option<(f64, f64)> {
    let x = if p99 {
        f.exposure_p99_us
    } else {
        f.exposure_mean_us
    };
    (x.is_finite() && x > 0.0).then_some((x, f.packets_per_s))
}

/// The sweep at its mean exposures: a line through a circle per mark.
fn means(chart: &mut SweepChart, marks: &[Mark]) -> Result<(), String> {
    let c = colour(0);
    let mean: Vec<_> = marks.iter().filter_map(|(_, f)| at(f, false)).collect();
    chart
        .draw_series(LineSeries::new(mean.clone(), c.stroke_width(1)))
        .map_err(err)?;
    chart
        .draw_series(mean.iter().map(|&p| Circle::new(p, 5, c.filled())))
        .map_err(err)?
        .label("deferred-array, mean exposure")
        .legend(move |(x, y)| Circle::new((x + 8, y), 5, c.filled()));
    Ok(())
}

/// The sweep at its p99 exposures: a triangle per mark, joined to its mean at its frames/s.
fn p99s(chart: &mut SweepChart, marks: &[Mark]) -> Result<(), String> {
    let c = colour(1);
    let p99: Vec<_> = marks.iter().filter_map(|(_, f)| at(f, true)).collect();
    let spans = marks
        .iter()
        .filter_map(|(_, f)| Some([at(f, false)?, at(f, true)?]));
    chart
        .draw_series(spans.map(|span| PathElement::new(span, c.mix(0.5).stroke_width(1))))
        .map_err(err)?;
    chart
        .draw_series(p99.iter().map(|&p| TriangleMarker::new(p, 6, c.filled())))
        .map_err(err)?
        .label("deferred-array, p99 exposure")
        .legend(move |(x, y)| TriangleMarker::new((x + 8, y), 6, c.filled()));
    Ok(())
}

/// Each mark's label right of its mean, the seed's default in bold and named so.
fn mark_labels(chart: &mut SweepChart, marks: &[Mark]) -> Result<(), String> {
    let label = |text: String, (x, y): (f64, f64), bold: bool| {
        let font = (FONT, 11).into_font();
        let font = if bold {
            font.style(FontStyle::Bold)
        } else {
            font
        };
        let style = TextStyle::from(font).pos(Pos::new(HPos::Left, VPos::Bottom));
        Text::new(text, (x * 1.08, y), style)
    };
    chart
        .draw_series(marks.iter().filter_map(|&(mark, f)| {
            let text = if mark == DEFAULT_HWM {
                format!("hwm {mark} (seed's default)")
            } else {
                format!("hwm {mark}")
            };
            Some(label(text, at(f, false)?, mark == DEFAULT_HWM))
        }))
        .map_err(err)?;
    Ok(())
}

/// The default mark, ringed at both exposures.
fn default_rings(chart: &mut SweepChart, marks: &[Mark]) -> Result<(), String> {
    let default = marks.iter().find(|(mark, _)| *mark == DEFAULT_HWM);
    let rings = default
        .into_iter()
        .flat_map(|(_, f)| [at(f, false), at(f, true)]);
    chart
        .draw_series(
            rings
                .flatten()
                .map(|p| Circle::new(p, 10, BLACK.stroke_width(2))),
        )
        .map_err(err)?;
    Ok(())
}

/// Each reference variant (`strict`) as a named cross at its mean exposure.
fn references(chart: &mut SweepChart, refs: &[(&str, &IommuFigures)]) -> Result<(), String> {
    for (name, f) in refs {
        let Some(p) = at(f, false) else { continue };
        let c = colour(2);
        chart
            .draw_series([Cross::new(p, 6, c.stroke_width(2))])
            .map_err(err)?
            .label(format!("{name} (mean exposure)"))
            .legend(move |(x, y)| Cross::new((x + 8, y), 6, c.stroke_width(2)));
        // Below its cross: the sweep's labels sit above theirs.
        let style = TextStyle::from((FONT, 11).into_font()).pos(Pos::new(HPos::Left, VPos::Top));
        let below = Text::new(name.to_string(), (p.0 * 1.08, p.1), style);
        chart.draw_series([below]).map_err(err)?;
    }
    Ok(())
}

/// `none`'s frames/s, without an IOMMU, as a dashed ceiling across the whole `x` range.
fn ceiling(chart: &mut SweepChart, none: &IommuFigures, x: (f64, f64)) -> Result<(), String> {
    let c = colour(6);
    let y = none.packets_per_s;
    chart
        .draw_series(DashedLineSeries::new(
            [(x.0, y), (x.1, y)],
            8,
            6,
            c.stroke_width(1),
        ))
        .map_err(err)?
        .label("none: no IOMMU (frames/s)")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(1)));
    Ok(())
}
