//! Geohash arithmetic as Redis does it, so that a sorted set written by either server
//! reads the same in the other: 52-bit scores interleaving 26 bits of latitude (over
//! Web Mercator's -85.05..85.05) and 26 of longitude, cell centres for positions, and the
//! same 3x3 cells around a search centre, visited in the same order (which fixes the
//! order of unsorted results and what COUNT ... ANY returns).

pub const STEP_MAX: u8 = 26;
pub const LAT_MIN: f64 = -85.051_128_78;
pub const LAT_MAX: f64 = 85.051_128_78;
pub const LONG_MIN: f64 = -180.0;
pub const LONG_MAX: f64 = 180.0;

const D_R: f64 = std::f64::consts::PI / 180.0;
/// Earth's quadratic mean radius for WGS-84, the figure Redis uses.
pub const EARTH_RADIUS_M: f64 = 6_372_797.560_856;
const MERCATOR_MAX: f64 = 20_037_726.37;

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Bits {
    pub bits: u64,
    pub step: u8,
}

impl Bits {
    fn is_zero(self) -> bool {
        self.bits == 0 && self.step == 0
    }

    /// The hash aligned to 52 bits: the lowest score of the cell.
    pub fn align52(self) -> u64 {
        self.bits << (52 - self.step as u32 * 2)
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Range {
    pub min: f64,
    pub max: f64,
}

#[derive(Clone, Copy, Debug)]
pub struct Area {
    pub long: Range,
    pub lat: Range,
}

const LONG_RANGE: Range = Range {
    min: LONG_MIN,
    max: LONG_MAX,
};
const LAT_RANGE: Range = Range {
    min: LAT_MIN,
    max: LAT_MAX,
};

fn deg_rad(a: f64) -> f64 {
    a * D_R
}

fn rad_deg(a: f64) -> f64 {
    a / D_R
}

fn interleave(xlo: u32, ylo: u32) -> u64 {
    const B: [u64; 5] = [
        0x5555_5555_5555_5555,
        0x3333_3333_3333_3333,
        0x0F0F_0F0F_0F0F_0F0F,
        0x00FF_00FF_00FF_00FF,
        0x0000_FFFF_0000_FFFF,
    ];
    const S: [u32; 5] = [1, 2, 4, 8, 16];
    let (mut x, mut y) = (xlo as u64, ylo as u64);
    for i in (0..5).rev() {
        x = (x | (x << S[i])) & B[i];
        y = (y | (y << S[i])) & B[i];
    }
    x | (y << 1)
}

fn deinterleave(v: u64) -> u64 {
    const B: [u64; 6] = [
        0x5555_5555_5555_5555,
        0x3333_3333_3333_3333,
        0x0F0F_0F0F_0F0F_0F0F,
        0x00FF_00FF_00FF_00FF,
        0x0000_FFFF_0000_FFFF,
        0x0000_0000_FFFF_FFFF,
    ];
    const S: [u32; 6] = [0, 1, 2, 4, 8, 16];
    let (mut x, mut y) = (v, v >> 1);
    for i in 0..6 {
        x = (x | (x >> S[i])) & B[i];
        y = (y | (y >> S[i])) & B[i];
    }
    x | (y << 32)
}

/// Encodes a position over the given ranges; None outside them (or outside Mercator's).
pub fn encode_in(long_r: Range, lat_r: Range, long: f64, lat: f64, step: u8) -> Option<Bits> {
    if !(LONG_MIN..=LONG_MAX).contains(&long) || !(LAT_MIN..=LAT_MAX).contains(&lat) {
        return None;
    }
    if lat < lat_r.min || lat > lat_r.max || long < long_r.min || long > long_r.max {
        return None;
    }
    let lat_off = (lat - lat_r.min) / (lat_r.max - lat_r.min) * (1u64 << step) as f64;
    let long_off = (long - long_r.min) / (long_r.max - long_r.min) * (1u64 << step) as f64;
    Some(Bits {
        bits: interleave(lat_off as u32, long_off as u32),
        step,
    })
}

pub fn encode(long: f64, lat: f64, step: u8) -> Option<Bits> {
    encode_in(LONG_RANGE, LAT_RANGE, long, lat, step)
}

/// The score GEOADD stores for a position.
pub fn score_of(long: f64, lat: f64) -> Option<f64> {
    encode(long, lat, STEP_MAX).map(|b| b.align52() as f64)
}

fn decode_in(long_r: Range, lat_r: Range, h: Bits) -> Area {
    let sep = deinterleave(h.bits);
    let ilat = sep as u32 as f64;
    let ilong = (sep >> 32) as u32 as f64;
    let cells = (1u64 << h.step) as f64;
    let lat_scale = lat_r.max - lat_r.min;
    let long_scale = long_r.max - long_r.min;
    Area {
        lat: Range {
            min: lat_r.min + (ilat / cells) * lat_scale,
            max: lat_r.min + ((ilat + 1.0) / cells) * lat_scale,
        },
        long: Range {
            min: long_r.min + (ilong / cells) * long_scale,
            max: long_r.min + ((ilong + 1.0) / cells) * long_scale,
        },
    }
}

pub fn decode(h: Bits) -> Area {
    decode_in(LONG_RANGE, LAT_RANGE, h)
}

/// The position a stored score stands for: the centre of its cell.
pub fn position_of(score: f64) -> [f64; 2] {
    let area = decode(Bits {
        bits: score as u64,
        step: STEP_MAX,
    });
    let long = ((area.long.min + area.long.max) / 2.0).clamp(LONG_MIN, LONG_MAX);
    let lat = ((area.lat.min + area.lat.max) / 2.0).clamp(LAT_MIN, LAT_MAX);
    [long, lat]
}

/// The standard 11-character geohash (over -90..90 latitude) of a stored score.
pub fn geohash_string(score: f64) -> String {
    const ALPHABET: &[u8] = b"0123456789bcdefghjkmnpqrstuvwxyz";
    let [long, lat] = position_of(score);
    let std_lat = Range {
        min: -90.0,
        max: 90.0,
    };
    let bits = encode_in(LONG_RANGE, std_lat, long, lat, 26)
        .map(|b| b.bits)
        .unwrap_or(0);
    (0..11)
        .map(|i| {
            // Only 52 bits: the eleventh character is always the first of the alphabet.
            let idx = if i == 10 {
                0
            } else {
                (bits >> (52 - (i + 1) * 5)) & 0x1f
            };
            ALPHABET[idx as usize] as char
        })
        .collect()
}

fn move_x(h: &mut Bits, d: i8) {
    if d == 0 {
        return;
    }
    let mut x = h.bits & 0xaaaa_aaaa_aaaa_aaaa;
    let y = h.bits & 0x5555_5555_5555_5555;
    let zz = 0x5555_5555_5555_5555u64 >> (64 - h.step as u32 * 2);
    if d > 0 {
        x = x.wrapping_add(zz + 1);
    } else {
        x |= zz;
        x = x.wrapping_sub(zz + 1);
    }
    x &= 0xaaaa_aaaa_aaaa_aaaau64 >> (64 - h.step as u32 * 2);
    h.bits = x | y;
}

fn move_y(h: &mut Bits, d: i8) {
    if d == 0 {
        return;
    }
    let x = h.bits & 0xaaaa_aaaa_aaaa_aaaa;
    let mut y = h.bits & 0x5555_5555_5555_5555;
    let zz = 0xaaaa_aaaa_aaaa_aaaau64 >> (64 - h.step as u32 * 2);
    if d > 0 {
        y = y.wrapping_add(zz + 1);
    } else {
        y |= zz;
        y = y.wrapping_sub(zz + 1);
    }
    y &= 0x5555_5555_5555_5555u64 >> (64 - h.step as u32 * 2);
    h.bits = x | y;
}

fn moved(h: Bits, dx: i8, dy: i8) -> Bits {
    let mut n = h;
    move_x(&mut n, dx);
    move_y(&mut n, dy);
    n
}

/// What a search covers: a circle of `radius`, or a box of `width` by `height`, in the
/// user's unit (`conversion` metres each), around `center` (longitude, latitude).
#[derive(Clone, Copy, Debug)]
pub enum Shape {
    Radius(f64),
    Box { width: f64, height: f64 },
}

#[derive(Clone, Copy, Debug)]
pub struct Search {
    pub center: [f64; 2],
    pub shape: Shape,
    pub conversion: f64,
}

fn estimate_steps(mut range_m: f64, lat: f64) -> u8 {
    if range_m == 0.0 {
        return 26;
    }
    let mut step: i32 = 1;
    while range_m < MERCATOR_MAX {
        range_m *= 2.0;
        step += 1;
    }
    step -= 2;
    if !(-66.0..=66.0).contains(&lat) {
        step -= 1;
        if !(-80.0..=80.0).contains(&lat) {
            step -= 1;
        }
    }
    step.clamp(1, 26) as u8
}

impl Search {
    /// (min long, min lat, max long, max lat) of the area searched.
    fn bounding_box(&self) -> [f64; 4] {
        let [long, lat] = self.center;
        let (h, w) = match self.shape {
            Shape::Radius(r) => (r, r),
            Shape::Box { width, height } => (height / 2.0, width / 2.0),
        };
        let height = self.conversion * h;
        let width = self.conversion * w;
        let lat_delta = rad_deg(height / EARTH_RADIUS_M);
        let long_delta_top = rad_deg(width / EARTH_RADIUS_M / deg_rad(lat + lat_delta).cos());
        let long_delta_bottom = rad_deg(width / EARTH_RADIUS_M / deg_rad(lat - lat_delta).cos());
        let south = lat < 0.0;
        let d = if south {
            long_delta_bottom
        } else {
            long_delta_top
        };
        [long - d, lat - lat_delta, long + d, lat + lat_delta]
    }

    /// The cells to scan, in Redis's order: the centre's, then N, S, E, W, NE, NW, SE,
    /// SW; None for neighbours that cannot hold a match.
    pub fn cells(&self) -> [Option<Bits>; 9] {
        let [min_lon, min_lat, max_lon, max_lat] = self.bounding_box();
        let [long, lat] = self.center;
        let radius_m = self.conversion
            * match self.shape {
                Shape::Radius(r) => r,
                Shape::Box { width, height } => {
                    ((width / 2.0) * (width / 2.0) + (height / 2.0) * (height / 2.0)).sqrt()
                }
            };
        let mut steps = estimate_steps(radius_m, lat);
        let mut hash = encode(long, lat, steps).unwrap_or(Bits {
            bits: 0,
            step: steps,
        });
        let neighbours = |h: Bits| {
            [
                moved(h, 0, 1),   // north
                moved(h, 0, -1),  // south
                moved(h, 1, 0),   // east
                moved(h, -1, 0),  // west
                moved(h, 1, 1),   // north-east
                moved(h, -1, 1),  // north-west
                moved(h, 1, -1),  // south-east
                moved(h, -1, -1), // south-west
            ]
        };
        let mut n = neighbours(hash);
        // A centre near its cell's edge may need bigger cells for the 3x3 to cover it.
        let too_small = decode(n[0]).lat.max < max_lat
            || decode(n[1]).lat.min > min_lat
            || decode(n[2]).long.max < max_lon
            || decode(n[3]).long.min > min_lon;
        if steps > 1 && too_small {
            steps -= 1;
            hash = encode(long, lat, steps).unwrap_or(Bits {
                bits: 0,
                step: steps,
            });
            n = neighbours(hash);
        }
        let area = decode(hash);
        let mut keep = [true; 8];
        if steps >= 2 {
            if area.lat.min < min_lat {
                for i in [1, 7, 6] {
                    keep[i] = false; // south, south-west, south-east
                }
            }
            if area.lat.max > max_lat {
                for i in [0, 4, 5] {
                    keep[i] = false;
                }
            }
            if area.long.min < min_lon {
                for i in [3, 7, 5] {
                    keep[i] = false;
                }
            }
            if area.long.max > max_lon {
                for i in [2, 6, 4] {
                    keep[i] = false;
                }
            }
        }
        let mut out = [None; 9];
        out[0] = Some(hash);
        for i in 0..8 {
            if keep[i] && !n[i].is_zero() {
                out[i + 1] = Some(n[i]);
            }
        }
        out
    }

    /// The distance from the centre in metres when `pos` lies inside the shape.
    pub fn contains(&self, pos: [f64; 2]) -> Option<f64> {
        let [x1, y1] = self.center;
        let [x2, y2] = pos;
        match self.shape {
            Shape::Radius(r) => {
                let d = distance(x1, y1, x2, y2);
                (d <= r * self.conversion).then_some(d)
            }
            Shape::Box { width, height } => {
                let (w, h) = (width * self.conversion, height * self.conversion);
                if lat_distance(y2, y1) > h / 2.0 {
                    return None;
                }
                if distance(x2, y2, x1, y2) > w / 2.0 {
                    return None;
                }
                Some(distance(x1, y1, x2, y2))
            }
        }
    }
}

/// The score range [min, max) holding every point of a cell.
pub fn cell_scores(h: Bits) -> (f64, f64) {
    let min = h.align52();
    let max = Bits {
        bits: h.bits + 1,
        step: h.step,
    }
    .align52();
    (min as f64, max as f64)
}

fn lat_distance(lat1: f64, lat2: f64) -> f64 {
    EARTH_RADIUS_M * (deg_rad(lat2) - deg_rad(lat1)).abs()
}

/// Haversine distance in metres.
pub fn distance(lon1: f64, lat1: f64, lon2: f64, lat2: f64) -> f64 {
    let lon1r = deg_rad(lon1);
    let lon2r = deg_rad(lon2);
    let v = ((lon2r - lon1r) / 2.0).sin();
    if v == 0.0 {
        return lat_distance(lat1, lat2);
    }
    let lat1r = deg_rad(lat1);
    let lat2r = deg_rad(lat2);
    let u = ((lat2r - lat1r) / 2.0).sin();
    let a = u * u + lat1r.cos() * lat2r.cos() * v * v;
    2.0 * EARTH_RADIUS_M * a.sqrt().asin()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn palermo_matches_redis() {
        let s = score_of(13.361389, 38.115556).unwrap();
        assert_eq!(s, 3479099956230698.0);
        assert_eq!(geohash_string(s), "sqc8b49rny0");
        let [long, lat] = position_of(s);
        assert_eq!(format!("{long:.17}"), "13.36138933897018433");
        assert_eq!(format!("{lat:.17}"), "38.11555639549629859");
    }
}
