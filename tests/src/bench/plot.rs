//! Line charts as SVG through `plotters`, its SVG backend alone (no font
//! crate, no system library: the text goes into the SVG as `<text>` and
//! the viewer's fonts draw it). One chart: values against a few x
//! positions on a log₂ axis (sequence or cache lengths), one line per
//! series (solid or dashed, with a marker at each point, broken where a
//! value is missing), the legend to the right, optionally a labelled
//! horizontal reference line (a bandwidth peak, say).

use std::ops::Range;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The mark drawn at each point of a series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    Circle,
    Triangle,
    Square,
}

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    /// `#rrggbb`.
    pub color: &'static str,
    pub dashed: bool,
    pub marker: Marker,
    /// One value per x position of the chart; `None`: no point there.
    pub values: Vec<Option<f64>>,
}

/// What the chart shows besides its series.
#[derive(Clone, Debug)]
pub struct Chart<'a> {
    pub title: &'a str,
    pub subtitle: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// The x positions (placed on a log₂ axis, labelled `4k`, `512`, ...).
    pub x: &'a [usize],
    /// A horizontal line at this value, with its label.
    pub reference: Option<(f64, &'a str)>,
    /// Width and least height in pixels (a long legend makes it taller).
    pub size: (u32, u32),
}

const LEGEND_W: u32 = 220;
const LEGEND_ROW: u32 = 20;

/// `8192` → `8k`, `512` → `512`.
pub fn short(n: usize) -> String {
    if n >= 1024 && n.is_multiple_of(1024) {
        format!("{}k", n / 1024)
    } else {
        n.to_string()
    }
}

fn rgb(hex: &str) -> RGBColor {
    let c = |i: usize| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("00"), 16).unwrap_or(0);
    RGBColor(c(1), c(3), c(5))
}

/// A linear axis over log₂ of the x positions whose ticks are exactly
/// those positions (plotters' `WithKeyPoints` over f64 takes no label
/// formatter).
struct LogTicks {
    range: Range<f64>,
    ticks: Vec<f64>,
}

impl Ranged for LogTicks {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let f = (v - self.range.start) / (self.range.end - self.range.start);
        limit.0 + (f * (limit.1 - limit.0) as f64).round() as i32
    }
    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        self.ticks.clone()
    }
    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

fn err(e: impl std::fmt::Display) -> String {
    format!("plot: {e}")
}

/// The series that have at least one value.
fn shown(series: &[Series]) -> impl Iterator<Item = &Series> {
    series
        .iter()
        .filter(|s| s.values.iter().any(Option::is_some))
}

/// The chart as an SVG document.
pub fn svg(chart: &Chart, series: &[Series]) -> Result<String, String> {
    let n_shown = shown(series).count() as u32;
    let (w, h) = (chart.size.0, chart.size.1.max(90 + LEGEND_ROW * n_shown));
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let centre = Pos::new(HPos::Center, VPos::Top);
        let title = ("sans-serif", 19)
            .into_font()
            .style(FontStyle::Bold)
            .color(&BLACK)
            .pos(centre);
        root.draw(&Text::new(chart.title, (w as i32 / 2, 10), title))
            .map_err(err)?;
        let sub = ("sans-serif", 15)
            .into_font()
            .color(&RGBColor(0x55, 0x55, 0x55))
            .pos(centre);
        root.draw(&Text::new(chart.subtitle, (w as i32 / 2, 32), sub))
            .map_err(err)?;
        let body = root.margin(52, 8, 8, 8);
        let (plot, legend) = body.split_horizontally(w - 16 - LEGEND_W);
        draw_plot(&plot, chart, series)?;
        draw_legend(&legend, series)?;
        root.present().map_err(err)?;
    }
    Ok(buf)
}

/// Runs `$body` with `$mk`, a closure from a position to the marker
/// `$m` centred there (a few pixels wide): each marker kind is its own type.
macro_rules! with_marker {
    ($m:expr, $color:expr, |$mk:ident| $body:expr) => {{
        let fill = $color.filled();
        match $m {
            Marker::Circle => {
                let $mk = |p| EmptyElement::at(p) + Circle::new((0, 0), 3.5, fill);
                $body
            }
            Marker::Triangle => {
                let $mk = |p| EmptyElement::at(p) + TriangleMarker::new((0, 0), 5, fill);
                $body
            }
            Marker::Square => {
                let $mk = |p| EmptyElement::at(p) + Rectangle::new([(-3, -3), (3, 3)], fill);
                $body
            }
        }
    }};
}

fn draw_plot(
    area: &DrawingArea<SVGBackend, Shift>,
    chart: &Chart,
    series: &[Series],
) -> Result<(), String> {
    let xs: Vec<f64> = chart.x.iter().map(|&n| (n.max(1) as f64).log2()).collect();
    let (lo, hi) = match (xs.first(), xs.last()) {
        (Some(&a), Some(&b)) => (a, b),
        _ => (0.0, 1.0),
    };
    let pad = ((hi - lo) * 0.06).max(0.5);
    let ymax_data = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .chain(chart.reference.iter().map(|r| &r.0))
        .fold(0.0f64, |a, &b| a.max(b));
    let ymax = if ymax_data > 0.0 {
        ymax_data * 1.08
    } else {
        1.0
    };
    let mut c = ChartBuilder::on(area)
        .margin(6)
        .x_label_area_size(42)
        .y_label_area_size(58)
        .build_cartesian_2d(
            LogTicks {
                range: (lo - pad)..(hi + pad),
                ticks: xs.clone(),
            },
            0f64..ymax,
        )
        .map_err(err)?;
    let ticks = chart.x.to_vec();
    let label = move |v: &f64| {
        let i = xs
            .iter()
            .enumerate()
            .min_by(|a, b| (a.1 - v).abs().total_cmp(&(b.1 - v).abs()))
            .map_or(0, |(i, _)| i);
        ticks.get(i).map_or(String::new(), |&n| short(n))
    };
    c.configure_mesh()
        .disable_x_mesh()
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .light_line_style(TRANSPARENT)
        .x_label_formatter(&label)
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .y_label_formatter(&|v| {
            if ymax > 20.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        })
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(err)?;
    if let Some((v, text)) = chart.reference {
        let grey = RGBColor(0x99, 0x99, 0x99);
        c.draw_series(DashedLineSeries::new(
            [(lo - pad, v), (hi + pad, v)],
            3,
            3,
            grey.stroke_width(1),
        ))
        .map_err(err)?;
        let style = ("sans-serif", 14)
            .into_font()
            .color(&grey)
            .pos(Pos::new(HPos::Left, VPos::Bottom));
        c.draw_series(std::iter::once(Text::new(
            text.to_string(),
            (lo - pad * 0.9, v),
            style,
        )))
        .map_err(err)?;
    }
    let xs: Vec<f64> = chart.x.iter().map(|&n| (n.max(1) as f64).log2()).collect();
    for s in shown(series) {
        let color = rgb(s.color);
        let line = color.stroke_width(2);
        // Runs of consecutive values: a missing value breaks the line.
        let mut run: Vec<(f64, f64)> = Vec::new();
        let pts = s
            .values
            .iter()
            .zip(&xs)
            .map(|(v, &x)| v.map(|v| (x, v)))
            .chain(std::iter::once(None));
        for p in pts {
            match p {
                Some(p) => run.push(p),
                None if run.len() > 1 => {
                    let run = std::mem::take(&mut run);
                    if s.dashed {
                        c.draw_series(DashedLineSeries::new(run, 7, 4, line))
                            .map_err(err)?;
                    } else {
                        c.draw_series(LineSeries::new(run, line)).map_err(err)?;
                    }
                }
                None => run.clear(),
            }
        }
        let pts: Vec<(f64, f64)> = s
            .values
            .iter()
            .zip(&xs)
            .filter_map(|(v, &x)| v.map(|v| (x, v)))
            .collect();
        with_marker!(s.marker, color, |mk| c
            .draw_series(pts.iter().map(|&p| mk(p)))
            .map_err(err))?;
    }
    Ok(())
}

fn draw_legend(area: &DrawingArea<SVGBackend, Shift>, series: &[Series]) -> Result<(), String> {
    let text = ("sans-serif", 15)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (i, s) in shown(series).enumerate() {
        let y = 18 + (LEGEND_ROW * i as u32) as i32;
        let color = rgb(s.color);
        let line = color.stroke_width(2);
        if s.dashed {
            for x in [4, 14, 24] {
                area.draw(&PathElement::new([(x, y), (x + 7, y)], line))
                    .map_err(err)?;
            }
        } else {
            area.draw(&PathElement::new([(4, y), (32, y)], line))
                .map_err(err)?;
        }
        with_marker!(s.marker, color, |mk| area.draw(&mk((18, y))).map_err(err))?;
        area.draw(&Text::new(s.label.clone(), (40, y), text.clone()))
            .map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_break_at_missing_values_and_empty_series_stay_out() {
        let chart = Chart {
            title: "t",
            subtitle: "sub",
            x_label: "N",
            y_label: "TFLOP/s",
            x: &[512, 1024, 2048],
            reference: Some((400.0, "peak")),
            size: (760, 450),
        };
        let s = |label: &str, color, dashed, values| Series {
            label: label.into(),
            color,
            dashed,
            marker: Marker::Circle,
            values,
        };
        let svg = svg(
            &chart,
            &[
                s(
                    "A (ours)",
                    "#d62728",
                    false,
                    vec![Some(100.0), None, Some(300.0)],
                ),
                s("B (ours)", "#2ca02c", false, vec![None, None, None]),
                s("C", "#1f77b4", true, vec![Some(1.0), Some(2.0), Some(3.0)]),
            ],
        )
        .unwrap();
        let _ = std::fs::write(std::env::temp_dir().join("fa-bench-plot-test.svg"), &svg);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("A (ours)") && svg.contains("\nC\n") && !svg.contains("B (ours)"));
        let lines = |color: &str| {
            svg.lines()
                .filter(|l| {
                    l.contains("<polyline") && l.contains(color) && l.contains("stroke-width=\"2\"")
                })
                .count()
        };
        // A has no two consecutive points: only its legend sample is a line; C is dashed.
        assert_eq!(lines("#D62728"), 1);
        assert!(lines("#1F77B4") > 6);
        assert_eq!(
            svg.matches("<circle").count(),
            2 + 3 + 2,
            "a marker per point and per legend entry"
        );
        assert!(
            svg.contains("\n512\n") && svg.contains("\n2k\n") && svg.contains("\npeak\n"),
            "tick and reference labels"
        );
    }

    #[test]
    fn short_labels() {
        assert_eq!(
            (short(512), short(4096), short(131072), short(1000)),
            ("512".into(), "4k".into(), "128k".into(), "1000".into())
        );
    }
}
