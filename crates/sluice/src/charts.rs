//! Charts as SVG, drawn with plotters, for the simulator's report (the dashboard draws its own in the browser, with
//! uPlot). A line chart is a title, an x axis in seconds, and named series of (second, value) points, its legend in a
//! band under the axes; the SVG names each series in its legend (`<text>` elements), which is what the browser tests
//! read. [`bar_chart`] draws one value per name (a candidate's worst window, its fairness), each bar in the colour its
//! candidate has in the line charts.
//!
//! A colour has one meaning in every chart of a report ([`Pen`]): the offered load is a grey area, each candidate
//! has a colour (and, on its lines, a dash and a width) of its own, and what was denied is a dotted black line. Every
//! text is at least 11 px (plotters writes a font of size `n` as `n / 1.24` px: [`LABEL`] is 14).

use plotters::coord::Shift;
use plotters::coord::ranged1d::SegmentedCoord;
use plotters::coord::types::{RangedCoordf64, RangedCoordu32};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// How a series is drawn; each has one meaning across a report's charts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pen {
    /// The load offered: a grey area behind every line, so that no line hides it.
    Offered,
    /// What candidate `i` admitted: its colour, dash and width, the same in every chart (and its bars' colour).
    Candidate(usize),
    /// What was denied: a dotted black line.
    Denied,
}

/// One named series of points, and how it is drawn.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub pen: Pen,
}

/// The candidates' colours, in order (no grey and no black: those are the offered load's and the denials').
pub const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// The candidates' dashes (SVG `stroke-dasharray`, empty: solid), in order: lines that coincide at a limit stay
/// told apart.
const DASHES: [&str; 4] = ["", "12 4", "4 4", "14 4 3 4"];

/// The offered load's area and outline, and the denials' line.
pub const OFFERED_FILL: RGBColor = RGBColor(218, 218, 218);
const OFFERED_LINE: RGBColor = RGBColor(150, 150, 150);
pub const DENIED: RGBColor = RGBColor(0, 0, 0);
const DENIED_DASH: &str = "2 3";

/// The size of every label, legend and value (11.3 px as written), and of titles (14.5 px).
pub const LABEL: u32 = 14;
const TITLE: u32 = 18;

impl Pen {
    /// The line's colour, width and dash.
    fn line(self) -> (RGBColor, u32, &'static str) {
        match self {
            Pen::Offered => (OFFERED_LINE, 1, ""),
            // Drawn in order, the first ones underneath: wider, so that a line on top leaves them visible.
            Pen::Candidate(i) => (
                COLOURS[i % COLOURS.len()],
                [4, 3].get(i).copied().unwrap_or(2),
                DASHES[i % DASHES.len()],
            ),
            Pen::Denied => (DENIED, 2, DENIED_DASH),
        }
    }
}

/// A colour as SVG writes it: `#1F77B4`.
pub fn hex(colour: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", colour.0, colour.1, colour.2)
}

/// A line chart of `series` as an SVG document, `width` by `height` pixels; `x_label` and `y_label` name the axes. Its
/// legend has a band of its own under the axes (never over the data), tick labels carry no needless decimals (`20`,
/// not `20.0`), and there is room on the right for the last x label. Areas are drawn first, then lines in order; each
/// series as its [`Pen`] says (a chart should not hold two series of one pen).
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series], (width, height): (u32, u32)) -> String {
    let mut svg = String::new();
    match draw_line(&mut svg, title, x_label, y_label, series, (width, height)) {
        Ok(()) => dashed(svg, series),
        Err(e) => failed(title, &e, (width, height)),
    }
}

/// Gives each dashed pen's lines (its series and its legend swatch) their dash: plotters draws no dash on a path, and
/// a pen's colour and width are its own within a chart, so they find its lines.
fn dashed(mut svg: String, series: &[Series]) -> String {
    for s in series {
        let (colour, width, dash) = s.pen.line();
        if dash.is_empty() {
            continue;
        }
        let stroke = format!("stroke=\"{}\" stroke-width=\"{width}\"", hex(colour));
        svg = svg.replace(&stroke, &format!("{stroke} stroke-dasharray=\"{dash}\""));
    }
    svg
}

/// One bar of [`bar_chart`].
pub struct Bar {
    pub name: String,
    pub value: f64,
    /// The candidate it is about: its bar has that candidate's colour ([`Pen::Candidate`]).
    pub candidate: usize,
}

/// A horizontal bar chart as an SVG document: one bar per entry, top to bottom in order, named on the left and its
/// value written at its end (at most four decimals); `reference` (a value and its name, e.g. the limit at 1) is drawn as a dashed line.
pub fn bar_chart(
    title: &str,
    x_label: &str,
    bars: &[Bar],
    reference: Option<(f64, &str)>,
    (width, height): (u32, u32),
) -> String {
    let mut svg = String::new();
    match draw_bars(&mut svg, title, x_label, bars, reference, (width, height)) {
        Ok(()) => svg,
        Err(e) => failed(title, &e, (width, height)),
    }
}

/// An SVG that says the chart could not be drawn, and why.
fn failed(title: &str, why: &str, (width, height): (u32, u32)) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\"><text x=\"10\" y=\"20\">{}: {}</text></svg>",
        escape(title),
        escape(why)
    )
}

/// A tick label: the number with as few decimals as say it (at most three).
fn tick(value: f64) -> String {
    short(value, 3)
}

/// `value` with at most `decimals` decimals, and none it does not need.
fn short(value: f64, decimals: usize) -> String {
    let text = format!("{value:.decimals$}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_string()
    } else {
        text.to_string()
    }
}

/// About how wide `text` is at [`LABEL`] sans-serif: what legends and bar names are laid out by.
fn text_width(text: &str) -> u32 {
    text.chars().count() as u32 * 7
}

/// Height of one legend row, and the swatch before each name.
const LEGEND_ROW: u32 = 20;
const SWATCH: u32 = 30;

/// Lays the legend entries out in rows `width` wide: per entry, its row and its x.
fn legend_rows(names: &[&str], width: u32) -> Vec<(u32, u32)> {
    let (mut row, mut x) = (0, 0);
    names
        .iter()
        .map(|name| {
            let w = SWATCH + 6 + text_width(name) + 18;
            if x > 0 && x + w > width {
                row += 1;
                x = 0;
            }
            let at = (row, x);
            x += w;
            at
        })
        .collect()
}

fn draw_line(
    svg: &mut String,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    (width, height): (u32, u32),
) -> Result<(), String> {
    let root = SVGBackend::with_string(svg, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(text)?;
    let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
    let (left, right) = (66, 24);
    let places = legend_rows(&names, width.saturating_sub(left + right));
    let rows = places.last().map_or(0, |&(row, _)| row + 1);
    let legend_height = rows * LEGEND_ROW + if rows > 0 { 8 } else { 0 };
    let (plot, legend) = root.split_vertically(height.saturating_sub(legend_height));
    let (mut x_min, mut x_max, mut y_max) = (f64::INFINITY, 1.0f64, 1.0f64);
    for &(x, y) in series.iter().flat_map(|s| s.points.iter()) {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_max = y_max.max(y);
    }
    if !x_min.is_finite() || x_min >= x_max {
        x_min = 0.0;
    }
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", TITLE))
        .margin(10)
        .margin_right(right)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(x_min..x_max, 0.0..y_max * 1.08)
        .map_err(text)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .label_style(("sans-serif", LABEL))
        .axis_desc_style(("sans-serif", LABEL))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(text)?;
    // The areas first, behind every line.
    for s in series.iter().filter(|s| s.pen == Pen::Offered) {
        let (outline, width, _) = s.pen.line();
        let (Some(&(first, _)), Some(&(last, _))) = (s.points.first(), s.points.last()) else {
            continue;
        };
        let mut area = s.points.clone();
        area.extend([(last, 0.0), (first, 0.0)]);
        chart
            .draw_series(std::iter::once(Polygon::new(area, OFFERED_FILL.filled())))
            .map_err(text)?;
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), outline.stroke_width(width)))
            .map_err(text)?;
    }
    for s in series.iter().filter(|s| s.pen != Pen::Offered) {
        let (colour, width, _) = s.pen.line();
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), colour.stroke_width(width)))
            .map_err(text)?;
    }
    draw_legend(&legend, series, &names, &places, left)?;
    root.present().map_err(text)?;
    Ok(())
}

/// The legend of `series` under a line chart: per series its swatch (a line, or the offered load's area) and its name,
/// at the `places` [`legend_rows`] laid out, `left` in from the edge.
fn draw_legend(
    legend: &DrawingArea<SVGBackend<'_>, Shift>,
    series: &[Series],
    names: &[&str],
    places: &[(u32, u32)],
    left: u32,
) -> Result<(), String> {
    for (s, (name, &(row, x))) in series.iter().zip(names.iter().zip(places)) {
        let (colour, width, _) = s.pen.line();
        let (x, y) = ((left + x) as i32, (row * LEGEND_ROW + 4) as i32);
        let middle = y + LEGEND_ROW as i32 / 2;
        if s.pen == Pen::Offered {
            legend
                .draw(&Rectangle::new(
                    [(x, middle - 5), (x + SWATCH as i32, middle + 5)],
                    OFFERED_FILL.filled(),
                ))
                .map_err(text)?;
        }
        legend
            .draw(&PathElement::new(
                vec![(x, middle), (x + SWATCH as i32, middle)],
                colour.stroke_width(width),
            ))
            .map_err(text)?;
        let style = ("sans-serif", LABEL)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Center));
        legend
            .draw(&Text::new(name.to_string(), (x + SWATCH as i32 + 6, middle), style))
            .map_err(text)?;
    }
    Ok(())
}

fn draw_bars(
    svg: &mut String,
    title: &str,
    x_label: &str,
    bars: &[Bar],
    reference: Option<(f64, &str)>,
    size: (u32, u32),
) -> Result<(), String> {
    let root = SVGBackend::with_string(svg, size).into_drawing_area();
    root.fill(&WHITE).map_err(text)?;
    let n = bars.len().max(1) as u32;
    let top = reference.map_or(0.0, |r| r.0);
    let x_max = bars.iter().map(|b| b.value).fold(top, f64::max).max(f64::MIN_POSITIVE) * 1.15;
    let names = bars.iter().map(|b| text_width(&b.name)).max().unwrap_or(0) + 16;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", TITLE))
        .margin(10)
        .margin_right(24)
        .x_label_area_size(32)
        .y_label_area_size(names)
        .build_cartesian_2d(0.0..x_max, (0..n).into_segmented())
        .map_err(text)?;
    // Segment 0 is at the bottom: the first bar goes in the top one.
    let segment = |i: usize| n - 1 - i as u32;
    let name_of = |v: &SegmentValue<u32>| match v {
        SegmentValue::CenterOf(s) if *s < n => bars.get((n - 1 - s) as usize).map_or(String::new(), |b| b.name.clone()),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(x_label)
        .x_label_formatter(&|v| tick(*v))
        .y_labels(n as usize)
        .y_label_formatter(&name_of)
        .label_style(("sans-serif", LABEL))
        .axis_desc_style(("sans-serif", LABEL))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(text)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let s = segment(i);
            let colour = COLOURS[b.candidate % COLOURS.len()];
            let mut bar = Rectangle::new(
                [(0.0, SegmentValue::Exact(s)), (b.value, SegmentValue::Exact(s + 1))],
                colour.filled(),
            );
            bar.set_margin(4, 4, 0, 0);
            bar
        }))
        .map_err(text)?;
    let value_style = ("sans-serif", LABEL)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            Text::new(
                short(b.value, 4),
                (b.value + x_max * 0.01, SegmentValue::CenterOf(segment(i))),
                value_style.clone(),
            )
        }))
        .map_err(text)?;
    if let Some((at, name)) = reference {
        draw_reference(&mut chart, at, name, x_max)?;
    }
    root.present().map_err(text)?;
    Ok(())
}

/// A dashed line across the bars at `at`, named `name`: the value the bars are measured against.
fn draw_reference(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<RangedCoordf64, SegmentedCoord<RangedCoordu32>>>,
    at: f64,
    name: &str,
    x_max: f64,
) -> Result<(), String> {
    let line = vec![(at, SegmentValue::Exact(0)), (at, SegmentValue::Last)];
    chart
        .draw_series(DashedLineSeries::new(line, 6, 4, BLACK.stroke_width(1)))
        .map_err(text)?;
    chart
        .draw_series(std::iter::once(Text::new(
            name.to_string(),
            (at + x_max * 0.01, SegmentValue::Last),
            ("sans-serif", LABEL)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Top)),
        )))
        .map_err(text)?;
    Ok(())
}

/// A drawing error's message.
fn text<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Text made safe inside HTML or SVG.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_names_its_series() {
        let svg = line_chart(
            "admitted / s",
            "second",
            "requests",
            &[
                Series {
                    name: "token_bucket".into(),
                    points: vec![(0.0, 1.0), (1.0, 5.0)],
                    pen: Pen::Candidate(0),
                },
                Series {
                    name: "fixed_window".into(),
                    points: vec![(0.0, 2.0), (1.0, 3.0)],
                    pen: Pen::Candidate(1),
                },
            ],
            (600, 300),
        );
        assert!(
            svg.starts_with("<svg") && svg.contains("token_bucket") && svg.contains("fixed_window"),
            "{svg}"
        );
        assert!(svg.contains("admitted / s"));
        // No series at all still draws the axes.
        assert!(line_chart("empty", "s", "n", &[], (300, 200)).starts_with("<svg"));
    }

    /// Every `<text>` of an SVG: its x, y and content.
    fn texts(svg: &str) -> Vec<(f64, f64, String)> {
        let attribute = |tag: &str, name: &str| -> f64 {
            let at = tag.find(&format!(" {name}=\"")).expect("the attribute") + name.len() + 3;
            tag[at..].split('"').next().unwrap().parse().unwrap()
        };
        svg.split("<text")
            .skip(1)
            .map(|t| {
                let (tag, rest) = t.split_once('>').unwrap();
                let content = rest.split("</text>").next().unwrap().trim().to_string();
                (attribute(tag, "x"), attribute(tag, "y"), content)
            })
            .collect()
    }

    fn seconds(n: usize, value: impl Fn(usize) -> f64) -> Vec<(f64, f64)> {
        (0..n).map(|s| (s as f64, value(s))).collect()
    }

    /// The legend under the axes, whole ticks written whole, the last x label inside the chart.
    #[test]
    fn a_report_chart_keeps_its_legend_out_of_the_data_and_its_ticks_clean() {
        let series = [
            Series {
                name: "offered".into(),
                points: seconds(120, |s| if s == 119 { 600.0 } else { 50.0 }),
                pen: Pen::Offered,
            },
            Series {
                name: "leaky_bucket burst 20".into(),
                points: seconds(120, |_| 10.0),
                pen: Pen::Candidate(0),
            },
        ];
        let (width, height) = (960, 420);
        let svg = line_chart("Admitted", "second", "requests / s", &series, (width, height));
        let texts = texts(&svg);
        let legend: Vec<&(f64, f64, String)> = texts
            .iter()
            .filter(|t| t.2 == "offered" || t.2.starts_with("leaky"))
            .collect();
        assert_eq!(legend.len(), 2, "{svg}");
        // Every axis label is above the legend: the legend has a band of its own.
        let axis_bottom = texts
            .iter()
            .filter(|t| t.2 == "second")
            .map(|t| t.1)
            .fold(0.0, f64::max);
        assert!(
            legend.iter().all(|t| t.1 > axis_bottom),
            "{legend:?} under {axis_bottom}"
        );
        let numbers: Vec<&(f64, f64, String)> = texts.iter().filter(|t| t.2.parse::<f64>().is_ok()).collect();
        assert!(numbers.len() > 6, "{texts:?}");
        for (_, _, label) in &numbers {
            assert!(!label.contains('.'), "a whole tick written whole: {label}");
        }
        // The rightmost tick label fits in the chart (about 7 px a character, centred on its tick).
        let (x, _, label) = numbers.iter().max_by(|a, b| a.0.total_cmp(&b.0)).unwrap();
        assert!(x + label.len() as f64 * 7.0 <= f64::from(width), "{label} at {x}");
    }

    #[test]
    fn a_tick_has_the_decimals_it_needs_and_no_more() {
        for (value, text) in [
            (20.0, "20"),
            (0.0, "0"),
            (-0.0, "0"),
            (0.25, "0.25"),
            (1.5, "1.5"),
            (1e6, "1000000"),
        ] {
            assert_eq!(tick(value), text);
        }
    }

    /// A bar chart names every bar, writes its value, and draws the reference line and its name.
    #[test]
    fn a_bar_chart_names_its_bars_and_their_values() {
        let bars = [
            Bar {
                name: "fixed_window (the rule's)".into(),
                value: 1.61,
                candidate: 1,
            },
            Bar {
                name: "sliding_log".into(),
                value: 1.0,
                candidate: 2,
            },
        ];
        let svg = bar_chart(
            "Worst window / limit",
            "over the limit",
            &bars,
            Some((1.0, "limit")),
            (960, 160),
        );
        let texts = texts(&svg);
        let content: Vec<&str> = texts.iter().map(|t| t.2.as_str()).collect();
        for want in [
            "Worst window / limit",
            "fixed_window (the rule&apos;s)",
            "sliding_log",
            "1.61",
            "1",
            "limit",
        ] {
            assert!(content.contains(&want), "{want} in {content:?}");
        }
        // The first bar on top.
        let y = |name: &str| texts.iter().find(|t| t.2.starts_with(name)).unwrap().1;
        assert!(y("fixed_window") < y("sliding_log"));
        assert_eq!(
            svg.matches("<rect").count(),
            1 + 2,
            "the background and one per bar: {svg}"
        );
        // No bars still draws the chart.
        assert!(bar_chart("empty", "x", &[], None, (300, 120)).starts_with("<svg"));
    }
}
