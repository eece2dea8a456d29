//! Line charts as SVG, drawn with plotters: the simulator's report draws every chart here (the dashboard draws its
//! own in the browser, with uPlot). A chart is a title, an x axis in seconds, and named series of (second, value)
//! points; the SVG names each series in its legend (`<text>` elements), which is what the browser tests read.

use plotters::prelude::*;

/// One named series of points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// The colours of successive series.
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// A line chart of `series` as an SVG document, `width` by `height` pixels; `x_label` and `y_label` name the axes.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series], (width, height): (u32, u32)) -> String {
    let mut svg = String::new();
    // Drawing into a String cannot fail but for a plotters bug; an empty chart then says so.
    if let Err(e) = draw(&mut svg, title, x_label, y_label, series, (width, height)) {
        return format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\"><text x=\"10\" y=\"20\">{}: {}</text></svg>",
            escape(title),
            escape(&e)
        );
    }
    svg
}

fn draw(
    svg: &mut String,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    size: (u32, u32),
) -> Result<(), String> {
    let root = SVGBackend::with_string(svg, size).into_drawing_area();
    root.fill(&WHITE).map_err(text)?;
    let points = series.iter().flat_map(|s| s.points.iter());
    let (mut x_max, mut y_max) = (1.0f64, 1.0f64);
    let mut x_min = f64::INFINITY;
    for &(x, y) in points {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_max = y_max.max(y);
    }
    if !x_min.is_finite() || x_min >= x_max {
        x_min = 0.0;
    }
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(x_min..x_max, 0.0..y_max * 1.08)
        .map_err(text)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(text)?;
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), colour.stroke_width(2)))
            .map_err(text)?
            .label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(text)?;
    root.present().map_err(text)?;
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
                },
                Series {
                    name: "fixed_window".into(),
                    points: vec![(0.0, 2.0), (1.0, 3.0)],
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
}
