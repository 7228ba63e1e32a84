//! LOLWUT: a little computer art and the version. VERSION 5 draws a grid of squares
//! that grow more disordered row by row (after Georg Nees's "Schotter"), in Braille
//! characters; VERSION 6 draws a night skyline. The drawings are Kite's own; the closing
//! credit lines are the ones Redis prints, which clients may look for.

use bytes::Bytes;

use super::connection::SERVER_VERSION;
use super::util::{eq_ci, parse_i64};
use crate::server::session::Session;

/// A pixel canvas rendered as Braille characters (2 x 4 pixels each).
struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<bool>,
}

impl Canvas {
    fn new(width: usize, height: usize) -> Canvas {
        Canvas {
            width,
            height,
            pixels: vec![false; width * height],
        }
    }

    fn set(&mut self, x: i64, y: i64) {
        if x >= 0 && y >= 0 && (x as usize) < self.width && (y as usize) < self.height {
            self.pixels[y as usize * self.width + x as usize] = true;
        }
    }

    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64)) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.set(x, y);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    fn render(&self) -> String {
        // Braille dot numbering: left column 1,2,3,7 and right column 4,5,6,8.
        const BITS: [[u32; 4]; 2] = [[0x01, 0x02, 0x04, 0x40], [0x08, 0x10, 0x20, 0x80]];
        let mut s = String::new();
        for cy in (0..self.height).step_by(4) {
            for cx in (0..self.width).step_by(2) {
                let mut code = 0;
                for (dx, col) in BITS.iter().enumerate() {
                    for (dy, bit) in col.iter().enumerate() {
                        let (x, y) = (cx + dx, cy + dy);
                        if x < self.width && y < self.height && self.pixels[y * self.width + x] {
                            code |= bit;
                        }
                    }
                }
                s.push(char::from_u32(0x2800 + code).unwrap_or(' '));
            }
            s.push('\n');
        }
        s
    }
}

/// A small deterministic generator, so the same arguments draw the same picture.
struct Lcg(u64);

impl Lcg {
    fn unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn schotter(cols: usize, per_row: usize, per_col: usize) -> String {
    let width = cols * 2;
    // A narrow grid of many tall rows would ask for a canvas of hundreds of megabytes:
    // the squares shrink so the picture stays under 4 M pixels.
    let side = (width / per_row)
        .max(2)
        .min((4 << 20) / width / per_col)
        .max(1);
    let height = side * per_col + 4;
    let mut c = Canvas::new(width, height);
    let mut rng = Lcg(1968);
    for row in 0..per_col {
        let disorder = row as f64 / per_col as f64;
        for col in 0..per_row {
            let half = side as f64 / 2.0 * 0.8;
            let cx = col as f64 * side as f64
                + side as f64 / 2.0
                + (rng.unit() - 0.5) * disorder * side as f64 * 0.6;
            let cy = row as f64 * side as f64
                + side as f64 / 2.0
                + 2.0
                + (rng.unit() - 0.5) * disorder * side as f64 * 0.6;
            let angle = (rng.unit() - 0.5) * disorder * std::f64::consts::PI / 2.0;
            let corner = |k: usize| {
                let a =
                    angle + std::f64::consts::FRAC_PI_4 + k as f64 * std::f64::consts::FRAC_PI_2;
                let r = half * std::f64::consts::SQRT_2;
                (
                    (cx + r * a.cos()).round() as i64,
                    (cy + r * a.sin()).round() as i64,
                )
            };
            for k in 0..4 {
                c.line(corner(k), corner((k + 1) % 4));
            }
        }
    }
    c.render()
}

fn skyline(cols: usize, rows: usize) -> String {
    let mut rng = Lcg(8);
    let mut heights = Vec::with_capacity(cols);
    while heights.len() < cols {
        let w = 2 + (rng.unit() * 5.0) as usize;
        let h = 2 + (rng.unit() * (rows as f64 - 4.0)) as usize;
        heights.extend(std::iter::repeat_n(h, w));
    }
    heights.truncate(cols);
    let mut s = String::new();
    for row in 0..rows {
        let level = rows - row;
        for (x, &h) in heights.iter().enumerate() {
            let ch = if level <= h {
                if (x + row) % 3 == 0 && rng.unit() < 0.4 {
                    '.'
                } else {
                    '#'
                }
            } else if rng.unit() < 0.02 {
                '*'
            } else {
                ' '
            };
            s.push(ch);
        }
        s.push('\n');
    }
    s
}

fn arg_in(args: &[Bytes], i: usize, default: i64, lo: i64, hi: i64) -> Result<usize, &'static str> {
    match args.get(i) {
        None => Ok(default as usize),
        Some(a) => Ok(parse_i64(a)?.clamp(lo, hi) as usize),
    }
}

pub fn lolwut(sess: &mut Session, args: &[Bytes]) {
    let mut version = SERVER_VERSION
        .split('.')
        .next()
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(7);
    let mut rest = &args[1..];
    if args.len() >= 3 && eq_ci(&args[1], "version") {
        match parse_i64(&args[2]) {
            Ok(v) => version = v,
            Err(e) => return sess.error(e),
        }
        rest = &args[3..];
    }
    let text = match version {
        5 => {
            let dims = arg_in(rest, 0, 66, 1, 1000)
                .and_then(|c| Ok((c, arg_in(rest, 1, 8, 1, 200)?, arg_in(rest, 2, 12, 1, 200)?)));
            match dims {
                Ok((cols, per_row, per_col)) => format!(
                    "{}\nGeorg Nees - schotter, plotter on paper, 1968. Redis ver. {SERVER_VERSION}\n",
                    schotter(cols, per_row, per_col)
                ),
                Err(e) => return sess.error(e),
            }
        }
        6 => {
            let dims =
                arg_in(rest, 0, 80, 1, 1000).and_then(|c| Ok((c, arg_in(rest, 1, 20, 1, 1000)?)));
            match dims {
                Ok((cols, rows)) => format!(
                    "{}\nDedicated to the 8 bit game developers of past and present.\nOriginal 8 bit image from Plaguemon by hikikomori. Redis ver. {SERVER_VERSION}\n",
                    skyline(cols, rows.max(4))
                ),
                Err(e) => return sess.error(e),
            }
        }
        _ => format!("Redis ver. {SERVER_VERSION}\n"),
    };
    sess.out.verbatim(text.as_bytes());
}
