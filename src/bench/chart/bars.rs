//! One scenario's time per op: a horizontal bar per variant on a log axis, its 95% interval as
//! whiskers where it has one, and the peer VMM's bar beside it where the peer ran.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{FONT, Keyed, WIDTH, colour, err, header, positive_span};
use crate::bench::format::human_ns;
use crate::bench::model::{ScenarioReport, Variant};

/// Height of one variant's group of bars, in pixels.
const GROUP: u32 = 34;
/// Blank groups below the last, where the legend goes.
const LEGEND_ROWS: f64 = 1.6;

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
    let n = variants.len();
    let peer = variants.iter().find_map(|v| v.peer.as_ref());
    let height = 240 + GROUP * n as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        let title = format!("exitless bench {}: time per operation", s.name);
        let area = header(&root, &title, &s.title, host)?;
        let longest = variants.iter().map(|v| v.name.len()).max().unwrap_or(8);
        // Room on the right of the longest bar for its figure.
        let x_range = (lo / 2.0..hi * 4.0).log_scale();
        // A variant's group is centred on `n - 1 - i + 0.5`, the first at the top.
        let centre = |i: usize| (n - 1 - i) as f64 + 0.5;
        let keys: Vec<f64> = (0..n).map(centre).collect();
        let mut chart = ChartBuilder::on(&area)
            .margin_right(34)
            .margin_bottom(6)
            .x_label_area_size(44)
            .y_label_area_size((longest * 7 + 16) as u32)
            .build_cartesian_2d(
                x_range,
                Keyed {
                    range: -LEGEND_ROWS..n as f64,
                    keys,
                },
            )
            .map_err(err)?;
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
            .map_err(err)?;
        let base = lo / 2.0;
        let (own, other) = (colour(0), colour(1));
        let half = if peer.is_some() { 0.4 } else { 0.3 };
        let bar = |i: usize, upper: bool, ns: f64| {
            let c = centre(i);
            let (y0, y1) = match (peer.is_some(), upper) {
                (false, _) => (c - half, c + half),
                (true, true) => (c + 0.02, c + half),
                (true, false) => (c - half, c - 0.02),
            };
            (y0, y1, ns)
        };
        let own_bars: Vec<_> = (0..n)
            .map(|i| bar(i, true, variants[i].ns_per_op))
            .collect();
        chart
            .draw_series(
                own_bars
                    .iter()
                    .map(|&(y0, y1, ns)| Rectangle::new([(base, y0), (ns, y1)], own.filled())),
            )
            .map_err(err)?
            .label("exitless")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], own.filled()));
        chart
            .draw_series(variants.iter().enumerate().filter_map(|(i, v)| {
                let [lo, hi] = v.interval()?;
                let (y0, y1, ns) = own_bars[i];
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
        if let Some(p) = peer {
            let peer_bars: Vec<_> = variants
                .iter()
                .enumerate()
                .filter_map(|(i, v)| Some(bar(i, false, v.peer.as_ref()?.ns_per_op)))
                .collect();
            chart
                .draw_series(
                    peer_bars.iter().map(|&(y0, y1, ns)| {
                        Rectangle::new([(base, y0), (ns, y1)], other.filled())
                    }),
                )
                .map_err(err)?
                .label(format!("{} ({})", p.name, p.version))
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], other.filled())
                });
            chart
                .draw_series(
                    peer_bars
                        .iter()
                        .map(|&(y0, y1, ns)| figure(ns, (y0 + y1) / 2.0, ns)),
                )
                .map_err(err)?;
        }
        chart
            .draw_series(variants.iter().zip(&own_bars).map(|(v, &(y0, y1, ns))| {
                let end = v.interval().map_or(ns, |ci| ci[1].max(ns));
                figure(end, (y0 + y1) / 2.0, ns)
            }))
            .map_err(err)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font((FONT, 12))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(Some(svg))
}

/// `ns` written just right of `x` (a few pixels on the log axis), centred on `y`.
fn figure(x: f64, y: f64, ns: f64) -> Text<'static, (f64, f64), String> {
    let style = TextStyle::from((FONT, 11).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    Text::new(human_ns(ns), (x * 1.06, y), style)
}
