//! The geo family: GEOADD, GEODIST, GEOHASH, GEOPOS, GEOSEARCH, GEOSEARCHSTORE and the
//! older GEORADIUS forms, on sorted sets whose scores are Redis's 52-bit geohashes
//! (`types::geohash`).
//!
//! A search runs on the source's shard; a STORE whose destination lives on another shard
//! writes there afterwards, under the transaction holding both keys.

use bytes::Bytes;

use super::util::{eq_ci, parse_i64, SYNTAX_ERR};
use crate::cross_handler;
use crate::protocol::reply::Reply;
use crate::shard::ExecCtx;
use crate::types::geohash::{self, Search, Shape};
use crate::types::value::{Value, WRONGTYPE};
use crate::types::zset::{cmp_entry, ZSet};

/// A point found by a search.
struct Point {
    member: Box<[u8]>,
    score: f64,
    pos: [f64; 2],
    dist: f64,
}

/// The sorted set at `key` for reading: Ok(None) when missing.
fn read_zset<'a>(ctx: &'a mut ExecCtx, key: &[u8]) -> Result<Option<&'a ZSet>, &'static str> {
    match ctx.get_read(key) {
        None => Ok(None),
        Some(e) => match &e.value {
            Value::ZSet(z) => Ok(Some(z)),
            _ => Err(WRONGTYPE),
        },
    }
}

/// A double as Redis's getDoubleFromObject reads one (`strtod` over the whole string).
fn parse_double(arg: &[u8], msg: &'static str) -> Result<f64, String> {
    super::zsets::parse_score(arg).ok_or_else(|| {
        if msg.is_empty() {
            super::util::NOT_FLOAT.to_string()
        } else {
            format!("ERR {msg}")
        }
    })
}

fn long_lat(args: &[Bytes]) -> Result<[f64; 2], String> {
    let long = parse_double(&args[0], "")?;
    let lat = parse_double(&args[1], "")?;
    if !(geohash::LONG_MIN..=geohash::LONG_MAX).contains(&long)
        || !(geohash::LAT_MIN..=geohash::LAT_MAX).contains(&lat)
    {
        return Err(format!(
            "ERR invalid longitude,latitude pair {long:.6},{lat:.6}"
        ));
    }
    Ok([long, lat])
}

fn unit(arg: &[u8]) -> Result<f64, String> {
    for (name, metres) in [("m", 1.0), ("km", 1000.0), ("ft", 0.3048), ("mi", 1609.34)] {
        if eq_ci(arg, name) {
            return Ok(metres);
        }
    }
    Err("ERR unsupported unit provided. please use M, KM, FT, MI".into())
}

/// A distance printed with four decimals, rounded as `llrint` rounds (half to even).
fn fixed4(d: f64) -> String {
    if d == 0.0 {
        return "0.0000".into();
    }
    let v = (d * 10000.0).round_ties_even() as i64;
    let sign = if v < 0 { "-" } else { "" };
    let a = v.unsigned_abs();
    format!("{sign}{}.{:04}", a / 10000, a % 10000)
}

/// A coordinate as Redis prints it: 17 decimals, trailing zeros dropped.
fn human(v: f64) -> String {
    let mut s = format!("{v:.17}");
    if s.contains('.') {
        while s.ends_with('0') {
            s.pop();
        }
        if s.ends_with('.') {
            s.pop();
        }
    }
    s
}

fn reply_coord(out: &mut Reply, v: f64) {
    let text = human(v);
    if out.resp3 {
        out.raw(b",");
        out.raw(text.as_bytes());
        out.raw(b"\r\n");
    } else {
        out.bulk(text.as_bytes());
    }
}

// ---------------------------------------------------------------------------------------
// GEOADD, GEOPOS, GEOHASH, GEODIST
// ---------------------------------------------------------------------------------------

/// GEOADD key [NX|XX] [CH] long lat member ...: a ZADD of the encoded positions.
pub fn geoadd(ctx: &mut ExecCtx, args: &[Bytes]) {
    let mut first = 2;
    let (mut nx, mut xx) = (false, false);
    while first < args.len() {
        let a = &args[first];
        if eq_ci(a, "nx") {
            nx = true;
        } else if eq_ci(a, "xx") {
            xx = true;
        } else if !eq_ci(a, "ch") {
            break;
        }
        first += 1;
    }
    if !(args.len() - first).is_multiple_of(3) || (nx && xx) {
        return ctx.out.error(SYNTAX_ERR);
    }
    let mut zadd: Vec<Bytes> = Vec::with_capacity(first + (args.len() - first) / 3 * 2);
    zadd.push(Bytes::from_static(b"zadd"));
    zadd.extend_from_slice(&args[1..first]);
    for triple in args[first..].chunks(3) {
        let pos = match long_lat(triple) {
            Ok(p) => p,
            Err(e) => return ctx.out.error(&e),
        };
        let bits = geohash::encode(pos[0], pos[1], geohash::STEP_MAX)
            .map(|b| b.align52())
            .unwrap_or(0);
        zadd.push(Bytes::from(bits.to_string()));
        zadd.push(triple[2].clone());
    }
    super::zsets::zadd(ctx, &zadd);
}

pub fn geopos(ctx: &mut ExecCtx, args: &[Bytes]) {
    let positions: Vec<Option<[f64; 2]>> = match read_zset(ctx, &args[1]) {
        Err(e) => return ctx.out.error(e),
        Ok(z) => args[2..]
            .iter()
            .map(|m| z.and_then(|z| z.score(m)).map(geohash::position_of))
            .collect(),
    };
    ctx.out.array(positions.len());
    for p in positions {
        match p {
            None => ctx.out.null_array(),
            Some([long, lat]) => {
                ctx.out.array(2);
                reply_coord(ctx.out, long);
                reply_coord(ctx.out, lat);
            }
        }
    }
}

pub fn geohash(ctx: &mut ExecCtx, args: &[Bytes]) {
    let hashes: Vec<Option<String>> = match read_zset(ctx, &args[1]) {
        Err(e) => return ctx.out.error(e),
        Ok(z) => args[2..]
            .iter()
            .map(|m| z.and_then(|z| z.score(m)).map(geohash::geohash_string))
            .collect(),
    };
    ctx.out.array(hashes.len());
    for h in hashes {
        match h {
            None => ctx.out.null(),
            Some(s) => ctx.out.bulk(s.as_bytes()),
        }
    }
}

pub fn geodist(ctx: &mut ExecCtx, args: &[Bytes]) {
    let to_m = match args.len() {
        5 => match unit(&args[4]) {
            Ok(u) => u,
            Err(e) => return ctx.out.error(&e),
        },
        4 => 1.0,
        _ => return ctx.out.error(SYNTAX_ERR),
    };
    let scores = match read_zset(ctx, &args[1]) {
        Err(e) => return ctx.out.error(e),
        Ok(None) => return ctx.out.null(),
        Ok(Some(z)) => (z.score(&args[2]), z.score(&args[3])),
    };
    match scores {
        (Some(a), Some(b)) => {
            let [x1, y1] = geohash::position_of(a);
            let [x2, y2] = geohash::position_of(b);
            let d = geohash::distance(x1, y1, x2, y2) / to_m;
            ctx.out.bulk(fixed4(d).as_bytes());
        }
        _ => ctx.out.null(),
    }
}

// ---------------------------------------------------------------------------------------
// Searches
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Radius,
    RadiusRo,
    ByMember,
    ByMemberRo,
    Search,
    SearchStore,
}

impl Variant {
    fn src_index(self) -> usize {
        if self == Variant::SearchStore {
            2
        } else {
            1
        }
    }

    fn is_search(self) -> bool {
        matches!(self, Variant::Search | Variant::SearchStore)
    }

    fn no_store(self) -> bool {
        matches!(self, Variant::RadiusRo | Variant::ByMemberRo)
    }
}

#[derive(Default)]
struct Options {
    with_dist: bool,
    with_hash: bool,
    with_coord: bool,
    store: Option<Bytes>,
    store_dist: bool,
    count: usize,
}

/// What a search produced, before it is answered or stored.
enum Found {
    /// The source key does not exist.
    NoSource(Options),
    Points(Vec<Point>, Options),
}

/// Parses the command and runs the search on the source's shard, checking arguments in
/// Redis's order (some errors depend on what the source holds).
fn run_search(ctx: &mut ExecCtx, args: &[Bytes], v: Variant) -> Result<Found, String> {
    let src = &args[v.src_index()];
    let zset = read_zset(ctx, src)?;
    let member_pos = |z: &ZSet, m: &[u8]| -> Result<[f64; 2], String> {
        z.score(m)
            .map(geohash::position_of)
            .ok_or_else(|| "ERR could not decode requested zset member".to_string())
    };
    let mut center = [0.0; 2];
    let mut shape = None;
    let mut conversion = 1.0;
    let base = match v {
        Variant::Radius | Variant::RadiusRo => {
            center = long_lat(&args[2..4])?;
            let (r, c) = distance_arg(&args[4..6])?;
            shape = Some(Shape::Radius(r));
            conversion = c;
            6
        }
        Variant::ByMember | Variant::ByMemberRo => {
            if let Some(z) = zset {
                center = member_pos(z, &args[2])?;
                let (r, c) = distance_arg(&args[3..5])?;
                shape = Some(Shape::Radius(r));
                conversion = c;
            }
            5
        }
        Variant::Search => 2,
        Variant::SearchStore => 3,
    };
    let mut o = Options::default();
    if v == Variant::SearchStore {
        o.store = Some(args[1].clone());
    }
    let (mut from_member, mut from_loc, mut by_radius, mut by_box) = (false, false, false, false);
    let (mut any, mut sort) = (false, 0i8);
    let rest = &args[base..];
    let mut i = 0;
    while i < rest.len() {
        let a = &rest[i];
        let left = rest.len() - i - 1;
        if eq_ci(a, "withdist") {
            o.with_dist = true;
        } else if eq_ci(a, "withhash") {
            o.with_hash = true;
        } else if eq_ci(a, "withcoord") {
            o.with_coord = true;
        } else if eq_ci(a, "any") {
            any = true;
        } else if eq_ci(a, "asc") {
            sort = 1;
        } else if eq_ci(a, "desc") {
            sort = -1;
        } else if eq_ci(a, "count") && left >= 1 {
            let n = parse_i64(&rest[i + 1]).map_err(str::to_string)?;
            if n <= 0 {
                return Err("ERR COUNT must be > 0".into());
            }
            o.count = n as usize;
            i += 1;
        } else if (eq_ci(a, "store") || eq_ci(a, "storedist"))
            && left >= 1
            && !v.no_store()
            && !v.is_search()
        {
            o.store = Some(rest[i + 1].clone());
            o.store_dist = eq_ci(a, "storedist");
            i += 1;
        } else if eq_ci(a, "storedist") && v == Variant::SearchStore {
            o.store_dist = true;
        } else if eq_ci(a, "frommember") && left >= 1 && v.is_search() && !from_loc {
            if let Some(z) = zset {
                center = member_pos(z, &rest[i + 1])?;
            }
            from_member = true;
            i += 1;
        } else if eq_ci(a, "fromlonlat") && left >= 2 && v.is_search() && !from_member {
            center = long_lat(&rest[i + 1..i + 3])?;
            from_loc = true;
            i += 2;
        } else if eq_ci(a, "byradius") && left >= 2 && v.is_search() && !by_box {
            let (r, c) = distance_arg(&rest[i + 1..i + 3])?;
            shape = Some(Shape::Radius(r));
            conversion = c;
            by_radius = true;
            i += 2;
        } else if eq_ci(a, "bybox") && left >= 3 && v.is_search() && !by_radius {
            let w = parse_double(&rest[i + 1], "need numeric width")?;
            let h = parse_double(&rest[i + 2], "need numeric height")?;
            if h < 0.0 || w < 0.0 {
                return Err("ERR height or width cannot be negative".into());
            }
            conversion = unit(&rest[i + 3])?;
            shape = Some(Shape::Box {
                width: w,
                height: h,
            });
            by_box = true;
            i += 3;
        } else {
            return Err(SYNTAX_ERR.into());
        }
        i += 1;
    }
    if o.store.is_some() && (o.with_dist || o.with_hash || o.with_coord) {
        let what = if v == Variant::SearchStore {
            "GEOSEARCHSTORE"
        } else {
            "STORE option in GEORADIUS"
        };
        return Err(format!(
            "ERR {what} is not compatible with WITHDIST, WITHHASH and WITHCOORD options"
        ));
    }
    let name = String::from_utf8_lossy(&args[0]).into_owned();
    if v.is_search() && !(from_member || from_loc) {
        return Err(format!(
            "ERR exactly one of FROMMEMBER or FROMLONLAT can be specified for {name}"
        ));
    }
    if v.is_search() && !(by_radius || by_box) {
        return Err(format!(
            "ERR exactly one of BYRADIUS and BYBOX can be specified for {name}"
        ));
    }
    if any && o.count == 0 {
        return Err("ERR the ANY argument requires COUNT argument".into());
    }
    let (Some(z), Some(shape)) = (zset, shape) else {
        return Ok(Found::NoSource(o));
    };
    // COUNT without an order means the nearest ones.
    if o.count != 0 && sort == 0 && !any {
        sort = 1;
    }
    let search = Search {
        center,
        shape,
        conversion,
    };
    let limit = if any { o.count } else { 0 };
    let mut points = collect(z, &search, limit);
    if sort != 0 {
        let by_dist = move |a: &Point, b: &Point| {
            let ord = a
                .dist
                .partial_cmp(&b.dist)
                .unwrap_or(std::cmp::Ordering::Equal);
            if sort > 0 {
                ord
            } else {
                ord.reverse()
            }
        };
        // As Redis: a full sort (stable, as glibc's qsort is) when all are returned,
        // else its partial quicksort, whose order of equal distances differs.
        if o.count == 0 || points.len() <= o.count {
            points.sort_by(by_dist);
        } else {
            let last = o.count - 1;
            super::util::pqsort(&mut points, &by_dist, 0, last);
        }
    }
    if o.count != 0 {
        points.truncate(o.count);
    }
    for p in &mut points {
        p.dist /= conversion;
    }
    Ok(Found::Points(points, o))
}

fn distance_arg(args: &[Bytes]) -> Result<(f64, f64), String> {
    let d = parse_double(&args[0], "need numeric radius")?;
    if d < 0.0 {
        return Err("ERR radius cannot be negative".into());
    }
    Ok((d, unit(&args[1])?))
}

/// Walks the cells around the centre in Redis's order, collecting points in the shape;
/// stops once `limit` (when not 0) points are found.
fn collect(z: &ZSet, search: &Search, limit: usize) -> Vec<Point> {
    let mut found = Vec::new();
    let mut last: Option<geohash::Bits> = None;
    for cell in search.cells().into_iter().flatten() {
        // Huge radii can make neighbours coincide: scan each cell once.
        if last == Some(cell) {
            continue;
        }
        if limit != 0 && found.len() >= limit {
            break;
        }
        let (min, max) = geohash::cell_scores(cell);
        if let Some(start) = z.first_where_score(|s| s >= min) {
            z.visit(start, false, |m, s| {
                if s >= max {
                    return false;
                }
                let pos = geohash::position_of(s);
                if let Some(dist) = search.contains(pos) {
                    found.push(Point {
                        member: m.into(),
                        score: s,
                        pos,
                        dist,
                    });
                }
                !(limit != 0 && found.len() >= limit)
            });
        }
        last = Some(cell);
    }
    found
}

fn reply_points(out: &mut Reply, points: &[Point], o: &Options) {
    let extra = o.with_dist as usize + o.with_hash as usize + o.with_coord as usize;
    out.array(points.len());
    for p in points {
        if extra > 0 {
            out.array(extra + 1);
        }
        out.bulk(&p.member);
        if o.with_dist {
            out.bulk(fixed4(p.dist).as_bytes());
        }
        if o.with_hash {
            out.int(p.score as i64);
        }
        if o.with_coord {
            out.array(2);
            reply_coord(out, p.pos[0]);
            reply_coord(out, p.pos[1]);
        }
    }
}

/// Stores a search's result at `dst` (a sorted set, or nothing: an empty result deletes
/// it) and returns how many were stored.
fn store_points(
    ctx: &mut ExecCtx,
    dst: &[u8],
    points: Vec<Point>,
    dist: bool,
    event: &'static str,
) -> i64 {
    if points.is_empty() {
        if ctx.delete(dst) {
            ctx.notify(b'g', "del", dst);
        }
        return 0;
    }
    let n = points.len() as i64;
    let mut entries: Vec<(f64, Box<[u8]>)> = points
        .into_iter()
        .map(|p| (if dist { p.dist } else { p.score }, p.member))
        .collect();
    entries.sort_by(|a, b| cmp_entry(a.0, &a.1, b.0, &b.1));
    ctx.set(dst, Value::ZSet(Box::new(ZSet::from_sorted(entries))), 0);
    ctx.notify(b'z', event, dst);
    n
}

fn search_here(ctx: &mut ExecCtx, args: &[Bytes], v: Variant) {
    let event = if v.is_search() {
        "geosearchstore"
    } else {
        "georadiusstore"
    };
    match run_search(ctx, args, v) {
        Err(e) => ctx.out.error(&e),
        Ok(Found::NoSource(o)) => match o.store {
            Some(dst) => {
                if ctx.delete(&dst) {
                    ctx.notify(b'g', "del", &dst);
                }
                ctx.out.int(0);
            }
            None => ctx.out.array(0),
        },
        Ok(Found::Points(points, o)) => match o.store.clone() {
            None => reply_points(ctx.out, &points, &o),
            Some(dst) => {
                let n = store_points(ctx, &dst, points, o.store_dist, event);
                ctx.out.int(n);
            }
        },
    }
}

async fn search_cross(
    sess: &mut crate::server::session::Session,
    args: Vec<Bytes>,
    tx: &crate::shard::tx::Tx,
    v: Variant,
) {
    let db = sess.db;
    let src = args[v.src_index()].clone();
    let resp3 = sess.out.resp3;
    let a = args.clone();
    // The search runs (and answers, when nothing is stored) on the source's shard.
    let (reply, store) = tx
        .run(sess.worker.shard_of(&src), move |sh| {
            let mut out = Reply::new(resp3);
            let r = {
                let mut ctx = sh.ctx(db, &mut out);
                match run_search(&mut ctx, &a, v) {
                    Err(e) => {
                        ctx.out.error(&e);
                        None
                    }
                    Ok(Found::NoSource(o)) => match o.store {
                        Some(dst) => Some((dst, Vec::new(), false)),
                        None => {
                            ctx.out.array(0);
                            None
                        }
                    },
                    Ok(Found::Points(points, o)) => match o.store.clone() {
                        None => {
                            reply_points(ctx.out, &points, &o);
                            None
                        }
                        Some(dst) => Some((dst, points, o.store_dist)),
                    },
                }
            };
            (out.buf.to_vec(), r)
        })
        .await;
    let Some((dst, points, dist)) = store else {
        return sess.out.raw(&reply);
    };
    let event = if v.is_search() {
        "geosearchstore"
    } else {
        "georadiusstore"
    };
    let n = tx
        .run(sess.worker.shard_of(&dst), move |sh| {
            sh.with_ctx(db, |ctx| store_points(ctx, &dst, points, dist, event))
        })
        .await;
    sess.out.int(n);
}

pub fn georadius(ctx: &mut ExecCtx, args: &[Bytes]) {
    search_here(ctx, args, Variant::Radius);
}

pub fn georadius_ro(ctx: &mut ExecCtx, args: &[Bytes]) {
    search_here(ctx, args, Variant::RadiusRo);
}

pub fn georadiusbymember(ctx: &mut ExecCtx, args: &[Bytes]) {
    search_here(ctx, args, Variant::ByMember);
}

pub fn georadiusbymember_ro(ctx: &mut ExecCtx, args: &[Bytes]) {
    search_here(ctx, args, Variant::ByMemberRo);
}

pub fn geosearch(ctx: &mut ExecCtx, args: &[Bytes]) {
    search_here(ctx, args, Variant::Search);
}

pub fn geosearchstore(ctx: &mut ExecCtx, args: &[Bytes]) {
    search_here(ctx, args, Variant::SearchStore);
}

cross_handler!(georadius_cross, |sess, args, tx| {
    search_cross(sess, args, tx, Variant::Radius).await;
});

cross_handler!(georadiusbymember_cross, |sess, args, tx| {
    search_cross(sess, args, tx, Variant::ByMember).await;
});

cross_handler!(geosearchstore_cross, |sess, args, tx| {
    search_cross(sess, args, tx, Variant::SearchStore).await;
});

/// Key positions of GEORADIUS / GEORADIUSBYMEMBER: the source, and a STORE or
/// STOREDIST destination.
pub fn georadius_keys(args: &[Bytes]) -> Vec<usize> {
    let mut store = None;
    let mut i = 2;
    while i + 1 < args.len() {
        if eq_ci(&args[i], "store") || eq_ci(&args[i], "storedist") {
            // The parser keeps the last one.
            store = Some(i + 1);
            i += 1;
        }
        i += 1;
    }
    std::iter::once(1).chain(store).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_print_like_redis() {
        assert_eq!(fixed4(166274.15156960033), "166274.1516");
        assert_eq!(fixed4(0.0), "0.0000");
        assert_eq!(fixed4(0.00005), "0.0000");
        assert_eq!(fixed4(190.44242984775784), "190.4424");
    }

    #[test]
    fn coordinates_print_like_redis() {
        assert_eq!(human(13.361389338970184), "13.36138933897018433");
        assert_eq!(human(-180.0), "-180");
    }
}
