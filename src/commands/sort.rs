//! SORT and SORT_RO: sorting a list, set or sorted set, by its elements or by the values
//! of keys (or hash fields) that BY and GET patterns name.
//!
//! The patterns name keys that no argument declares, anywhere in the keyspace. When the
//! server has one shard, or the command names no such key, SORT runs on the shard that
//! owns its source. Otherwise `spreads` sends it down the multi-shard path with every
//! shard locked (the keys it reads cannot be known before the source is read), so it
//! stays atomic; the elements, weights and GET values are fetched shard by shard, and a
//! STORE is written on the destination's shard.

use bytes::Bytes;

use super::util::{eq_ci, parse_i64, SYNTAX_ERR};
use super::zsets::parse_c_double;
use crate::cross_handler;
use crate::shard::{ExecCtx, Shard};
use crate::types::list::List;
use crate::types::value::{Value, WRONGTYPE};

/// Reads what a pattern names: a key, and a hash field.
type Lookup<'a> = dyn FnMut(&[u8], Option<&[u8]>) -> Option<Vec<u8>> + 'a;
/// A key a pattern names, with its hash field.
type Named = (Vec<u8>, Option<Vec<u8>>);

const NOT_DOUBLE: &str = "ERR One or more scores can't be converted into double";

struct Spec {
    by: Option<Bytes>,
    /// BY names a constant (no `*`): keep the source's order.
    dont_sort: bool,
    gets: Vec<Bytes>,
    desc: bool,
    alpha: bool,
    limit: (i64, i64),
    store: Option<Bytes>,
}

fn parse(args: &[Bytes]) -> Result<Spec, &'static str> {
    let read_only = eq_ci(&args[0], "sort_ro");
    let mut s = Spec {
        by: None,
        dont_sort: false,
        gets: Vec::new(),
        desc: false,
        alpha: false,
        limit: (0, -1),
        store: None,
    };
    let mut j = 2;
    while j < args.len() {
        let a = &args[j];
        let left = args.len() - j - 1;
        if eq_ci(a, "asc") {
            s.desc = false;
        } else if eq_ci(a, "desc") {
            s.desc = true;
        } else if eq_ci(a, "alpha") {
            s.alpha = true;
        } else if eq_ci(a, "limit") && left >= 2 {
            s.limit = (parse_i64(&args[j + 1])?, parse_i64(&args[j + 2])?);
            j += 2;
        } else if !read_only && eq_ci(a, "store") && left >= 1 {
            s.store = Some(args[j + 1].clone());
            j += 1;
        } else if eq_ci(a, "by") && left >= 1 {
            let p = args[j + 1].clone();
            s.dont_sort = !p.contains(&b'*');
            s.by = Some(p);
            j += 1;
        } else if eq_ci(a, "get") && left >= 1 {
            s.gets.push(args[j + 1].clone());
            j += 1;
        } else {
            return Err(SYNTAX_ERR);
        }
        j += 1;
    }
    Ok(s)
}

/// Whether SORT reads keys named by its patterns (and so may need every shard).
pub fn spreads(args: &[Bytes]) -> bool {
    parse(args)
        .is_ok_and(|s| (!s.dont_sort && s.by.is_some()) || s.gets.iter().any(|g| &g[..] != b"#"))
}

/// Key positions: the source, and STORE's destination.
pub fn sort_keys(args: &[Bytes]) -> Vec<usize> {
    let mut keys = vec![1];
    if eq_ci(&args[0], "sort") {
        let mut j = 2;
        while j + 1 < args.len() {
            if eq_ci(&args[j], "store") {
                keys.truncate(1);
                keys.push(j + 1);
                j += 1;
            } else if eq_ci(&args[j], "limit") {
                j += 2;
            } else if eq_ci(&args[j], "by") || eq_ci(&args[j], "get") {
                j += 1;
            }
            j += 1;
        }
    }
    keys
}

/// What a pattern names for one element: a key, and a hash field when it has `->field`.
fn derive(pattern: &[u8], subst: &[u8]) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let star = pattern.iter().position(|&c| c == b'*')?;
    let after = &pattern[star + 1..];
    let arrow = after.windows(2).position(|w| w == b"->");
    let (post, field) = match arrow {
        Some(a) if a + 2 < after.len() => (&after[..a], Some(after[a + 2..].to_vec())),
        _ => (after, None),
    };
    let mut key = Vec::with_capacity(star + subst.len() + post.len());
    key.extend_from_slice(&pattern[..star]);
    key.extend_from_slice(subst);
    key.extend_from_slice(post);
    Some((key, field))
}

/// The string (or hash field) a derived key holds, read on its own shard.
fn read_value(sh: &mut Shard, db: usize, key: &[u8], field: Option<&[u8]>) -> Option<Vec<u8>> {
    sh.with_ctx(db, |ctx| {
        let e = ctx.get_read(key)?;
        match (&e.value, field) {
            (Value::Str(s), None) => Some(s.to_vec()),
            (Value::Hash(h), Some(f)) => h.get(f).map(<[u8]>::to_vec),
            _ => None,
        }
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    List,
    Set,
    ZSet,
}

/// The source's elements, in its own order (score order for a sorted set).
fn read_source(ctx: &mut ExecCtx, key: &[u8]) -> Result<(Kind, Vec<Bytes>), &'static str> {
    let Some(e) = ctx.get_read(key) else {
        return Ok((Kind::List, Vec::new()));
    };
    Ok(match &e.value {
        Value::List(l) => (Kind::List, l.iter().map(Bytes::copy_from_slice).collect()),
        Value::Set(s) => (
            Kind::Set,
            s.iter().map(|m| Bytes::from(m.to_vec())).collect(),
        ),
        Value::ZSet(z) => {
            let mut v = Vec::with_capacity(z.len());
            z.visit(0, false, |m, _| {
                v.push(Bytes::copy_from_slice(m));
                true
            });
            (Kind::ZSet, v)
        }
        _ => return Err(WRONGTYPE),
    })
}

/// A weight as SORT reads it: `strtod` over the whole string; an empty one is 0.
fn weight(v: &[u8]) -> Option<f64> {
    if v.is_empty() {
        return Some(0.0);
    }
    // `strtod` also sets ERANGE for a result it had to round to a subnormal, and
    // SORT refuses any ERANGE.
    parse_c_double(v).filter(|w| !w.is_subnormal())
}

/// One element being sorted, with what it sorts by.
struct Item {
    ele: Bytes,
    score: f64,
    by: Option<Vec<u8>>,
}

/// Sorts `elements` as Redis does and returns the selected window. `lookup` reads what a
/// pattern names. `in_script`: an unsorted set is sorted anyway, so that a script's
/// effect is the same on replicas.
fn sort_elements(
    spec: &Spec,
    kind: Kind,
    elements: Vec<Bytes>,
    in_script: bool,
    lookup: &mut Lookup,
) -> Result<Vec<Bytes>, &'static str> {
    let (mut dont_sort, mut alpha, mut by) = (spec.dont_sort, spec.alpha, spec.by.clone());
    if dont_sort && kind == Kind::Set && (spec.store.is_some() || in_script) {
        dont_sort = false;
        alpha = true;
        by = None;
    }
    let len = elements.len() as i64;
    let mut start = spec.limit.0.clamp(0, len);
    let count = spec.limit.1.clamp(-1, len);
    let mut end = if count < 0 {
        len - 1
    } else {
        start + count - 1
    };
    if start >= len {
        start = len - 1;
        end = len - 2;
    }
    if end >= len {
        end = len - 1;
    }
    let mut items: Vec<Item> = elements
        .into_iter()
        .map(|ele| Item {
            ele,
            score: 0.0,
            by: None,
        })
        .collect();
    if dont_sort {
        // The source's own order, reversed by DESC for lists and sorted sets.
        if spec.desc && kind != Kind::Set {
            items.reverse();
        }
    } else {
        let mut bad = false;
        for it in &mut items {
            let val = match &by {
                Some(p) => match derive(p, &it.ele) {
                    Some((k, f)) => match lookup(&k, f.as_deref()) {
                        Some(v) => v,
                        None => continue,
                    },
                    None => continue,
                },
                None => it.ele.to_vec(),
            };
            if alpha {
                if by.is_some() {
                    it.by = Some(val);
                }
            } else {
                match weight(&val) {
                    Some(w) => it.score = w,
                    None => bad = true,
                }
            }
        }
        if bad {
            return Err(NOT_DOUBLE);
        }
        let by_pattern = by.is_some();
        let order = |a: &Item, b: &Item| {
            let ord = if !alpha {
                a.score
                    .partial_cmp(&b.score)
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then_with(|| a.ele.cmp(&b.ele))
            } else if by_pattern {
                match (&a.by, &b.by) {
                    (None, None) => std::cmp::Ordering::Equal,
                    (None, _) => std::cmp::Ordering::Less,
                    (_, None) => std::cmp::Ordering::Greater,
                    (Some(x), Some(y)) => x.cmp(y),
                }
            } else {
                a.ele.cmp(&b.ele)
            };
            if spec.desc {
                ord.reverse()
            } else {
                ord
            }
        };
        // As Redis: its partial quicksort for a window of a BY sort, else a full sort
        // (stable, as glibc's qsort is).
        if by_pattern && (start != 0 || end != len - 1) && end >= start {
            super::util::pqsort(&mut items, &order, start as usize, end as usize);
        } else {
            items.sort_by(order);
        }
    }
    if end < start {
        return Ok(Vec::new());
    }
    let window = &items[start as usize..=end as usize];
    Ok(window.iter().map(|i| i.ele.clone()).collect())
}

/// GET's values for each selected element, in order (None: nothing there).
fn get_values(spec: &Spec, selected: &[Bytes], lookup: &mut Lookup) -> Vec<Option<Bytes>> {
    if spec.gets.is_empty() {
        return selected.iter().cloned().map(Some).collect();
    }
    let mut out = Vec::with_capacity(selected.len() * spec.gets.len());
    for ele in selected {
        for g in &spec.gets {
            if &g[..] == b"#" {
                out.push(Some(ele.clone()));
                continue;
            }
            out.push(
                derive(g, ele)
                    .and_then(|(k, f)| lookup(&k, f.as_deref()))
                    .map(Bytes::from),
            );
        }
    }
    out
}

/// Writes SORT ... STORE's result: a list, or nothing (an empty result deletes `dst`).
fn store(ctx: &mut ExecCtx, dst: &[u8], values: Vec<Option<Bytes>>) -> i64 {
    if values.is_empty() {
        if ctx.delete(dst) {
            ctx.notify(b'g', "del", dst);
        }
        return 0;
    }
    let mut list = List::new();
    for v in &values {
        list.push_back(v.as_deref().unwrap_or(b""));
    }
    ctx.set(dst, Value::List(Box::new(list)), 0);
    ctx.notify(b'l', "sortstore", dst);
    values.len() as i64
}

fn reply(out: &mut crate::protocol::reply::Reply, values: &[Option<Bytes>]) {
    out.array(values.len());
    for v in values {
        match v {
            Some(b) => out.bulk(b),
            None => out.null(),
        }
    }
}

/// SORT on the shard that owns its keys; patterns must name keys here too (`spreads`
/// sends the others down the multi-shard path; inside scripts a key elsewhere reads as
/// missing, and the reply says so).
pub fn sort(ctx: &mut ExecCtx, args: &[Bytes]) {
    let spec = match parse(args) {
        Ok(s) => s,
        Err(e) => return ctx.out.error(e),
    };
    let (kind, elements) = match read_source(ctx, &args[1]) {
        Ok(r) => r,
        Err(e) => return ctx.out.error(e),
    };
    let in_script = crate::scripting::run::in_script();
    let here = ctx.shard.shared.placement.shard_of(&args[1]);
    let db = ctx.db;
    let mut elsewhere = false;
    let shard = &mut *ctx.shard;
    let mut lookup = |k: &[u8], f: Option<&[u8]>| -> Option<Vec<u8>> {
        if shard.shared.placement.shard_of(k) != here {
            elsewhere = true;
            return None;
        }
        read_value(shard, db, k, f)
    };
    let result = sort_elements(&spec, kind, elements, in_script, &mut lookup)
        .map(|sel| get_values(&spec, &sel, &mut lookup));
    if elsewhere {
        return ctx.out.error(
            "ERR Kite: SORT's BY or GET pattern names a key on another shard; inside a script, give the keys a common {hashtag}",
        );
    }
    match result {
        Err(e) => ctx.out.error(e),
        Ok(values) => match &spec.store {
            None => reply(ctx.out, &values),
            Some(dst) => {
                let n = store(ctx, dst, values);
                ctx.out.int(n);
            }
        },
    }
}

cross_handler!(sort_cross, |sess, args, tx| {
    let spec = match parse(&args) {
        Ok(s) => s,
        Err(e) => return sess.out.error(e),
    };
    let db = sess.db;
    let src = args[1].clone();
    let read = tx
        .run(sess.worker.shard_of(&src), move |sh| {
            sh.with_ctx(db, |ctx| read_source(ctx, &src))
        })
        .await;
    let (kind, elements) = match read {
        Ok(r) => r,
        Err(e) => return sess.out.error(e),
    };
    // Every key a pattern names, read where it lives: gather them first, then look
    // them up from what came back.
    let mut wanted: Vec<Named> = Vec::new();
    let mut patterns: Vec<&Bytes> = spec.gets.iter().filter(|g| &g[..] != b"#").collect();
    if let Some(b) = spec.by.as_ref().filter(|_| !spec.dont_sort) {
        patterns.push(b);
    }
    for e in &elements {
        for p in &patterns {
            if let Some(d) = derive(p, e) {
                wanted.push(d);
            }
        }
    }
    let mut by_shard: Vec<(usize, Vec<Named>)> = Vec::new();
    for w in wanted {
        let s = sess.worker.shard_of(&w.0);
        match by_shard.iter_mut().find(|g| g.0 == s) {
            Some(g) => g.1.push(w),
            None => by_shard.push((s, vec![w])),
        }
    }
    let mut values: std::collections::HashMap<Named, Option<Vec<u8>>> =
        std::collections::HashMap::new();
    for (shard, keys) in by_shard {
        let got = tx
            .run(shard, move |sh| {
                keys.into_iter()
                    .map(|(k, f)| {
                        let v = read_value(sh, db, &k, f.as_deref());
                        ((k, f), v)
                    })
                    .collect::<Vec<_>>()
            })
            .await;
        values.extend(got);
    }
    let mut lookup = |k: &[u8], f: Option<&[u8]>| -> Option<Vec<u8>> {
        values
            .get(&(k.to_vec(), f.map(<[u8]>::to_vec)))
            .cloned()
            .flatten()
    };
    let result = sort_elements(&spec, kind, elements, false, &mut lookup)
        .map(|sel| get_values(&spec, &sel, &mut lookup));
    let values = match result {
        Ok(v) => v,
        Err(e) => return sess.out.error(e),
    };
    match spec.store.clone() {
        None => reply(&mut sess.out, &values),
        Some(dst) => {
            let n = tx
                .run(sess.worker.shard_of(&dst), move |sh| {
                    sh.with_ctx(db, |ctx| store(ctx, &dst, values))
                })
                .await;
            sess.out.int(n);
        }
    }
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_name_keys_and_fields() {
        assert_eq!(derive(b"w_*", b"1"), Some((b"w_1".to_vec(), None)));
        assert_eq!(
            derive(b"h_*->f", b"1"),
            Some((b"h_1".to_vec(), Some(b"f".to_vec())))
        );
        assert_eq!(derive(b"h_*->", b"1"), Some((b"h_1->".to_vec(), None)));
        assert_eq!(derive(b"nostar", b"1"), None);
    }
}
