//! Kite's values as RDB records.
//!
//! Records follow what Redis 7 writes for the same data: lists as quicklist 2 nodes of
//! packed listpacks (about 8 KiB each), small hashes and sorted sets as one listpack,
//! small integer sets as an intset, larger ones in their plain forms (one record per
//! element), streams as listpack nodes. The listpacks are the blobs LZF compresses well
//! (queued jobs look alike); they go through `Sink::put_blob`, so a snapshot can leave
//! their compression to its writer thread instead of the shard's.

use super::listpack;
use super::{ty, STREAM_ITEM_SAMEFIELDS};
use crate::types::stream::{Stream, StreamId};
use crate::types::value::{parse_canonical_i64, StrValue, Value};

/// Where records go: a buffer, or a snapshot's chunked sink.
pub trait Sink {
    fn put(&mut self, bytes: &[u8]);

    fn put_u8(&mut self, b: u8) {
        self.put(&[b]);
    }

    /// A string that is an encoded blob (a listpack or an intset): written as
    /// `put_string` would, but a sink may defer its compression.
    fn put_blob(&mut self, blob: Vec<u8>, opts: &Options) {
        put_string(self, &blob, opts);
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Counts what would be written, keeping none of it: DEBUG OBJECT's `serializedlength`
/// (Redis's `rdbSavedObjectLen`) without a copy of the value.
#[derive(Default)]
pub struct Counted(pub usize);

impl Sink for Counted {
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// 10 or 11: decides the stream record type.
    pub version: u16,
    /// LZF-compress strings longer than 20 bytes when that saves space (rdbcompression).
    pub compress: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            version: super::VERSION_DEFAULT,
            compress: true,
        }
    }
}

pub fn put_len<S: Sink + ?Sized>(out: &mut S, len: u64) {
    if len < 1 << 6 {
        out.put_u8(len as u8);
    } else if len < 1 << 14 {
        out.put(&[0x40 | (len >> 8) as u8, len as u8]);
    } else if len <= u32::MAX as u64 {
        out.put_u8(0x80);
        out.put(&(len as u32).to_be_bytes());
    } else {
        out.put_u8(0x81);
        out.put(&len.to_be_bytes());
    }
}

/// An integer in the smallest of Redis's integer string encodings; false when it needs
/// more than 32 bits (it is then written as text).
fn put_int_encoded<S: Sink + ?Sized>(out: &mut S, v: i64) -> bool {
    if let Ok(b) = i8::try_from(v) {
        out.put(&[0xC0, b as u8]);
    } else if let Ok(h) = i16::try_from(v) {
        out.put_u8(0xC1);
        out.put(&h.to_le_bytes());
    } else if let Ok(w) = i32::try_from(v) {
        out.put_u8(0xC2);
        out.put(&w.to_le_bytes());
    } else {
        return false;
    }
    true
}

/// A string as Redis writes one: canonical integers of up to 32 bits as integers, long
/// ones LZF-compressed when that pays, the rest as length and bytes.
pub fn put_string<S: Sink + ?Sized>(out: &mut S, b: &[u8], opts: &Options) {
    if b.len() <= 11 {
        if let Some(v) = parse_canonical_i64(b) {
            if put_int_encoded(out, v) {
                return;
            }
        }
    }
    put_maybe_compressed(out, b, opts);
}

/// Length and bytes, LZF-compressed when `rdbcompression` is on, the string is over 20
/// bytes and compression saves at least 4 of them (Redis's rule).
pub fn put_maybe_compressed<S: Sink + ?Sized>(out: &mut S, b: &[u8], opts: &Options) {
    if opts.compress && b.len() > 20 {
        if let Some(packed) = super::lzf::compress(b) {
            out.put_u8(0xC3);
            put_len(out, packed.len() as u64);
            put_len(out, b.len() as u64);
            out.put(&packed);
            return;
        }
    }
    put_raw_string(out, b);
}

/// A string written as length and bytes, never encoded (AUX values Redis reads raw).
pub fn put_raw_string<S: Sink + ?Sized>(out: &mut S, b: &[u8]) {
    put_len(out, b.len() as u64);
    out.put(b);
}

fn put_str_value(out: &mut (impl Sink + ?Sized), s: &StrValue, opts: &Options) {
    match s {
        StrValue::Int(i) if i32::try_from(*i).is_ok() => {
            put_int_encoded(out, *i);
        }
        _ => {
            let mut scratch = [0u8; 20];
            put_string(out, s.as_bytes(&mut scratch), opts);
        }
    }
}

pub fn put_double_binary(out: &mut (impl Sink + ?Sized), v: f64) {
    out.put(&v.to_le_bytes());
}

pub fn put_ms_time(out: &mut (impl Sink + ?Sized), ms: i64) {
    out.put(&ms.to_le_bytes());
}

/// The type byte a value is written with.
pub fn type_of(v: &Value, opts: &Options) -> u8 {
    match v {
        Value::Str(_) => ty::STRING,
        Value::List(_) => ty::LIST_QUICKLIST_2,
        Value::Set(s) if s.is_intset() => ty::SET_INTSET,
        Value::Set(s) if opts.version >= 11 && s.encoding() == "listpack" => ty::SET_LISTPACK,
        Value::Set(_) => ty::SET,
        Value::ZSet(z) if z.encoding() == "listpack" => ty::ZSET_LISTPACK,
        Value::ZSet(_) => ty::ZSET_2,
        Value::Hash(h) if h.encoding() == "listpack" => ty::HASH_LISTPACK,
        Value::Hash(_) => ty::HASH,
        Value::Stream(_) => {
            if opts.version >= 11 {
                ty::STREAM_LISTPACKS_3
            } else {
                ty::STREAM_LISTPACKS_2
            }
        }
    }
}

/// A list is written as quicklist 2 nodes, one packed listpack per chunk of Kite's list
/// (about 8 KiB, like Redis's default list-max-listpack-size -2): the node count is known
/// without a pass over the elements, and a snapshot can write a list node by node.
fn put_list(out: &mut (impl Sink + ?Sized), l: &crate::types::list::List, opts: &Options) {
    put_len(out, l.node_count() as u64);
    for (_, node) in l.nodes_from(0) {
        put_list_node(out, node, opts);
    }
}

pub fn put_list_node<'a>(
    out: &mut (impl Sink + ?Sized),
    items: impl Iterator<Item = &'a [u8]>,
    opts: &Options,
) {
    let mut lp = listpack::Writer::new();
    for item in items {
        lp.push_bytes(item);
    }
    put_len(out, super::QUICKLIST_NODE_PACKED);
    out.put_blob(lp.finish(), opts);
}

/// An intset blob: width, count, then the members ascending, little-endian.
fn intset_blob(members: &mut [i64]) -> Vec<u8> {
    members.sort_unstable();
    let width: usize = if members.iter().all(|&m| i16::try_from(m).is_ok()) {
        2
    } else if members.iter().all(|&m| i32::try_from(m).is_ok()) {
        4
    } else {
        8
    };
    let mut out = Vec::with_capacity(8 + width * members.len());
    out.extend_from_slice(&(width as u32).to_le_bytes());
    out.extend_from_slice(&(members.len() as u32).to_le_bytes());
    for m in members.iter() {
        out.extend_from_slice(&m.to_le_bytes()[..width]);
    }
    out
}

/// The value's body, after its type byte.
pub fn put_value(out: &mut (impl Sink + ?Sized), v: &Value, opts: &Options) {
    match (v, type_of(v, opts)) {
        (Value::Str(s), _) => put_str_value(out, s, opts),
        (Value::List(l), _) => put_list(out, l, opts),
        (Value::Set(s), ty::SET_INTSET) => {
            let mut members: Vec<i64> = s
                .iter()
                .map(|m| {
                    let mut scratch = [0u8; 20];
                    parse_canonical_i64(m.bytes(&mut scratch)).expect("intset member")
                })
                .collect();
            out.put_blob(intset_blob(&mut members), opts);
        }
        (Value::Set(s), ty::SET_LISTPACK) => {
            let mut lp = listpack::Writer::new();
            let mut scratch = [0u8; 20];
            for m in s.iter() {
                lp.push_bytes(m.bytes(&mut scratch));
            }
            out.put_blob(lp.finish(), opts);
        }
        (Value::Set(s), _) => {
            put_len(out, s.len() as u64);
            let mut scratch = [0u8; 20];
            for m in s.iter() {
                put_string(out, m.bytes(&mut scratch), opts);
            }
        }
        (Value::ZSet(z), ty::ZSET_LISTPACK) => {
            let mut lp = listpack::Writer::new();
            z.visit(0, false, |member, score| {
                lp.push_bytes(member);
                push_score(&mut lp, score);
                true
            });
            out.put_blob(lp.finish(), opts);
        }
        (Value::ZSet(z), _) => {
            put_len(out, z.len() as u64);
            // Largest first, as Redis's saver does: its loader then inserts at the head.
            z.visit(z.len().saturating_sub(1), true, |member, score| {
                put_string(out, member, opts);
                put_double_binary(out, score);
                true
            });
        }
        (Value::Hash(h), ty::HASH_LISTPACK) => {
            let mut lp = listpack::Writer::new();
            for (f, val) in h.iter() {
                lp.push_bytes(f);
                lp.push_bytes(val);
            }
            out.put_blob(lp.finish(), opts);
        }
        (Value::Hash(h), _) => {
            put_len(out, h.len() as u64);
            for (f, val) in h.iter() {
                put_string(out, f, opts);
                put_string(out, val, opts);
            }
        }
        (Value::Stream(s), _) => put_stream(out, s, opts),
    }
}

/// A score inside a listpack, as Redis stores one: an integer when it is one exactly,
/// else its shortest round-trip text.
fn push_score(lp: &mut listpack::Writer, score: f64) {
    if score.fract() == 0.0 && score.abs() < 1e17 {
        lp.push_int(score as i64);
    } else {
        lp.push_bytes(crate::protocol::reply::format_double(score).as_bytes());
    }
}

/// A key's record: expiry, type, key, value.
pub fn put_key_value(
    out: &mut (impl Sink + ?Sized),
    key: &[u8],
    v: &Value,
    expire_at: u64,
    opts: &Options,
) {
    if expire_at != 0 {
        out.put_u8(super::op::EXPIRETIME_MS);
        put_ms_time(out, expire_at as i64);
    }
    out.put_u8(type_of(v, opts));
    put_string(out, key, opts);
    put_value(out, v, opts);
}

/// DUMP's payload: type, value, RDB version (2 bytes LE), CRC64 of all that (8 bytes LE).
pub fn dump_payload(v: &Value, opts: &Options) -> Vec<u8> {
    let mut out = Vec::new();
    out.push(type_of(v, opts));
    put_value(&mut out, v, opts);
    out.extend_from_slice(&opts.version.to_le_bytes());
    let crc = super::crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Entries per listpack node when a stream is written (Redis's stream-node-max-entries).
const STREAM_NODE_ENTRIES: u64 = 100;

fn stream_id_bytes(id: StreamId) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&id.ms.to_be_bytes());
    b[8..].copy_from_slice(&id.seq.to_be_bytes());
    b
}

/// A stream as Redis 7 writes one: nodes of up to 100 entries, each a listpack that opens
/// with its master entry (the first entry's fields), then the groups with their pending
/// entries and consumers.
fn put_stream(out: &mut (impl Sink + ?Sized), s: &Stream, opts: &Options) {
    let log = &s.log;
    put_len(out, log.len().div_ceil(STREAM_NODE_ENTRIES));
    let mut entries = log.range(StreamId::MIN, StreamId::MAX).peekable();
    while entries.peek().is_some() {
        let node: Vec<_> = entries
            .by_ref()
            .take(STREAM_NODE_ENTRIES as usize)
            .collect();
        let master_id = node[0].id;
        let master_fields: Vec<&[u8]> = node[0].pairs().map(|(f, _)| f).collect();
        let mut lp = listpack::Writer::new();
        lp.push_int(node.len() as i64);
        lp.push_int(0);
        lp.push_int(master_fields.len() as i64);
        for f in &master_fields {
            lp.push_bytes(f);
        }
        lp.push_int(0);
        for e in &node {
            let same = e.pair_count() == master_fields.len()
                && e.pairs().zip(&master_fields).all(|((f, _), m)| f == *m);
            lp.push_int(if same { STREAM_ITEM_SAMEFIELDS } else { 0 });
            lp.push_int(e.id.ms.wrapping_sub(master_id.ms) as i64);
            lp.push_int(e.id.seq.wrapping_sub(master_id.seq) as i64);
            if same {
                for (_, v) in e.pairs() {
                    lp.push_bytes(v);
                }
                lp.push_int(3 + e.pair_count() as i64);
            } else {
                lp.push_int(e.pair_count() as i64);
                for (f, v) in e.pairs() {
                    lp.push_bytes(f);
                    lp.push_bytes(v);
                }
                lp.push_int(4 + 2 * e.pair_count() as i64);
            }
        }
        put_raw_string(out, &stream_id_bytes(master_id));
        out.put_blob(lp.finish(), opts);
    }
    put_len(out, log.len());
    put_len(out, log.last_id.ms);
    put_len(out, log.last_id.seq);
    let first = log.first_entry_id().unwrap_or_default();
    put_len(out, first.ms);
    put_len(out, first.seq);
    put_len(out, log.max_deleted.ms);
    put_len(out, log.max_deleted.seq);
    put_len(out, log.entries_added);
    put_len(out, s.groups.len() as u64);
    for (name, g) in &s.groups {
        put_string(out, name, opts);
        put_len(out, g.last_id.ms);
        put_len(out, g.last_id.seq);
        // Redis stores entries_read as a plain length, -1 (unknown) as its u64 form.
        put_len(out, g.entries_read as u64);
        put_len(out, g.pel.len() as u64);
        for (id, nack) in &g.pel {
            out.put(&stream_id_bytes(*id));
            put_ms_time(out, nack.delivery_time);
            put_len(out, nack.delivery_count);
        }
        put_len(out, g.consumer_count() as u64);
        for c in g.consumers() {
            put_string(out, &c.name, opts);
            put_ms_time(out, c.seen_time);
            if opts.version >= 11 {
                put_ms_time(out, c.active_time);
            }
            put_len(out, c.pel.len() as u64);
            for id in &c.pel {
                out.put(&stream_id_bytes(*id));
            }
        }
    }
}
