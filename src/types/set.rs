//! The set value.
//!
//! A set keeps the representation Redis 7.2 would give the same history of writes, because
//! clients read it back through OBJECT ENCODING and because the small forms decide the
//! order in which members are returned:
//! - `intset`: a sorted array of integers, 2, 4 or 8 bytes wide, while every member is a
//!   canonical integer and there are at most 512 of them (members come back ascending);
//! - `listpack`: one packed byte buffer of length-prefixed members while there are at most
//!   128, none longer than 64 bytes (members come back in insertion order);
//! - `hashtable`: beyond that, segments of open-addressing tables indexed by hash bits, so
//!   SSCAN can walk them with Redis's reverse-binary cursor.
//!
//! Conversions go one way (intset → listpack → hashtable, intset → hashtable), as in Redis;
//! only whole-result builders (SINTERSTORE, SPOP's rebuild) start a fresh value.

use std::fmt;
use std::hash::BuildHasher;

use hashbrown::hash_table::HashTable;

use super::table::next_reverse_cursor;
use super::value::parse_canonical_i64;

/// `set-max-intset-entries`.
pub const MAX_INTSET_ENTRIES: usize = 512;
/// `set-max-listpack-entries`.
pub const MAX_LISTPACK_ENTRIES: usize = 128;
/// `set-max-listpack-value`.
pub const MAX_LISTPACK_VALUE: usize = 64;

/// One member as a set yields it: intsets hold integers, the other forms bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Member<'a> {
    Int(i64),
    Str(&'a [u8]),
}

impl<'a> Member<'a> {
    /// The member's bytes; integers are written into `scratch`.
    pub fn bytes<'b>(&'b self, scratch: &'b mut [u8; 20]) -> &'b [u8]
    where
        'a: 'b,
    {
        match self {
            Member::Str(s) => s,
            Member::Int(i) => format_int(*i, scratch),
        }
    }

    pub fn to_vec(self) -> Vec<u8> {
        let mut scratch = [0u8; 20];
        self.bytes(&mut scratch).to_vec()
    }
}

fn format_int(v: i64, scratch: &mut [u8; 20]) -> &[u8] {
    let mut n = v.unsigned_abs();
    let mut pos = scratch.len();
    loop {
        pos -= 1;
        scratch[pos] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        pos -= 1;
        scratch[pos] = b'-';
    }
    &scratch[pos..]
}

/// A small xorshift generator; SPOP and SRANDMEMBER seed it from the shard's.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `k` distinct positions out of `0..n`, ascending, uniformly chosen (selection sampling).
fn sample_in_order(n: usize, k: usize, rng: &mut Rng) -> Vec<usize> {
    let mut picked = Vec::with_capacity(k);
    for i in 0..n {
        if picked.len() == k {
            break;
        }
        let need = k - picked.len();
        if rng.below(n - i) < need {
            picked.push(i);
        }
    }
    picked
}

// ---------------------------------------------------------------------------------------
// intset
// ---------------------------------------------------------------------------------------

/// Sorted integers in the narrowest width that holds them all; like Redis's intset the
/// width only grows.
#[derive(Clone)]
enum Ints {
    W16(Vec<i16>),
    W32(Vec<i32>),
    W64(Vec<i64>),
}

macro_rules! each_width {
    ($ints:expr, $v:ident => $body:expr) => {
        match $ints {
            Ints::W16($v) => $body,
            Ints::W32($v) => $body,
            Ints::W64($v) => $body,
        }
    };
}

fn wide<T: Into<i64>>(v: T) -> i64 {
    v.into()
}

impl Ints {
    fn new() -> Ints {
        Ints::W16(Vec::new())
    }

    fn len(&self) -> usize {
        each_width!(self, v => v.len())
    }

    fn get(&self, i: usize) -> i64 {
        each_width!(self, v => wide(v[i]))
    }

    fn find(&self, x: i64) -> Result<usize, usize> {
        each_width!(self, v => v.binary_search_by(|e| wide(*e).cmp(&x)))
    }

    fn contains(&self, x: i64) -> bool {
        self.find(x).is_ok()
    }

    fn widen_for(&mut self, x: i64) {
        let needed = if i16::try_from(x).is_ok() {
            0
        } else if i32::try_from(x).is_ok() {
            1
        } else {
            2
        };
        let current = match self {
            Ints::W16(_) => 0,
            Ints::W32(_) => 1,
            Ints::W64(_) => 2,
        };
        if needed <= current {
            return;
        }
        let all: Vec<i64> = (0..self.len()).map(|i| self.get(i)).collect();
        *self = if needed == 1 {
            Ints::W32(all.into_iter().map(|v| v as i32).collect())
        } else {
            Ints::W64(all)
        };
    }

    fn insert(&mut self, x: i64) -> bool {
        match self.find(x) {
            Ok(_) => false,
            Err(pos) => {
                self.widen_for(x);
                each_width!(self, v => v.insert(pos, x as _));
                true
            }
        }
    }

    fn remove(&mut self, x: i64) -> bool {
        match self.find(x) {
            Ok(pos) => {
                self.remove_at(pos);
                true
            }
            Err(_) => false,
        }
    }

    fn remove_at(&mut self, pos: usize) -> i64 {
        each_width!(self, v => wide(v.remove(pos)))
    }

    fn heap_size(&self) -> usize {
        match self {
            Ints::W16(v) => v.capacity() * 2,
            Ints::W32(v) => v.capacity() * 4,
            Ints::W64(v) => v.capacity() * 8,
        }
    }

    fn shrink(&mut self) {
        each_width!(self, v => v.shrink_to_fit())
    }

    fn slack(&self) -> usize {
        each_width!(self, v => v.capacity() - v.len())
    }
}

// ---------------------------------------------------------------------------------------
// listpack
// ---------------------------------------------------------------------------------------

/// Members packed one after another, each preceded by its length (LEB128), in insertion
/// order.
#[derive(Clone, Default)]
struct Pack {
    buf: Vec<u8>,
    len: usize,
}

fn put_len(buf: &mut Vec<u8>, mut n: usize) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            buf.push(byte);
            return;
        }
        buf.push(byte | 0x80);
    }
}

/// The length at `pos` and the offset just past it.
fn read_len(buf: &[u8], mut pos: usize) -> (usize, usize) {
    let mut n = 0usize;
    let mut shift = 0;
    loop {
        let b = buf[pos];
        pos += 1;
        n |= ((b & 0x7f) as usize) << shift;
        if b & 0x80 == 0 {
            return (n, pos);
        }
        shift += 7;
    }
}

struct PackIter<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Iterator for PackIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.pos >= self.buf.len() {
            return None;
        }
        let (n, start) = read_len(self.buf, self.pos);
        self.pos = start + n;
        Some(&self.buf[start..start + n])
    }
}

impl Pack {
    fn iter(&self) -> PackIter<'_> {
        PackIter {
            buf: &self.buf,
            pos: 0,
        }
    }

    /// The byte range of the entry holding `m` (length prefix included).
    fn find(&self, m: &[u8]) -> Option<(usize, usize)> {
        let mut pos = 0;
        while pos < self.buf.len() {
            let (n, start) = read_len(&self.buf, pos);
            if &self.buf[start..start + n] == m {
                return Some((pos, start + n));
            }
            pos = start + n;
        }
        None
    }

    fn push(&mut self, m: &[u8]) {
        put_len(&mut self.buf, m.len());
        self.buf.extend_from_slice(m);
        self.len += 1;
    }

    fn remove(&mut self, m: &[u8]) -> bool {
        match self.find(m) {
            Some((a, b)) => {
                self.buf.drain(a..b);
                self.len -= 1;
                true
            }
            None => false,
        }
    }

    fn nth(&self, i: usize) -> &[u8] {
        self.iter().nth(i).expect("index within the pack")
    }

    /// Splits the pack into the entries at `positions` (ascending) and the rest, both in
    /// pack order.
    fn split(&self, positions: &[usize]) -> (Pack, Pack) {
        let (mut chosen, mut rest) = (Pack::default(), Pack::default());
        let mut next = positions.iter().peekable();
        for (i, m) in self.iter().enumerate() {
            if next.peek() == Some(&&i) {
                next.next();
                chosen.push(m);
            } else {
                rest.push(m);
            }
        }
        (chosen, rest)
    }
}

// ---------------------------------------------------------------------------------------
// hashtable
// ---------------------------------------------------------------------------------------

/// Average members per segment before the segment count doubles, and under which it
/// halves.
const GROW_AT: usize = 32;
const SHRINK_AT: usize = 4;
/// Segment bits come from the high half of the hash, away from the bits each segment's
/// own table uses.
const SEG_SHIFT: u32 = 32;

/// Members spread over 2^k segments by hash bits. The segment index plays the role of a
/// Redis dict bucket, which gives SSCAN its guarantee across resizes.
#[derive(Clone)]
struct Big {
    segs: Vec<HashTable<Box<[u8]>>>,
    len: usize,
    /// Bytes of all members, for MEMORY USAGE without a walk.
    bytes: usize,
    hasher: hashbrown::DefaultHashBuilder,
}

impl Big {
    fn with_capacity(n: usize) -> Big {
        let mut count = 1;
        while n > count * GROW_AT {
            count *= 2;
        }
        Big {
            segs: (0..count).map(|_| HashTable::new()).collect(),
            len: 0,
            bytes: 0,
            hasher: hashbrown::DefaultHashBuilder::default(),
        }
    }

    fn hash(&self, m: &[u8]) -> u64 {
        self.hasher.hash_one(m)
    }

    fn seg_of(&self, h: u64) -> usize {
        ((h >> SEG_SHIFT) as usize) & (self.segs.len() - 1)
    }

    fn contains(&self, m: &[u8]) -> bool {
        let h = self.hash(m);
        self.segs[self.seg_of(h)].find(h, |e| &**e == m).is_some()
    }

    fn insert(&mut self, m: &[u8]) -> bool {
        let h = self.hash(m);
        let i = self.seg_of(h);
        let hasher = &self.hasher;
        match self.segs[i].entry(h, |e| &**e == m, |e| hasher.hash_one(&**e)) {
            hashbrown::hash_table::Entry::Occupied(_) => false,
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(m.into());
                self.len += 1;
                self.bytes += m.len();
                if self.len > self.segs.len() * GROW_AT {
                    self.resize(self.segs.len() * 2);
                }
                true
            }
        }
    }

    /// Adds a member known to be absent.
    fn insert_unique(&mut self, m: Box<[u8]>) {
        let h = self.hash(&m);
        let i = self.seg_of(h);
        let hasher = &self.hasher;
        self.bytes += m.len();
        self.segs[i].insert_unique(h, m, |e| hasher.hash_one(&**e));
        self.len += 1;
        if self.len > self.segs.len() * GROW_AT {
            self.resize(self.segs.len() * 2);
        }
    }

    fn remove(&mut self, m: &[u8]) -> bool {
        let h = self.hash(m);
        let i = self.seg_of(h);
        match self.segs[i].find_entry(h, |e| &**e == m) {
            Ok(occupied) => {
                occupied.remove();
                self.len -= 1;
                self.bytes -= m.len();
                if self.segs.len() > 1 && self.len < self.segs.len() * SHRINK_AT {
                    self.resize(self.segs.len() / 2);
                }
                true
            }
            Err(_) => false,
        }
    }

    fn resize(&mut self, count: usize) {
        let old = std::mem::take(&mut self.segs);
        self.segs = (0..count).map(|_| HashTable::new()).collect();
        for seg in old {
            for m in seg {
                let h = self.hash(&m);
                let i = self.seg_of(h);
                let hasher = &self.hasher;
                self.segs[i].insert_unique(h, m, |e| hasher.hash_one(&**e));
            }
        }
    }

    /// A member of a uniformly chosen non-empty segment, uniformly within it.
    fn random(&self, rng: &mut Rng) -> &[u8] {
        let n = self.segs.len();
        let start = rng.below(n);
        for step in 0..n {
            let seg = &self.segs[(start + step) & (n - 1)];
            if !seg.is_empty() {
                let pick = rng.below(seg.len());
                return seg.iter().nth(pick).expect("pick within segment");
            }
        }
        unreachable!("random member of an empty set")
    }

    fn scan(&self, cursor: u64, count: usize, mut visit: impl FnMut(&[u8])) -> u64 {
        let mask = (self.segs.len() - 1) as u64;
        let mut v = cursor;
        let mut seen = 0usize;
        // Like Redis, bound the empty segments walked in one call.
        let mut budget = count.saturating_mul(10).max(10);
        loop {
            for m in self.segs[(v & mask) as usize].iter() {
                visit(m);
                seen += 1;
            }
            v = next_reverse_cursor(v, mask);
            budget -= 1;
            if v == 0 || seen >= count || budget == 0 {
                return v;
            }
        }
    }

    fn heap_size(&self) -> usize {
        let slots: usize = self
            .segs
            .iter()
            .map(|s| s.capacity() * (std::mem::size_of::<Box<[u8]>>() + 1))
            .sum();
        let members: usize = self
            .segs
            .iter()
            .flat_map(|s| s.iter())
            .map(|m| m.len())
            .sum();
        slots + members + self.segs.capacity() * std::mem::size_of::<HashTable<Box<[u8]>>>()
    }
}

// ---------------------------------------------------------------------------------------
// The set
// ---------------------------------------------------------------------------------------

#[derive(Clone)]
enum Repr {
    Ints(Ints),
    Pack(Pack),
    Big(Big),
}

#[derive(Clone)]
pub struct Set {
    repr: Repr,
}

impl Default for Set {
    fn default() -> Self {
        Set::new_intset()
    }
}

impl fmt::Debug for Set {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Set({}, {} members)", self.encoding(), self.len())
    }
}

/// Iterates a set's members in its own order.
pub struct Iter<'a>(IterRepr<'a>);

enum IterRepr<'a> {
    Ints(&'a Ints, usize),
    Pack(PackIter<'a>),
    Big {
        segs: std::slice::Iter<'a, HashTable<Box<[u8]>>>,
        cur: Option<hashbrown::hash_table::Iter<'a, Box<[u8]>>>,
    },
}

impl<'a> Iterator for Iter<'a> {
    type Item = Member<'a>;

    fn next(&mut self) -> Option<Member<'a>> {
        match &mut self.0 {
            IterRepr::Ints(ints, i) => {
                if *i < ints.len() {
                    *i += 1;
                    Some(Member::Int(ints.get(*i - 1)))
                } else {
                    None
                }
            }
            IterRepr::Pack(p) => p.next().map(Member::Str),
            IterRepr::Big { segs, cur } => loop {
                if let Some(it) = cur {
                    if let Some(m) = it.next() {
                        return Some(Member::Str(m));
                    }
                }
                *cur = Some(segs.next()?.iter());
            },
        }
    }
}

impl Set {
    /// An empty intset (the start of SUNIONSTORE and SDIFFSTORE results).
    pub fn new_intset() -> Set {
        Set {
            repr: Repr::Ints(Ints::new()),
        }
    }

    /// An empty listpack.
    pub fn new_listpack() -> Set {
        Set {
            repr: Repr::Pack(Pack::default()),
        }
    }

    /// The representation Redis picks for a new set whose first member is `first`, about
    /// `size_hint` members being on their way.
    pub fn create_for(first: &[u8], size_hint: usize) -> Set {
        if parse_canonical_i64(first).is_some() && size_hint <= MAX_INTSET_ENTRIES {
            Set::new_intset()
        } else if size_hint <= MAX_LISTPACK_ENTRIES {
            Set::new_listpack()
        } else {
            Set {
                repr: Repr::Big(Big::with_capacity(size_hint)),
            }
        }
    }

    /// Before adding about `size_hint` members to an existing set: a small form that could
    /// not hold that many becomes a hash table at once, as in Redis.
    pub fn prepare_for(&mut self, size_hint: usize) {
        let convert = match &self.repr {
            Repr::Pack(_) => size_hint > MAX_LISTPACK_ENTRIES,
            Repr::Ints(_) => size_hint > MAX_INTSET_ENTRIES,
            Repr::Big(_) => false,
        };
        if convert {
            self.convert_to_big(size_hint);
        }
    }

    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Ints(i) => i.len(),
            Repr::Pack(p) => p.len,
            Repr::Big(b) => b.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn encoding(&self) -> &'static str {
        match &self.repr {
            Repr::Ints(_) => "intset",
            Repr::Pack(_) => "listpack",
            Repr::Big(_) => "hashtable",
        }
    }

    pub fn is_intset(&self) -> bool {
        matches!(self.repr, Repr::Ints(_))
    }

    pub fn heap_size(&self) -> usize {
        match &self.repr {
            Repr::Ints(i) => i.heap_size(),
            Repr::Pack(p) => p.buf.capacity(),
            Repr::Big(b) => b.heap_size(),
        }
    }

    /// Gives back the spare capacity of a small form after a write, so a small set costs
    /// about what Redis's exactly-sized intset or listpack costs.
    pub fn trim(&mut self) {
        match &mut self.repr {
            Repr::Ints(i) if i.slack() > i.len() / 8 + 4 => i.shrink(),
            Repr::Pack(p) if p.buf.capacity() - p.buf.len() > p.buf.len() / 8 + 16 => {
                p.buf.shrink_to_fit()
            }
            _ => {}
        }
    }

    pub fn iter(&self) -> Iter<'_> {
        Iter(match &self.repr {
            Repr::Ints(i) => IterRepr::Ints(i, 0),
            Repr::Pack(p) => IterRepr::Pack(p.iter()),
            Repr::Big(b) => IterRepr::Big {
                segs: b.segs.iter(),
                cur: None,
            },
        })
    }

    pub fn contains(&self, m: &[u8]) -> bool {
        match &self.repr {
            Repr::Ints(i) => parse_canonical_i64(m).is_some_and(|v| i.contains(v)),
            Repr::Pack(p) => p.find(m).is_some(),
            Repr::Big(b) => b.contains(m),
        }
    }

    pub fn contains_member(&self, m: Member) -> bool {
        match (m, &self.repr) {
            (Member::Int(v), Repr::Ints(i)) => i.contains(v),
            (Member::Str(s), _) => self.contains(s),
            (Member::Int(v), _) => {
                let mut scratch = [0u8; 20];
                self.contains(format_int(v, &mut scratch))
            }
        }
    }

    /// Adds `m`; false when it was already a member. Changes the representation when the
    /// member or the new size no longer fits the current one, with Redis's thresholds.
    pub fn add(&mut self, m: &[u8]) -> bool {
        match &mut self.repr {
            Repr::Ints(ints) => match parse_canonical_i64(m) {
                Some(v) => {
                    if !ints.insert(v) {
                        return false;
                    }
                    if ints.len() > MAX_INTSET_ENTRIES {
                        self.convert_to_big(ints_len(&self.repr));
                    }
                    true
                }
                None => {
                    let n = ints.len();
                    if n < MAX_LISTPACK_ENTRIES && m.len() <= MAX_LISTPACK_VALUE {
                        self.convert_to_pack();
                        if let Repr::Pack(p) = &mut self.repr {
                            p.push(m);
                        }
                    } else {
                        self.convert_to_big(n + 1);
                        if let Repr::Big(b) = &mut self.repr {
                            b.insert_unique(m.into());
                        }
                    }
                    true
                }
            },
            Repr::Pack(p) => {
                if p.find(m).is_some() {
                    return false;
                }
                if p.len < MAX_LISTPACK_ENTRIES && m.len() <= MAX_LISTPACK_VALUE {
                    p.push(m);
                } else {
                    let n = p.len;
                    self.convert_to_big(n + 1);
                    if let Repr::Big(b) = &mut self.repr {
                        b.insert_unique(m.into());
                    }
                }
                true
            }
            Repr::Big(b) => b.insert(m),
        }
    }

    pub fn add_member(&mut self, m: Member) -> bool {
        match (m, &mut self.repr) {
            (Member::Int(v), Repr::Ints(ints)) => {
                if !ints.insert(v) {
                    return false;
                }
                if ints.len() > MAX_INTSET_ENTRIES {
                    self.convert_to_big(ints_len(&self.repr));
                }
                true
            }
            (Member::Str(s), _) => self.add(s),
            (Member::Int(v), _) => {
                let mut scratch = [0u8; 20];
                self.add(format_int(v, &mut scratch))
            }
        }
    }

    pub fn remove(&mut self, m: &[u8]) -> bool {
        match &mut self.repr {
            Repr::Ints(i) => parse_canonical_i64(m).is_some_and(|v| i.remove(v)),
            Repr::Pack(p) => p.remove(m),
            Repr::Big(b) => b.remove(m),
        }
    }

    pub fn remove_member(&mut self, m: Member) -> bool {
        match (m, &mut self.repr) {
            (Member::Int(v), Repr::Ints(i)) => i.remove(v),
            (Member::Str(s), _) => self.remove(s),
            (Member::Int(v), _) => {
                let mut scratch = [0u8; 20];
                self.remove(format_int(v, &mut scratch))
            }
        }
    }

    fn convert_to_big(&mut self, capacity: usize) {
        let mut big = Big::with_capacity(capacity.max(self.len()));
        for m in self.iter() {
            big.insert_unique(m.to_vec().into_boxed_slice());
        }
        self.repr = Repr::Big(big);
    }

    fn convert_to_pack(&mut self) {
        let mut pack = Pack::default();
        for m in self.iter() {
            let mut scratch = [0u8; 20];
            pack.push(m.bytes(&mut scratch));
        }
        self.repr = Repr::Pack(pack);
    }

    /// Becomes an intset when every member is an integer and there are few enough (what
    /// Redis does to an SINTERSTORE result).
    pub fn intset_if_all_integers(&mut self) {
        if self.is_intset() || self.len() > MAX_INTSET_ENTRIES {
            return;
        }
        let mut ints = Ints::new();
        for m in self.iter() {
            let v = match m {
                Member::Int(v) => v,
                Member::Str(s) => match parse_canonical_i64(s) {
                    Some(v) => v,
                    None => return,
                },
            };
            ints.insert(v);
        }
        ints.shrink();
        self.repr = Repr::Ints(ints);
    }

    /// A uniformly chosen member (nearly so for hash tables, like Redis's). The set must
    /// not be empty.
    pub fn random_member(&self, rng: &mut Rng) -> Member<'_> {
        match &self.repr {
            Repr::Ints(i) => Member::Int(i.get(rng.below(i.len()))),
            Repr::Pack(p) => Member::Str(p.nth(rng.below(p.len))),
            Repr::Big(b) => Member::Str(b.random(rng)),
        }
    }

    /// Removes and returns a random member. The set must not be empty.
    pub fn pop_random(&mut self, rng: &mut Rng) -> Vec<u8> {
        match &mut self.repr {
            Repr::Ints(i) => {
                let pos = rng.below(i.len());
                let v = i.remove_at(pos);
                Member::Int(v).to_vec()
            }
            _ => {
                let m = self.random_member(rng).to_vec();
                self.remove(&m);
                m
            }
        }
    }

    /// SPOP with a count smaller than the size: removes `count` random members and returns
    /// them. When few members stay, the ones that stay are picked instead and become a
    /// fresh value, as Redis does (a hash table may then shrink back to a listpack).
    pub fn pop_many(&mut self, count: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
        let size = self.len();
        debug_assert!(count < size);
        let remaining = size - count;
        if remaining * 5 > count {
            if let Repr::Pack(p) = &self.repr {
                let (popped, kept) = p.split(&sample_in_order(size, count, rng));
                let out = popped.iter().map(|m| m.to_vec()).collect();
                self.repr = Repr::Pack(kept);
                return out;
            }
            return (0..count).map(|_| self.pop_random(rng)).collect();
        }
        let kept = match &self.repr {
            Repr::Pack(p) => {
                let (kept, popped) = p.split(&sample_in_order(size, remaining, rng));
                let out = popped.iter().map(|m| m.to_vec()).collect();
                self.repr = Repr::Pack(kept);
                return out;
            }
            Repr::Ints(_) => {
                let mut kept = Set::new_intset();
                for _ in 0..remaining {
                    let m = self.pop_random(rng);
                    kept.add(&m);
                }
                kept
            }
            Repr::Big(_) => {
                let mut kept = Set::new_listpack();
                for _ in 0..remaining {
                    let m = self.pop_random(rng);
                    kept.add(&m);
                }
                kept
            }
        };
        let out = self.iter().map(|m| m.to_vec()).collect();
        *self = kept;
        out
    }

    /// SRANDMEMBER with a positive count smaller than the size: `count` distinct members.
    pub fn sample_distinct(&self, count: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
        let size = self.len();
        match &self.repr {
            Repr::Pack(p) => sample_in_order(size, count, rng)
                .into_iter()
                .map(|i| p.nth(i).to_vec())
                .collect(),
            Repr::Ints(i) => {
                let mut picks = sample_in_order(size, count, rng);
                shuffle(&mut picks, rng);
                picks
                    .into_iter()
                    .map(|k| Member::Int(i.get(k)).to_vec())
                    .collect()
            }
            Repr::Big(b) => {
                if count * 3 > size {
                    let mut all: Vec<&[u8]> =
                        b.segs.iter().flat_map(|s| s.iter()).map(|m| &**m).collect();
                    shuffle(&mut all, rng);
                    all.truncate(count);
                    all.into_iter().map(|m| m.to_vec()).collect()
                } else {
                    let mut seen: hashbrown::HashSet<&[u8]> = hashbrown::HashSet::new();
                    let mut out = Vec::with_capacity(count);
                    while out.len() < count {
                        let m = b.random(rng);
                        if seen.insert(m) {
                            out.push(m.to_vec());
                        }
                    }
                    out
                }
            }
        }
    }

    /// One SSCAN step over a hash table (`count` is a hint); returns the next cursor, 0
    /// when done. The small forms are visited whole and return 0.
    pub fn scan(&self, cursor: u64, count: usize, mut visit: impl FnMut(Member)) -> u64 {
        match &self.repr {
            Repr::Big(b) => b.scan(cursor, count, |m| visit(Member::Str(m))),
            _ => {
                self.iter().for_each(visit);
                0
            }
        }
    }
}

fn ints_len(r: &Repr) -> usize {
    match r {
        Repr::Ints(i) => i.len(),
        _ => 0,
    }
}

fn shuffle<T>(items: &mut [T], rng: &mut Rng) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i + 1);
        items.swap(i, j);
    }
}

// ---------------------------------------------------------------------------------------
// Set algebra, following the algorithms Redis picks so results get the same
// representation and (for the small ones) the same order.
// ---------------------------------------------------------------------------------------

/// Sources of an intersection, smallest first (ties keep argument order).
fn by_size<'a>(sets: &[&'a Set]) -> Vec<&'a Set> {
    let mut v = sets.to_vec();
    v.sort_by_key(|s| s.len());
    v
}

/// The members of the intersection, in the order of the smallest set. Every source must
/// exist (a missing one makes the result empty before this is called).
pub fn intersection<'a>(sets: &[&'a Set]) -> Vec<Member<'a>> {
    let sets = by_size(sets);
    let (first, rest) = sets.split_first().expect("at least one set");
    first
        .iter()
        .filter(|m| {
            rest.iter()
                .all(|s| std::ptr::eq(*s, *first) || s.contains_member(*m))
        })
        .collect()
}

/// SINTERCARD: the size of the intersection, stopping at `limit` (0: no limit).
pub fn intersection_card(sets: &[&Set], limit: usize) -> usize {
    let sets = by_size(sets);
    let (first, rest) = sets.split_first().expect("at least one set");
    let mut n = 0;
    for m in first.iter() {
        if rest
            .iter()
            .all(|s| std::ptr::eq(*s, *first) || s.contains_member(m))
        {
            n += 1;
            if limit != 0 && n >= limit {
                break;
            }
        }
    }
    n
}

/// SINTERSTORE's value: built like the smallest source, then an intset if it can be.
pub fn intersection_set(sets: &[&Set]) -> Set {
    let smallest = sets
        .iter()
        .min_by_key(|s| s.len())
        .expect("at least one set");
    let mut out = if smallest.is_intset() {
        Set::new_intset()
    } else {
        Set::new_listpack()
    };
    for m in intersection(sets) {
        out.add_member(m);
    }
    out.intset_if_all_integers();
    out
}

/// SUNION(STORE): every member of every source, added in source order to a set that
/// starts as an intset.
pub fn union(sets: &[Option<&Set>]) -> Set {
    let mut out = Set::new_intset();
    for s in sets.iter().flatten() {
        for m in s.iter() {
            out.add_member(m);
        }
    }
    out
}

/// SDIFF(STORE): the members of the first source in no other. `same_as_first` says a
/// later argument names the first key again (the result is then empty). Like Redis, a
/// large first set is copied whole and then thinned, which decides the representation.
pub fn difference(sets: &[Option<&Set>], same_as_first: bool) -> Set {
    let mut out = Set::new_intset();
    let Some(Some(first)) = sets.first() else {
        return out;
    };
    if same_as_first {
        return out;
    }
    let present: Vec<&Set> = sets.iter().flatten().copied().collect();
    let scan_first = present.len() * first.len() / 2;
    let scan_all: usize = present.iter().map(|s| s.len()).sum();
    let others: Vec<&Set> = sets[1..].iter().flatten().copied().collect();
    if scan_first <= scan_all {
        for m in first.iter() {
            if !others.iter().any(|s| s.contains_member(m)) {
                out.add_member(m);
            }
        }
    } else {
        for m in first.iter() {
            out.add_member(m);
        }
        for s in others {
            if out.is_empty() {
                break;
            }
            for m in s.iter() {
                out.remove_member(m);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn members(s: &Set) -> Vec<Vec<u8>> {
        s.iter().map(|m| m.to_vec()).collect()
    }

    fn of(items: &[&str]) -> Set {
        let mut s = Set::create_for(items[0].as_bytes(), items.len());
        s.prepare_for(items.len());
        for i in items {
            s.add(i.as_bytes());
        }
        s
    }

    #[test]
    fn intset_widths_and_order() {
        let mut s = Set::new_intset();
        for v in [5i64, -3, 70000, 1, i64::MIN, 5] {
            s.add(v.to_string().as_bytes());
        }
        assert_eq!(s.encoding(), "intset");
        assert_eq!(s.len(), 5);
        let got: Vec<String> = members(&s)
            .into_iter()
            .map(|m| String::from_utf8(m).unwrap())
            .collect();
        assert_eq!(got, ["-9223372036854775808", "-3", "1", "5", "70000"]);
        assert!(s.contains(b"70000"));
        assert!(!s.contains(b"070000"));
        assert!(s.remove(b"-3"));
        assert!(!s.remove(b"-3"));
        assert_eq!(s.len(), 4);
    }

    #[test]
    fn conversions_follow_redis_thresholds() {
        // intset to listpack below 128 members, to hashtable from 128.
        let mut s = Set::new_intset();
        for i in 0..127 {
            s.add(i.to_string().as_bytes());
        }
        s.add(b"x");
        assert_eq!(s.encoding(), "listpack");
        assert_eq!(members(&s).last().unwrap(), b"x");
        assert_eq!(members(&s)[0], b"0");
        let mut s = Set::new_intset();
        for i in 0..128 {
            s.add(i.to_string().as_bytes());
        }
        s.add(b"x");
        assert_eq!(s.encoding(), "hashtable");
        // 512 integers stay an intset, 513 do not.
        let mut s = Set::new_intset();
        for i in 0..512 {
            s.add(i.to_string().as_bytes());
        }
        assert_eq!(s.encoding(), "intset");
        s.add(b"512");
        assert_eq!(s.encoding(), "hashtable");
        assert_eq!(s.len(), 513);
        // listpack: 128 members, 64 bytes each at most.
        let mut s = Set::new_listpack();
        for i in 0..128 {
            s.add(format!("m{i}").as_bytes());
        }
        assert_eq!(s.encoding(), "listpack");
        s.add(b"m0");
        assert_eq!(s.encoding(), "listpack");
        s.add(b"one more");
        assert_eq!(s.encoding(), "hashtable");
        let mut s = Set::new_listpack();
        s.add(&[b'a'; 64]);
        assert_eq!(s.encoding(), "listpack");
        s.add(&[b'a'; 65]);
        assert_eq!(s.encoding(), "hashtable");
        // Never back down.
        s.remove(&[b'a'; 65]);
        assert_eq!(s.encoding(), "hashtable");
    }

    #[test]
    fn create_uses_the_size_hint() {
        assert_eq!(Set::create_for(b"1", 512).encoding(), "intset");
        assert_eq!(Set::create_for(b"1", 513).encoding(), "hashtable");
        assert_eq!(Set::create_for(b"a", 128).encoding(), "listpack");
        assert_eq!(Set::create_for(b"a", 129).encoding(), "hashtable");
        let mut s = of(&["a", "b"]);
        s.prepare_for(129);
        assert_eq!(s.encoding(), "hashtable");
    }

    #[test]
    fn hashtable_scan_sees_stable_members_across_resizes() {
        let mut s = Set::new_listpack();
        for i in 0..600 {
            s.add(format!("stable{i}").as_bytes());
        }
        let mut seen = HashSet::new();
        let mut cursor = 0;
        let mut round = 0;
        loop {
            cursor = s.scan(cursor, 10, |m| {
                seen.insert(m.to_vec());
            });
            round += 1;
            if round % 3 == 0 {
                for j in 0..500 {
                    s.add(format!("tmp{round}-{j}").as_bytes());
                }
            } else if round % 3 == 1 {
                let tmp: Vec<Vec<u8>> = members(&s)
                    .into_iter()
                    .filter(|m| m.starts_with(b"tmp"))
                    .collect();
                for m in tmp {
                    s.remove(&m);
                }
            }
            if cursor == 0 {
                break;
            }
        }
        for i in 0..600 {
            assert!(seen.contains(format!("stable{i}").as_bytes()), "missed {i}");
        }
    }

    #[test]
    fn pops_and_samples() {
        let mut rng = Rng::new(7);
        for (size, count) in [(10, 3), (10, 9), (300, 10), (300, 299), (200, 190)] {
            for ints in [true, false] {
                let mut s = Set::new_intset();
                for i in 0..size {
                    let m = if ints { i.to_string() } else { format!("m{i}") };
                    s.add(m.as_bytes());
                }
                let before: HashSet<Vec<u8>> = members(&s).into_iter().collect();
                let sample = s.sample_distinct(count.min(size - 1), &mut rng);
                let uniq: HashSet<&Vec<u8>> = sample.iter().collect();
                assert_eq!(uniq.len(), sample.len());
                assert!(sample.iter().all(|m| before.contains(m)));
                let popped = s.pop_many(count, &mut rng);
                assert_eq!(popped.len(), count);
                assert_eq!(s.len(), size - count);
                let after: HashSet<Vec<u8>> = members(&s).into_iter().collect();
                let popped: HashSet<Vec<u8>> = popped.into_iter().collect();
                assert_eq!(popped.len(), count);
                assert!(popped.is_disjoint(&after));
                assert_eq!(
                    popped.union(&after).cloned().collect::<HashSet<_>>(),
                    before
                );
            }
        }
        // A hash table popped down to a few members is rebuilt as a listpack.
        let mut s = Set::new_listpack();
        for i in 0..200 {
            s.add(format!("m{i}").as_bytes());
        }
        s.pop_many(195, &mut rng);
        assert_eq!(s.encoding(), "listpack");
        assert_eq!(s.len(), 5);
    }

    #[test]
    fn algebra() {
        let a = of(&["1", "2", "3", "4"]);
        let b = of(&["3", "4", "5", "x"]);
        let c = of(&["4", "3"]);
        let inter: Vec<Vec<u8>> = intersection(&[&a, &b, &c])
            .into_iter()
            .map(|m| m.to_vec())
            .collect();
        // The smallest set (c, an intset) drives the order.
        assert_eq!(inter, [b"3".to_vec(), b"4".to_vec()]);
        assert_eq!(intersection_card(&[&a, &b], 0), 2);
        assert_eq!(intersection_card(&[&a, &b], 1), 1);
        let stored = intersection_set(&[&b, &a]);
        assert_eq!(stored.encoding(), "intset");
        let u = union(&[Some(&a), None, Some(&b)]);
        assert_eq!(u.len(), 6);
        assert_eq!(u.encoding(), "listpack");
        assert_eq!(
            members(&u),
            ["1", "2", "3", "4", "5", "x"]
                .iter()
                .map(|s| s.as_bytes().to_vec())
                .collect::<Vec<_>>()
        );
        let d = difference(&[Some(&a), Some(&b)], false);
        assert_eq!(members(&d), [b"1".to_vec(), b"2".to_vec()]);
        assert_eq!(d.encoding(), "intset");
        assert!(difference(&[Some(&a), Some(&a)], true).is_empty());
        assert!(difference(&[None, Some(&a)], false).is_empty());
    }
}
