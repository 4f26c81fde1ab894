//! One scenario's time per op: a horizontal bar per variant on a log axis, its 95% interval as
//! whiskers where it has one, and the peer VMM's bar beside it where the peer ran.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{Area, FONT, Keyed, WIDTH, colour, err, header, legend, positive_span};
use crate::format::human_ns;
use crate::model::{PeerFigure, ScenarioReport, Variant};

/// Height of one variant's group of bars, in pixels.
const GROUP: u32 = 34;
/// Blank groups below the last, where the legend goes.
const LEGEND_ROWS: f64 = 1.6;

/// The bar chart's plotting area: time on a log x axis, a keyed row per variant on y.
type BarChart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<LogCoord<f64>, Keyed>>;

/// One bar: its lower and upper edge on the y axis, and its length in ns.
type Bar = (f64, f64, f64);

/// The chart, or `None` when no variant has a time to draw.
pub(super) fn draw(s: &ScenarioReport, host: &str) -> Result<Option<String>, String> {
    let variants: Vec<&Variant> = s
        .variants
        .iter()
        .filter(|v| v.ns_per_op.is_finite() && v.ns_per_op > 0.0)
        .collect();
    let values = variants.iter().flat_map(|v| {
        let ci = v.interval().unwrap_or([v.ns_per_op; 2]);
        let peer = v.peer.as_ref().map_or(v.ns_per_op, |p| p.ns_per_op);
        [v.ns_per_op, ci[0], ci[1], peer]
    });
    let Some((lo, hi)) = positive_span(values) else {
        return Ok(None);
    };
    let peer = variants.iter().find_map(|v| v.peer.as_ref());
    let height = 240 + GROUP * variants.len() as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        let title = format!("exitless bench {}: time per operation", s.name);
        let area = header(&root, &title, &s.title, host)?;
        let mut chart = axes(&area, &variants, lo, hi)?;
        mesh(&mut chart, &variants)?;
        let base = lo / 2.0;
        let own = own_bars(&mut chart, &variants, peer.is_some(), base)?;
        whiskers(&mut chart, &variants, &own)?;
        if let Some(p) = peer {
            peer_bars(&mut chart, &variants, p, base)?;
        }
        own_figures(&mut chart, &variants, &own)?;
        legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        root.present().map_err(err)?;
    }
    Ok(Some(svg))
}

/// Centre of variant `i`'s group among `n`: `n - 1 - i + 0.5`, the first at the top.
fn centre(n: usize, i: usize) -> f64 {
    (n - 1 - i) as f64 + 0.5
}

/// Variant `i`'s bar of length `ns`: its whole group, or the upper (own) or lower (peer) half
/// when `paired` with the peer's.
fn bar(n: usize, paired: bool, i: usize, upper: bool, ns: f64) -> Bar {
    let c = centre(n, i);
    let half = if paired { 0.4 } else { 0.3 };
    let (y0, y1) = match (paired, upper) {
        (false, _) => (c - half, c + half),
        (true, true) => (c + 0.02, c + half),
        (true, false) => (c - half, c - 0.02),
    };
    (y0, y1, ns)
}

/// The plotting area: a log time axis from `lo` to `hi` with room right of the longest bar for
/// its figure, a row per variant and blank rows below them for the legend.
fn axes<'a, 'b>(
    area: &'a Area<'b>,
    variants: &[&Variant],
    lo: f64,
    hi: f64,
) -> Result<BarChart<'a, 'b>, String> {
    let n = variants.len();
    let longest = variants.iter().map(|v| v.name.len()).max().unwrap_or(8);
    let keys: Vec<f64> = (0..n).map(|i| centre(n, i)).collect();
    ChartBuilder::on(area)
        .margin_right(34)
        .margin_bottom(6)
        .x_label_area_size(44)
        .y_label_area_size((longest * 7 + 16) as u32)
        .build_cartesian_2d(
            (lo / 2.0..hi * 4.0).log_scale(),
            Keyed {
                range: -LEGEND_ROWS..n as f64,
                keys,
            },
        )
        .map_err(err)
}

/// The grid and tick labels: times along x, each row named by its variant.
fn mesh(chart: &mut BarChart, variants: &[&Variant]) -> Result<(), String> {
    let n = variants.len();
    let name_at = |y: &f64| {
        let i = n.checked_sub(1 + y.floor().max(0.0) as usize);
        i.and_then(|i| variants.get(i))
            .map_or(String::new(), |v| v.name.clone())
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(if variants.iter().any(|v| v.interval().is_some()) {
            "time per operation (log scale; whiskers: 95% interval)"
        } else {
            "time per operation (log scale)"
        })
        .x_labels(16)
        .x_label_formatter(&|x| human_ns(*x))
        .y_label_formatter(&name_at)
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()
        .map_err(err)
}

/// Exitless's bar per variant from `base`, `paired` with the peer's; returned for the
/// whiskers and figures that go on them.
fn own_bars(
    chart: &mut BarChart,
    variants: &[&Variant],
    paired: bool,
    base: f64,
) -> Result<Vec<Bar>, String> {
    let own = colour(0);
    let n = variants.len();
    let bars: Vec<Bar> = (0..n)
        .map(|i| bar(n, paired, i, true, variants[i].ns_per_op))
        .collect();
    chart
        .draw_series(
            bars.iter()
                .map(|&(y0, y1, ns)| Rectangle::new([(base, y0), (ns, y1)], own.filled())),
        )
        .map_err(err)?
        .label("exitless")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], own.filled()));
    Ok(bars)
}

/// The 95% interval across each of the `own` bars whose variant has one.
fn whiskers(chart: &mut BarChart, variants: &[&Variant], own: &[Bar]) -> Result<(), String> {
    chart
        .draw_series(variants.iter().enumerate().filter_map(|(i, v)| {
            let [lo, hi] = v.interval()?;
            let (y0, y1, ns) = own[i];
            Some(ErrorBar::new_horizontal(
                (y0 + y1) / 2.0,
                lo,
                ns,
                hi,
                BLACK.stroke_width(1),
                8,
            ))
        }))
        .map_err(err)?;
    Ok(())
}

/// The peer VMM `p`'s bar from `base` below exitless's, where it ran, each with its figure.
fn peer_bars(
    chart: &mut BarChart,
    variants: &[&Variant],
    p: &PeerFigure,
    base: f64,
) -> Result<(), String> {
    let other = colour(1);
    let n = variants.len();
    let bars: Vec<Bar> = variants
        .iter()
        .enumerate()
        .filter_map(|(i, v)| Some(bar(n, true, i, false, v.peer.as_ref()?.ns_per_op)))
        .collect();
    chart
        .draw_series(
            bars.iter()
                .map(|&(y0, y1, ns)| Rectangle::new([(base, y0), (ns, y1)], other.filled())),
        )
        .map_err(err)?
        .label(format!("{} ({})", p.name, p.version))
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], other.filled()));
    chart
        .draw_series(
            bars.iter()
                .map(|&(y0, y1, ns)| figure(ns, (y0 + y1) / 2.0, ns)),
        )
        .map_err(err)?;
    Ok(())
}

/// Each `own` bar's figure, right of its whisker where it has one.
fn own_figures(chart: &mut BarChart, variants: &[&Variant], own: &[Bar]) -> Result<(), String> {
    chart
        .draw_series(variants.iter().zip(own).map(|(v, &(y0, y1, ns))| {
            let end = v.interval().map_or(ns, |ci| ci[1].max(ns));
            figure(end, (y0 + y1) / 2.0, ns)
        }))
        .map_err(err)?;
    Ok(())
}

/// `ns` written just right of `x` (a few pixels on the log axis), centred on `y`.
fn figure(x: f64, y: f64, ns: f64) -> Text<'static, (f64, f64), String> {
    let style = TextStyle::from((FONT, 11).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    Text::new(human_ns(ns), (x * 1.06, y), style)
}
