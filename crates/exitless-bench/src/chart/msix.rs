//! `msix`: the MSI-X Enable cost of each device in turn, one line per routing strategy, the
//! seed's figures dashed beside them (the growth the seed shows, the flat lines claimed).

use plotters::prelude::*;

use super::{Area, FONT, Keyed, WIDTH, colour, err, header, legend, positive_span};
use crate::format::human_ns;
use crate::model::{RoutingFigures, ScenarioReport};

/// The per-device plotting area: devices keyed along x, time on a log y axis.
type DeviceChart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<Keyed, LogCoord<f64>>>;

/// The chart, or `None` when no variant has per-device figures.
pub(super) fn draw(s: &ScenarioReport, host: &str) -> Result<Option<String>, String> {
    let lines: Vec<(&str, &RoutingFigures)> = s
        .variants
        .iter()
        .filter_map(|v| Some((v.name.as_str(), v.routing.as_ref()?)))
        .filter(|(_, r)| !r.per_device_ms.is_empty())
        .collect();
    let devices = lines.iter().map(|(_, r)| r.per_device_ms.len()).max();
    let values = lines.iter().flat_map(|(_, r)| {
        let seed = r.seed_per_device_ms.iter().flatten();
        r.per_device_ms.iter().chain(seed).copied()
    });
    let (Some(devices), Some((lo, hi))) = (devices, positive_span(values)) else {
        return Ok(None);
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 600)).into_drawing_area();
        let subtitle = "Each device's MSI-X Enable in turn, every vector programmed and unmasked \
                        beforehand (the seed's restore case); solid: this run, one line per \
                        routing strategy; dashed: the seed's published figures for the same \
                        strategy.";
        let title = format!("exitless bench {}: MSI-X Enable cost per device", s.name);
        let area = header(&root, &title, subtitle, host)?;
        let mut chart = axes(&area, devices, lo, hi)?;
        for (i, (name, r)) in lines.iter().enumerate() {
            strategy(&mut chart, colour(i), name, r)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        root.present().map_err(err)?;
    }
    Ok(Some(svg))
}

/// The plotting area and its grid: devices 1 to `devices` along x, a log time axis with room
/// around `lo` to `hi` (in ms) on y.
fn axes<'a, 'b>(
    area: &'a Area<'b>,
    devices: usize,
    lo: f64,
    hi: f64,
) -> Result<DeviceChart<'a, 'b>, String> {
    let x = Keyed {
        range: 0.5..devices as f64 + 0.5,
        keys: (1..=devices).map(|d| d as f64).collect(),
    };
    let mut chart = ChartBuilder::on(area)
        .margin_right(24)
        .margin_bottom(6)
        .x_label_area_size(44)
        .y_label_area_size(76)
        .build_cartesian_2d(x, (lo / 2.0..hi * 8.0).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("device, in the order enabled")
        .y_desc("Enable time per device (log scale)")
        .x_label_formatter(&|d| format!("{d:.0}"))
        .y_label_formatter(&|ms| human_ns(ms * 1e6))
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()
        .map_err(err)?;
    Ok(chart)
}

/// The drawable points of per-device times `ms`: (device number from 1, ms).
fn points(ms: &[f64]) -> Vec<(f64, f64)> {
    ms.iter()
        .enumerate()
        .filter(|(_, ms)| ms.is_finite() && **ms > 0.0)
        .map(|(d, ms)| ((d + 1) as f64, *ms))
        .collect()
}

/// Strategy `name`'s line in colour `c`: this run's solid with a dot per device, the seed's
/// dashed where it published one.
fn strategy<'a, 'b: 'a>(
    chart: &mut DeviceChart<'a, 'b>,
    c: RGBColor,
    name: &str,
    r: &RoutingFigures,
) -> Result<(), String> {
    let ours = points(&r.per_device_ms);
    chart
        .draw_series(LineSeries::new(ours.clone(), c.stroke_width(2)))
        .map_err(err)?
        .label(name.to_string())
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2)));
    chart
        .draw_series(ours.iter().map(|&p| Circle::new(p, 3, c.filled())))
        .map_err(err)?;
    if let Some(seed) = &r.seed_per_device_ms {
        chart
            .draw_series(DashedLineSeries::new(points(seed), 6, 4, c.stroke_width(2)))
            .map_err(err)?
            .label(format!("{name} (seed)"))
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new([(0, 0), (7, 0)], c.stroke_width(2))
                    + PathElement::new([(13, 0), (20, 0)], c.stroke_width(2))
            });
    }
    Ok(())
}
