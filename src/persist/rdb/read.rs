//! RDB records back into Kite's values: every type and encoding Redis 2.6 to 7.2 and
//! Valkey 8 write (RDB versions 1 to 11).
//!
//! The reader is total: a truncated, corrupt or hostile input gives an `Error` naming the
//! byte offset where reading stopped, never a panic, and no length read from the input
//! is trusted for an allocation before the bytes behind it have arrived.

use std::io::Read;

use super::listpack::{self, Elem};
use super::{enc, intset, lzf, module_name, op, ty, ziplist, zipmap};
use super::{QUICKLIST_NODE_PACKED, QUICKLIST_NODE_PLAIN};
use super::{STREAM_ITEM_DELETED, STREAM_ITEM_SAMEFIELDS};
use crate::types::hash::Hash;
use crate::types::list::List;
use crate::types::set::Set;
use crate::types::stream::{Group, Stream, StreamId, UNKNOWN_READ};
use crate::types::value::{StrValue, Value};
use crate::types::zset::ZSet;

#[derive(Debug)]
pub struct Error {
    /// Bytes consumed when the problem was found.
    pub offset: u64,
    pub msg: String,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (at offset {})", self.msg, self.offset)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Preallocation cap for collections whose size comes from the input.
const PREALLOC_MAX: usize = 1 << 16;

/// A byte source that counts what it consumed and checksums it.
pub struct Reader<R: Read> {
    inner: R,
    pos: u64,
    crc: crc::Digest<'static, u64, crc::Table<16>>,
}

impl<R: Read> Reader<R> {
    pub fn new(inner: R) -> Reader<R> {
        Reader {
            inner,
            pos: 0,
            crc: super::CRC64.digest(),
        }
    }

    pub fn offset(&self) -> u64 {
        self.pos
    }

    fn err<T>(&self, msg: impl Into<String>) -> Result<T> {
        Err(Error {
            offset: self.pos,
            msg: msg.into(),
        })
    }

    /// The checksum of everything read so far.
    pub fn checksum(&self) -> u64 {
        self.crc.clone().finalize()
    }

    fn fill(&mut self, buf: &mut [u8]) -> Result<()> {
        if let Err(e) = self.inner.read_exact(buf) {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.err("unexpected end of file")
            } else {
                self.err(format!("read error: {e}"))
            };
        }
        self.pos += buf.len() as u64;
        self.crc.update(buf);
        Ok(())
    }

    pub fn u8(&mut self) -> Result<u8> {
        let mut b = [0u8; 1];
        self.fill(&mut b)?;
        Ok(b[0])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.fill(&mut b)?;
        Ok(b)
    }

    /// `n` bytes; the buffer grows as they arrive, so a false length cannot reserve memory.
    pub fn bytes(&mut self, n: u64) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity((n as usize).min(PREALLOC_MAX));
        let got = (&mut self.inner)
            .take(n)
            .read_to_end(&mut out)
            .or_else(|e| self.err(format!("read error: {e}")))?;
        self.crc.update(&out);
        self.pos += got as u64;
        if (got as u64) < n {
            return self.err("unexpected end of file");
        }
        Ok(out)
    }

    /// A length, or the special encoding that stands in its place (Some(kind)).
    fn len_or_encoding(&mut self) -> Result<(u64, bool)> {
        let first = self.u8()?;
        Ok(match first >> 6 {
            0 => ((first & 0x3f) as u64, false),
            1 => ((((first & 0x3f) as u64) << 8) | self.u8()? as u64, false),
            2 => match first {
                0x80 => (u32::from_be_bytes(self.array()?) as u64, false),
                0x81 => (u64::from_be_bytes(self.array()?), false),
                _ => return self.err(format!("unknown length encoding {first:#04x}")),
            },
            _ => ((first & 0x3f) as u64, true),
        })
    }

    pub fn len(&mut self) -> Result<u64> {
        match self.len_or_encoding()? {
            (n, false) => Ok(n),
            (_, true) => self.err("a length was expected, found an encoded string"),
        }
    }

    /// A length used to size a collection: bounded by what the file could hold.
    fn count(&mut self) -> Result<u64> {
        let n = self.len()?;
        if n > u32::MAX as u64 * 16 {
            return self.err(format!("collection length {n} is not plausible"));
        }
        Ok(n)
    }

    /// A string in any of its encodings: raw, 8/16/32-bit integer, or LZF.
    pub fn string(&mut self) -> Result<Vec<u8>> {
        let (n, encoded) = self.len_or_encoding()?;
        if !encoded {
            return self.bytes(n);
        }
        let v: i64 = match n as u8 {
            enc::INT8 => self.u8()? as i8 as i64,
            enc::INT16 => i16::from_le_bytes(self.array()?) as i64,
            enc::INT32 => i32::from_le_bytes(self.array()?) as i64,
            enc::LZF => {
                let clen = self.len()?;
                let len = self.len()?;
                let packed = self.bytes(clen)?;
                if len > clen.saturating_mul(256).max(64) {
                    return self.err("LZF length is not plausible");
                }
                return lzf::decompress(&packed, len as usize)
                    .or_else(|e| self.err(format!("bad LZF string: {e}")));
            }
            other => return self.err(format!("unknown string encoding {other}")),
        };
        Ok(v.to_string().into_bytes())
    }

    fn ms_time(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    fn double_binary(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.array()?))
    }

    /// The old text form of a double (ZSET records): length byte, or 253/254/255 for
    /// NaN and the infinities.
    fn double_text(&mut self) -> Result<f64> {
        match self.u8()? {
            253 => Ok(f64::NAN),
            254 => Ok(f64::INFINITY),
            255 => Ok(f64::NEG_INFINITY),
            n => {
                let text = self.bytes(n as u64)?;
                parse_score(&text).map_or_else(|| self.err("bad double value"), Ok)
            }
        }
    }
}

fn parse_score(b: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(b).ok()?;
    match s.to_ascii_lowercase().as_str() {
        "inf" | "+inf" | "infinity" | "+infinity" => Some(f64::INFINITY),
        "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
        "nan" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

fn elem_score(e: &Elem) -> Option<f64> {
    match e {
        Elem::Int(i) => Some(*i as f64),
        Elem::Bytes(b) => parse_score(b),
    }
}

/// What one step of reading a file yields.
pub enum Record {
    Aux(Vec<u8>, Vec<u8>),
    SelectDb(u64),
    ResizeDb,
    Key(KeyRecord),
    /// A FUNCTION library's code.
    Function(Vec<u8>),
    /// The file ended and its checksum (if any) matched.
    Eof,
}

pub struct KeyRecord {
    pub key: Vec<u8>,
    /// None for an empty collection, which Redis drops on load too.
    pub value: Option<Value>,
    /// Absolute unix ms, 0 for none.
    pub expire_at: u64,
    /// OBJECT IDLETIME seconds, when the file recorded it.
    pub idle: Option<u64>,
}

/// Reads a whole RDB file record by record.
pub struct FileReader<R: Read> {
    pub r: Reader<R>,
    pub version: u16,
    /// Check the trailing CRC64 (rdbchecksum); a stored 0 means the writer did not compute one.
    verify_checksum: bool,
    done: bool,
}

impl<R: Read> FileReader<R> {
    /// Reads and checks the header.
    pub fn open(inner: R, verify_checksum: bool) -> Result<FileReader<R>> {
        let mut r = Reader::new(inner);
        let magic: [u8; 9] = r.array()?;
        if &magic[..5] != b"REDIS" {
            return Err(Error {
                offset: 0,
                msg: "wrong signature trying to load DB from file".into(),
            });
        }
        let version = std::str::from_utf8(&magic[5..])
            .ok()
            .and_then(|v| v.parse::<u16>().ok())
            .filter(|v| (1..=super::VERSION_MAX).contains(v));
        let Some(version) = version else {
            return Err(Error {
                offset: 5,
                msg: format!(
                    "can't handle RDB format version {}",
                    String::from_utf8_lossy(&magic[5..])
                ),
            });
        };
        Ok(FileReader {
            r,
            version,
            verify_checksum,
            done: false,
        })
    }

    /// The next record, or None after `Eof` was returned.
    pub fn next(&mut self) -> Result<Option<Record>> {
        if self.done {
            return Ok(None);
        }
        let mut expire_at = 0u64;
        let mut idle = None;
        loop {
            let t = self.r.u8()?;
            match t {
                op::EXPIRETIME => {
                    let secs = i32::from_le_bytes(self.r.array()?);
                    expire_at = (secs as i64 * 1000).max(1) as u64;
                }
                op::EXPIRETIME_MS => {
                    let ms = self.r.ms_time()?;
                    // A time before 1970 still means "expired": keep it non-zero.
                    expire_at = ms.max(1) as u64;
                }
                op::FREQ => {
                    self.r.u8()?;
                }
                op::IDLE => idle = Some(self.r.len()?),
                op::EOF => {
                    self.done = true;
                    if self.version >= 5 {
                        let computed = self.r.checksum();
                        let stored = u64::from_le_bytes(self.r.array()?);
                        if self.verify_checksum && stored != 0 && stored != computed {
                            return self.r.err(format!(
                                "wrong RDB checksum: expected {stored:#018x}, got {computed:#018x}"
                            ));
                        }
                    }
                    return Ok(Some(Record::Eof));
                }
                op::SELECTDB => return Ok(Some(Record::SelectDb(self.r.len()?))),
                op::RESIZEDB => {
                    self.r.len()?;
                    self.r.len()?;
                    return Ok(Some(Record::ResizeDb));
                }
                op::AUX => {
                    let k = self.r.string()?;
                    let v = self.r.string()?;
                    return Ok(Some(Record::Aux(k, v)));
                }
                op::SLOT_INFO => {
                    for _ in 0..3 {
                        self.r.len()?;
                    }
                }
                op::MODULE_AUX => {
                    let id = self.r.len()?;
                    return self.r.err(format!(
                        "the RDB file contains AUX module data of module '{}' that Kite can't load",
                        module_name(id)
                    ));
                }
                op::FUNCTION_PRE_GA => {
                    return self
                        .r
                        .err("the RDB file holds functions in Redis 7.0's pre-release format, which Kite can't load");
                }
                op::FUNCTION2 => return Ok(Some(Record::Function(self.r.string()?))),
                _ => {
                    let key = self.r.string()?;
                    let value = read_value(&mut self.r, t)?;
                    return Ok(Some(Record::Key(KeyRecord {
                        key,
                        value,
                        expire_at,
                        idle,
                    })));
                }
            }
        }
    }
}

/// A DUMP payload's value, after checking its footer (RDB version and CRC64). Err(true)
/// for a bad footer ("version or checksum are wrong"), Err(false) for a bad body.
pub fn read_payload(payload: &[u8], verify_checksum: bool) -> std::result::Result<Value, bool> {
    if payload.len() < 10 {
        return Err(true);
    }
    let (body, footer) = payload.split_at(payload.len() - 10);
    let version = u16::from_le_bytes([footer[0], footer[1]]);
    if version > super::VERSION_MAX {
        return Err(true);
    }
    if verify_checksum {
        let crc = u64::from_le_bytes(footer[2..].try_into().expect("8 bytes"));
        if super::crc64(&payload[..payload.len() - 8]) != crc {
            return Err(true);
        }
    }
    let mut r = Reader::new(body);
    let t = r.u8().map_err(|_| false)?;
    match read_value(&mut r, t) {
        Ok(Some(v)) => Ok(v),
        _ => Err(false),
    }
}

fn list_from(items: impl IntoIterator<Item = Vec<u8>>) -> List {
    let mut l = List::new();
    for i in items {
        l.push_back(&i);
    }
    l
}

fn non_empty(v: Value, len: usize) -> Option<Value> {
    (len > 0).then_some(v)
}

/// Reads one value of type `t`.
pub fn read_value<R: Read>(r: &mut Reader<R>, t: u8) -> Result<Option<Value>> {
    Ok(match t {
        ty::STRING => Some(Value::Str(StrValue::from_bytes(&r.string()?))),
        ty::LIST => {
            let n = r.count()?;
            let mut l = List::new();
            for _ in 0..n {
                l.push_back(&r.string()?);
            }
            let len = l.len();
            non_empty(Value::List(Box::new(l)), len)
        }
        ty::SET => {
            let n = r.count()?;
            let mut set: Option<Set> = None;
            for _ in 0..n {
                let m = r.string()?;
                // The count is the file's word: room grows with members actually read.
                let s =
                    set.get_or_insert_with(|| Set::create_for(&m, (n as usize).min(PREALLOC_MAX)));
                if !s.add(&m) {
                    return r.err("duplicate set member");
                }
            }
            set.map(|s| Value::Set(Box::new(s)))
        }
        ty::ZSET | ty::ZSET_2 => {
            let n = r.count()?;
            let mut z = ZSet::with_hint((n as usize).min(PREALLOC_MAX), 0);
            for _ in 0..n {
                let m = r.string()?;
                let score = if t == ty::ZSET_2 {
                    r.double_binary()?
                } else {
                    r.double_text()?
                };
                zset_add(r, &mut z, &m, score)?;
            }
            let len = z.len();
            non_empty(Value::ZSet(Box::new(z)), len)
        }
        ty::HASH => {
            let n = r.count()?;
            let mut h = Hash::new();
            for _ in 0..n {
                let f = r.string()?;
                let v = r.string()?;
                if !h.insert(&f, &v) {
                    return r.err("duplicate hash field");
                }
            }
            let len = h.len();
            non_empty(Value::Hash(Box::new(h)), len)
        }
        ty::HASH_ZIPMAP => {
            let blob = r.string()?;
            let pairs = zipmap::pairs(&blob).or_else(|e| r.err(format!("bad zipmap: {e}")))?;
            hash_from(
                r,
                pairs
                    .into_iter()
                    .map(|(f, v)| (Elem::Bytes(f), Elem::Bytes(v))),
            )?
        }
        ty::LIST_ZIPLIST => {
            let blob = r.string()?;
            let items = ziplist::entries(&blob).or_else(|e| r.err(format!("bad ziplist: {e}")))?;
            let l = list_from(items.iter().map(|e| e.to_vec()));
            let len = l.len();
            non_empty(Value::List(Box::new(l)), len)
        }
        ty::SET_INTSET => {
            let blob = r.string()?;
            let members = intset::members(&blob).or_else(|e| r.err(format!("bad intset: {e}")))?;
            set_from(r, members.iter().map(|m| Elem::Int(*m)))?
        }
        ty::SET_LISTPACK => {
            let blob = r.string()?;
            let items =
                listpack::entries(&blob).or_else(|e| r.err(format!("bad listpack: {e}")))?;
            set_from(r, items.into_iter())?
        }
        ty::ZSET_ZIPLIST | ty::ZSET_LISTPACK => {
            let blob = r.string()?;
            let items = if t == ty::ZSET_ZIPLIST {
                ziplist::entries(&blob).or_else(|e| r.err(format!("bad ziplist: {e}")))?
            } else {
                listpack::entries(&blob).or_else(|e| r.err(format!("bad listpack: {e}")))?
            };
            if items.len() % 2 != 0 {
                return r.err("sorted set with an odd number of elements");
            }
            let mut z = ZSet::with_hint(items.len() / 2, 0);
            for pair in items.chunks(2) {
                let Some(score) = elem_score(&pair[1]) else {
                    return r.err("sorted set score is not a number");
                };
                zset_add(r, &mut z, &pair[0].to_vec(), score)?;
            }
            let len = z.len();
            non_empty(Value::ZSet(Box::new(z)), len)
        }
        ty::HASH_ZIPLIST | ty::HASH_LISTPACK => {
            let blob = r.string()?;
            let items = if t == ty::HASH_ZIPLIST {
                ziplist::entries(&blob).or_else(|e| r.err(format!("bad ziplist: {e}")))?
            } else {
                listpack::entries(&blob).or_else(|e| r.err(format!("bad listpack: {e}")))?
            };
            if items.len() % 2 != 0 {
                return r.err("hash with an odd number of elements");
            }
            hash_from(r, items.chunks(2).map(|p| (p[0], p[1])))?
        }
        ty::LIST_QUICKLIST | ty::LIST_QUICKLIST_2 => {
            let nodes = r.count()?;
            let mut l = List::new();
            for _ in 0..nodes {
                let container = if t == ty::LIST_QUICKLIST_2 {
                    r.len()?
                } else {
                    QUICKLIST_NODE_PACKED
                };
                let blob = r.string()?;
                match container {
                    QUICKLIST_NODE_PLAIN => l.push_back(&blob),
                    QUICKLIST_NODE_PACKED => {
                        let items = if t == ty::LIST_QUICKLIST {
                            ziplist::entries(&blob)
                        } else {
                            listpack::entries(&blob)
                        }
                        .or_else(|e| r.err(format!("bad quicklist node: {e}")))?;
                        for e in &items {
                            match e {
                                Elem::Bytes(b) => l.push_back(b),
                                Elem::Int(_) => l.push_back(&e.to_vec()),
                            }
                        }
                    }
                    other => return r.err(format!("unknown quicklist node container {other}")),
                }
            }
            let len = l.len();
            non_empty(Value::List(Box::new(l)), len)
        }
        ty::STREAM_LISTPACKS | ty::STREAM_LISTPACKS_2 | ty::STREAM_LISTPACKS_3 => {
            Some(Value::Stream(Box::new(read_stream(r, t)?)))
        }
        ty::MODULE_PRE_GA | ty::MODULE_2 => {
            let id = r.len()?;
            return r.err(format!(
                "the RDB file contains data of module '{}' that Kite can't load",
                module_name(id)
            ));
        }
        other => return r.err(format!("unknown value type {other}")),
    })
}

fn zset_add<R: Read>(r: &Reader<R>, z: &mut ZSet, m: &[u8], score: f64) -> Result<()> {
    if score.is_nan() {
        return r.err("sorted set score is NaN");
    }
    if z.score(m).is_some() {
        return r.err("duplicate sorted set member");
    }
    z.insert(m, score);
    Ok(())
}

fn set_from<'a, R: Read>(
    r: &Reader<R>,
    members: impl ExactSizeIterator<Item = Elem<'a>>,
) -> Result<Option<Value>> {
    let n = members.len();
    let mut set: Option<Set> = None;
    for m in members {
        let m = m.to_vec();
        let s = set.get_or_insert_with(|| Set::create_for(&m, n));
        if !s.add(&m) {
            return r.err("duplicate set member");
        }
    }
    Ok(set.map(|s| Value::Set(Box::new(s))))
}

fn hash_from<'a, R: Read>(
    r: &Reader<R>,
    pairs: impl Iterator<Item = (Elem<'a>, Elem<'a>)>,
) -> Result<Option<Value>> {
    let mut h = Hash::new();
    for (f, v) in pairs {
        if !h.insert(&f.to_vec(), &v.to_vec()) {
            return r.err("duplicate hash field");
        }
    }
    let len = h.len();
    Ok(non_empty(Value::Hash(Box::new(h)), len))
}

fn stream_id_from(b: &[u8]) -> Option<StreamId> {
    if b.len() != 16 {
        return None;
    }
    Some(StreamId::new(
        u64::from_be_bytes(b[..8].try_into().ok()?),
        u64::from_be_bytes(b[8..].try_into().ok()?),
    ))
}

/// Reads the entries of one stream node's listpack, in order, skipping deleted ones.
fn stream_node_entries<R: Read>(
    r: &Reader<R>,
    master: StreamId,
    lp: &[Elem],
    out: &mut Vec<(StreamId, Vec<Vec<u8>>)>,
) -> Result<()> {
    let mut it = lp.iter();
    let int = |it: &mut std::slice::Iter<Elem>, what: &str| -> Result<i64> {
        match it.next().and_then(|e| e.as_i64()) {
            Some(v) => Ok(v),
            None => r.err(format!("stream node: bad or missing {what}")),
        }
    };
    let _count = int(&mut it, "entry count")?;
    let _deleted = int(&mut it, "deleted count")?;
    let nfields = int(&mut it, "master field count")?;
    if nfields < 0 || nfields as usize > lp.len() {
        return r.err("stream node: bad master field count");
    }
    let mut master_fields = Vec::with_capacity(nfields as usize);
    for _ in 0..nfields {
        match it.next() {
            Some(e) => master_fields.push(e.to_vec()),
            None => return r.err("stream node: missing master field"),
        }
    }
    if int(&mut it, "master terminator")? != 0 {
        return r.err("stream node: bad master terminator");
    }
    while it.len() > 0 {
        let flags = int(&mut it, "entry flags")?;
        let ms = int(&mut it, "id delta")?;
        let seq = int(&mut it, "id delta")?;
        let id = StreamId::new(
            master.ms.wrapping_add(ms as u64),
            master.seq.wrapping_add(seq as u64),
        );
        let mut pairs = Vec::new();
        if flags & STREAM_ITEM_SAMEFIELDS != 0 {
            for f in &master_fields {
                let Some(v) = it.next() else {
                    return r.err("stream node: missing value");
                };
                pairs.push(f.clone());
                pairs.push(v.to_vec());
            }
        } else {
            let n = int(&mut it, "field count")?;
            if n < 0 || n as usize > it.len() {
                return r.err("stream node: bad field count");
            }
            for _ in 0..2 * n {
                match it.next() {
                    Some(e) => pairs.push(e.to_vec()),
                    None => return r.err("stream node: missing field"),
                }
            }
        }
        let _lp_count = int(&mut it, "entry trailer")?;
        if flags & STREAM_ITEM_DELETED == 0 {
            out.push((id, pairs));
        }
    }
    Ok(())
}

fn stream_id_pair<R: Read>(r: &mut Reader<R>) -> Result<StreamId> {
    let ms = r.len()?;
    let seq = r.len()?;
    Ok(StreamId::new(ms, seq))
}

fn read_stream<R: Read>(r: &mut Reader<R>, t: u8) -> Result<Stream> {
    let mut s = Stream::new();
    let nodes = r.count()?;
    let mut entries = Vec::new();
    for _ in 0..nodes {
        let key = r.string()?;
        let Some(master) = stream_id_from(&key) else {
            return r.err("stream node key is not a 16-byte id");
        };
        let blob = r.string()?;
        let lp =
            listpack::entries(&blob).or_else(|e| r.err(format!("bad stream listpack: {e}")))?;
        if lp.is_empty() {
            return r.err("empty listpack inside stream");
        }
        stream_node_entries(r, master, &lp, &mut entries)?;
    }
    for (id, pairs) in entries {
        if !s.log.is_empty() && id <= s.log.last_id {
            return r.err("stream entries out of order");
        }
        s.log.append(id, &pairs);
    }
    let _length = r.len()?;
    s.log.last_id = stream_id_pair(r)?;
    if t >= ty::STREAM_LISTPACKS_2 {
        s.log.first_id = stream_id_pair(r)?;
        s.log.max_deleted = stream_id_pair(r)?;
        s.log.entries_added = r.len()?;
    } else {
        s.log.first_id = s.log.first_entry_id().unwrap_or_default();
        s.log.max_deleted = StreamId::MIN;
        s.log.entries_added = s.log.len();
    }
    let ngroups = r.count()?;
    for _ in 0..ngroups {
        let name = r.string()?;
        let last_id = stream_id_pair(r)?;
        let entries_read = if t >= ty::STREAM_LISTPACKS_2 {
            r.len()? as i64
        } else {
            UNKNOWN_READ
        };
        let mut g = Group::new(last_id, entries_read);
        let npel = r.count()?;
        let mut nacks = std::collections::BTreeMap::new();
        for _ in 0..npel {
            let id_bytes: [u8; 16] = r.array()?;
            let id = stream_id_from(&id_bytes).expect("16 bytes");
            let time = r.ms_time()?;
            let count = r.len()?;
            nacks.insert(id, (time, count));
        }
        let nconsumers = r.count()?;
        for _ in 0..nconsumers {
            let cname = r.string()?;
            let seen = r.ms_time()?;
            let active = if t >= ty::STREAM_LISTPACKS_3 {
                r.ms_time()?
            } else {
                seen
            };
            let (slot, created) = g.get_or_create(&cname, seen);
            if !created {
                return r.err("duplicate stream consumer");
            }
            g.consumer_mut(slot).active_time = active;
            let cpel = r.count()?;
            for _ in 0..cpel {
                let id_bytes: [u8; 16] = r.array()?;
                let id = stream_id_from(&id_bytes).expect("16 bytes");
                let Some(&(time, count)) = nacks.get(&id) else {
                    return r.err("stream consumer's pending entry is not in its group's list");
                };
                g.assign(id, slot, |_| (time, count));
            }
        }
        if s.groups.insert(name.into(), g).is_some() {
            return r.err("duplicate stream consumer group");
        }
    }
    Ok(s)
}
