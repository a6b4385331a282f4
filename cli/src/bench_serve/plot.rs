//! Plots of a benchmark with `plotters`: latency CDFs of one run, or throughput and TTFT against
//! concurrency for a sweep, as compressed PNG or SVG (by the file's extension). Text uses an
//! ASCII subset of DejaVu Sans compiled in (`cli/assets/`), so no system font is needed.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const SIZE: (u32, u32) = (1000, 560);
const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans-subset.ttf");

/// A named line of points.
pub type Series = (String, Vec<(f64, f64)>);

/// One chart: a title, axis names and its lines.
pub struct Chart<'a> {
    /// The chart's title.
    pub title: String,
    /// X axis name, with its unit.
    pub x_label: &'a str,
    /// Y axis name, with its unit.
    pub y_label: &'a str,
    /// The lines.
    pub series: Vec<Series>,
}

fn font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The font is compiled in and parsed by the test below: it cannot fail here.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// Draws `charts` side by side under a `heading` (one line, then an optional smaller one) into
/// `path` (`.svg` for SVG, anything else PNG).
pub fn draw(path: &Path, heading: (&str, &str), charts: &[Chart]) -> Result<(), String> {
    font();
    let svg = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    if svg {
        let root = SVGBackend::new(path, SIZE).into_drawing_area();
        draw_on(&root, heading, charts).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))
    } else {
        let root = BitMapBackend::new(path, SIZE).into_drawing_area();
        draw_on(&root, heading, charts).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))
    }
}

fn draw_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    (heading, sub): (&str, &str),
    charts: &[Chart],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(if sub.is_empty() { 34 } else { 54 });
    let centre = |size: u32| {
        TextStyle::from(("sans-serif", size).into_font()).pos(Pos::new(HPos::Center, VPos::Top))
    };
    top.draw_text(heading, &centre(18), (SIZE.0 as i32 / 2, 8))?;
    top.draw_text(sub, &centre(14), (SIZE.0 as i32 / 2, 32))?;
    let panels = body.split_evenly((1, charts.len().max(1)));
    // Colours continue across panels: no two lines of the figure share one.
    let mut colour = 0;
    for (area, chart) in panels.iter().zip(charts) {
        let (mut x1, mut y1) = (0f64, 0f64);
        for &(x, y) in chart.series.iter().flat_map(|(_, p)| p) {
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
        let x1 = if x1 > 0.0 { x1 * 1.05 } else { 1.0 };
        let y1 = if y1 > 0.0 { y1 * 1.05 } else { 1.0 };
        let mut c = ChartBuilder::on(area)
            .caption(&chart.title, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..x1, 0f64..y1)?;
        c.configure_mesh()
            .x_desc(chart.x_label)
            .y_desc(chart.y_label)
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()?;
        for (name, pts) in &chart.series {
            let color = Palette99::pick(colour).to_rgba();
            colour += 1;
            let style = color.stroke_width(2);
            c.draw_series(LineSeries::new(pts.iter().copied(), style))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            if pts.len() <= 16 {
                c.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
            }
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()?;
    }
    Ok(())
}

/// A tick label: at most three decimals, no trailing zeros (`500`, `0.25`).
fn tick(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The empirical CDF of `xs` as points (value, fraction ≤ value).
pub fn cdf(xs: &[f64]) -> Vec<(f64, f64)> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    v.iter().enumerate().map(|(i, &x)| (x, (i + 1) as f64 / n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charts() -> Vec<Chart<'static>> {
        vec![Chart {
            title: "Latency CDF".into(),
            x_label: "milliseconds",
            y_label: "fraction of requests",
            series: vec![
                ("TTFT".into(), cdf(&[310.0, 120.0, 255.0, 980.0])),
                ("E2E".into(), cdf(&[1400.0, 1650.0, 2210.0, 1990.0])),
            ],
        }]
    }

    #[test]
    fn font_parses() {
        assert!(plotters::style::register_font("test-font", FontStyle::Normal, FONT).is_ok());
    }

    #[test]
    fn png_is_compressed_and_svg_has_round_ticks_and_a_legend() {
        let dir = std::env::temp_dir().join(format!("tandem-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (png, svg) = (dir.join("p.png"), dir.join("p.svg"));
        draw(&png, ("random, 4 prompts, 64 in / 64 out", "a label"), &charts()).unwrap();
        draw(&svg, ("random, 4 prompts, 64 in / 64 out", "a label"), &charts()).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // 1000 × 560 RGB stored raw would be 1.7 MB.
        assert!(bytes.len() < 200_000, "{} bytes", bytes.len());
        let text = std::fs::read_to_string(&svg).unwrap();
        let texts: Vec<&str> = text.lines().filter(|l| !l.starts_with('<')).collect();
        for want in [
            "random, 4 prompts, 64 in / 64 out",
            "Latency CDF",
            "milliseconds",
            "TTFT",
            "E2E",
            "500",
            "0.5",
            "2000",
        ] {
            assert!(texts.contains(&want), "the SVG lacks {want:?}: {texts:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cdf_points() {
        assert_eq!(
            cdf(&[3.0, 1.0, 2.0, 2.0]),
            vec![(1.0, 0.25), (2.0, 0.5), (2.0, 0.75), (3.0, 1.0)]
        );
    }
}
