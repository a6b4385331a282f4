//! PNG plots of a benchmark: latency CDFs, or throughput against concurrency for a sweep.
//! A small raster renderer (lines, axes, a 3×5 pixel font) and a PNG writer with stored
//! (uncompressed) deflate blocks, so no image library is needed.

const W: usize = 900;
const H: usize = 540;
const LEFT: usize = 80;
const RIGHT: usize = 30;
const TOP: usize = 50;
const BOTTOM: usize = 60;

/// An RGB canvas.
pub struct Canvas {
    px: Vec<[u8; 3]>,
}

/// Line colours of the series, in order.
pub const COLORS: [[u8; 3]; 6] =
    [[31, 119, 180], [214, 39, 40], [44, 160, 44], [148, 103, 189], [255, 127, 14], [23, 190, 207]];

// 3×5 glyphs, rows top to bottom, 3 bits per row (MSB left).
fn glyph(c: char) -> [u8; 5] {
    match c.to_ascii_uppercase() {
        '0' => [7, 5, 5, 5, 7],
        '1' => [2, 6, 2, 2, 7],
        '2' => [7, 1, 7, 4, 7],
        '3' => [7, 1, 7, 1, 7],
        '4' => [5, 5, 7, 1, 1],
        '5' => [7, 4, 7, 1, 7],
        '6' => [7, 4, 7, 5, 7],
        '7' => [7, 1, 1, 1, 1],
        '8' => [7, 5, 7, 5, 7],
        '9' => [7, 5, 7, 1, 7],
        '.' => [0, 0, 0, 0, 2],
        '-' => [0, 0, 7, 0, 0],
        '/' => [1, 1, 2, 4, 4],
        '(' => [2, 4, 4, 4, 2],
        ')' => [2, 1, 1, 1, 2],
        ':' => [0, 2, 0, 2, 0],
        '%' => [5, 1, 2, 4, 5],
        'A' => [2, 5, 7, 5, 5],
        'B' => [6, 5, 6, 5, 6],
        'C' => [7, 4, 4, 4, 7],
        'D' => [6, 5, 5, 5, 6],
        'E' => [7, 4, 6, 4, 7],
        'F' => [7, 4, 6, 4, 4],
        'G' => [7, 4, 5, 5, 7],
        'H' => [5, 5, 7, 5, 5],
        'I' => [7, 2, 2, 2, 7],
        'J' => [1, 1, 1, 5, 7],
        'K' => [5, 5, 6, 5, 5],
        'L' => [4, 4, 4, 4, 7],
        'M' => [5, 7, 7, 5, 5],
        'N' => [6, 5, 5, 5, 5],
        'O' => [7, 5, 5, 5, 7],
        'P' => [7, 5, 7, 4, 4],
        'Q' => [7, 5, 5, 7, 1],
        'R' => [7, 5, 6, 5, 5],
        'S' => [7, 4, 7, 1, 7],
        'T' => [7, 2, 2, 2, 2],
        'U' => [5, 5, 5, 5, 7],
        'V' => [5, 5, 5, 5, 2],
        'W' => [5, 5, 7, 7, 5],
        'X' => [5, 5, 2, 5, 5],
        'Y' => [5, 5, 2, 2, 2],
        'Z' => [7, 1, 2, 4, 7],
        _ => [0; 5],
    }
}

impl Canvas {
    /// A white canvas.
    pub fn new() -> Canvas {
        Canvas { px: vec![[255; 3]; W * H] }
    }

    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if (0..W as i64).contains(&x) && (0..H as i64).contains(&y) {
            self.px[y as usize * W + x as usize] = c;
        }
    }

    /// A line, `thick` pixels wide.
    pub fn line(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), c: [u8; 3], thick: i64) {
        let steps = ((x1 - x0).abs().max((y1 - y0).abs()).ceil() as usize).max(1);
        for i in 0..=steps {
            let t = i as f64 / steps as f64;
            let (x, y) = ((x0 + (x1 - x0) * t).round() as i64, (y0 + (y1 - y0) * t).round() as i64);
            for dx in 0..thick {
                for dy in 0..thick {
                    self.set(x + dx - thick / 2, y + dy - thick / 2, c);
                }
            }
        }
    }

    /// Text at `scale`× the 3×5 font, top-left at (x, y).
    pub fn text(&mut self, x: i64, y: i64, s: &str, scale: i64, c: [u8; 3]) {
        for (i, ch) in s.chars().enumerate() {
            let g = glyph(ch);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..3 {
                    if bits & (4 >> col) != 0 {
                        for dx in 0..scale {
                            for dy in 0..scale {
                                self.set(
                                    x + i as i64 * 4 * scale + col * scale + dx,
                                    y + row as i64 * scale + dy,
                                    c,
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Encodes the canvas as PNG.
    pub fn png(&self) -> Vec<u8> {
        let mut raw = Vec::with_capacity(H * (1 + 3 * W));
        for y in 0..H {
            raw.push(0); // filter: none
            for p in &self.px[y * W..(y + 1) * W] {
                raw.extend_from_slice(p);
            }
        }
        // zlib stream of stored deflate blocks.
        let mut z = vec![0x78, 0x01];
        let mut chunks = raw.chunks(65535).peekable();
        while let Some(c) = chunks.next() {
            z.push(if chunks.peek().is_none() { 1 } else { 0 });
            z.extend_from_slice(&(c.len() as u16).to_le_bytes());
            z.extend_from_slice(&(!(c.len() as u16)).to_le_bytes());
            z.extend_from_slice(c);
        }
        let (mut a, mut b) = (1u32, 0u32);
        for &x in &raw {
            a = (a + x as u32) % 65521;
            b = (b + a) % 65521;
        }
        z.extend_from_slice(&((b << 16) | a).to_be_bytes());
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut chunk = |kind: &[u8], data: &[u8]| {
            out.extend_from_slice(&(data.len() as u32).to_be_bytes());
            let mut h = crc32fast::Hasher::new();
            h.update(kind);
            h.update(data);
            out.extend_from_slice(kind);
            out.extend_from_slice(data);
            out.extend_from_slice(&h.finalize().to_be_bytes());
        };
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&(W as u32).to_be_bytes());
        ihdr.extend_from_slice(&(H as u32).to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        chunk(b"IHDR", &ihdr);
        chunk(b"IDAT", &z);
        chunk(b"IEND", &[]);
        out
    }
}

impl Default for Canvas {
    fn default() -> Self {
        Canvas::new()
    }
}

fn nice(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A line chart of `series` (name, points) with axes and a legend.
pub fn chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Canvas {
    let mut c = Canvas::new();
    let black = [0, 0, 0];
    let grey = [220, 220, 220];
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x1, mut y1) = (0f64, 0f64);
    for &(x, y) in pts {
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    let (x1, y1) = (if x1 > 0.0 { x1 * 1.05 } else { 1.0 }, if y1 > 0.0 { y1 * 1.05 } else { 1.0 });
    let (pw, ph) = ((W - LEFT - RIGHT) as f64, (H - TOP - BOTTOM) as f64);
    let map = |x: f64, y: f64| (LEFT as f64 + x / x1 * pw, (H - BOTTOM) as f64 - y / y1 * ph);
    for i in 0..=5 {
        let f = i as f64 / 5.0;
        let (gx, _) = map(f * x1, 0.0);
        let (_, gy) = map(0.0, f * y1);
        c.line((gx, TOP as f64), (gx, (H - BOTTOM) as f64), grey, 1);
        c.line((LEFT as f64, gy), ((W - RIGHT) as f64, gy), grey, 1);
        c.text(gx as i64 - 10, (H - BOTTOM) as i64 + 8, &nice(f * x1), 2, black);
        c.text(8, gy as i64 - 5, &nice(f * y1), 2, black);
    }
    c.line((LEFT as f64, TOP as f64), (LEFT as f64, (H - BOTTOM) as f64), black, 2);
    c.line((LEFT as f64, (H - BOTTOM) as f64), ((W - RIGHT) as f64, (H - BOTTOM) as f64), black, 2);
    c.text(LEFT as i64, 12, title, 3, black);
    c.text((W / 2) as i64 - 60, (H - 22) as i64, x_label, 2, black);
    c.text(8, TOP as i64 - 18, y_label, 2, black);
    for (i, (name, p)) in series.iter().enumerate() {
        let col = COLORS[i % COLORS.len()];
        for w in p.windows(2) {
            c.line(map(w[0].0, w[0].1), map(w[1].0, w[1].1), col, 2);
        }
        if p.len() == 1 {
            let (x, y) = map(p[0].0, p[0].1);
            c.line((x - 3.0, y), (x + 3.0, y), col, 5);
        }
        let ly = TOP as i64 + 10 + i as i64 * 18;
        c.line(((W - 230) as f64, ly as f64 + 5.0), ((W - 200) as f64, ly as f64 + 5.0), col, 3);
        c.text((W - 190) as i64, ly, name, 2, black);
    }
    c
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

    #[test]
    fn png_is_well_formed() {
        let c = chart("TTFT CDF", "MS", "FRACTION", &[("TTFT".into(), cdf(&[3.0, 1.0, 2.0]))]);
        let png = c.png();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), W as u32);
        assert!(png.ends_with(&[0xAE, 0x42, 0x60, 0x82]), "IEND with its CRC");
        // Something was drawn in the series colour.
        assert!(c.px.iter().any(|p| *p == COLORS[0]));
    }

    #[test]
    fn cdf_points() {
        assert_eq!(
            cdf(&[3.0, 1.0, 2.0, 2.0]),
            vec![(1.0, 0.25), (2.0, 0.5), (2.0, 0.75), (3.0, 1.0)]
        );
    }
}
