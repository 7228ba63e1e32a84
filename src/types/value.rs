//! The values a key can hold.

/// A string value. Redis reports three encodings for strings and clients (and test suites)
/// read them back through OBJECT ENCODING, so the label is kept with the bytes.
#[derive(Clone, Debug)]
pub enum StrValue {
    /// A canonical decimal integer (what Redis stores as `int`).
    Int(i64),
    /// Bytes as first written, up to `SMALL_MAX`, kept in the key's entry: no allocation
    /// for SET and no miss of their own for GET. `embstr`, as in Redis.
    Small(SmallStr),
    /// Bytes as first written; short ones are `embstr`, long ones `raw`.
    Plain(Vec<u8>),
    /// Bytes changed in place (APPEND, SETRANGE, SETBIT...): always `raw`.
    Mutated(Vec<u8>),
}

/// Redis stores short strings (up to 44 bytes) in one allocation with their header.
const EMBSTR_MAX: usize = 44;

/// The longest string kept in the entry: what fits beside `StrValue`'s tag and a length
/// byte in the 32 bytes a `Vec` variant takes anyway (`Entry` stays 64 bytes: checked in
/// `table.rs`).
pub const SMALL_MAX: usize = 30;

/// A short string's bytes, inline.
#[derive(Clone, Copy)]
pub struct SmallStr {
    len: u8,
    bytes: [u8; SMALL_MAX],
}

impl SmallStr {
    /// `None` when `b` is longer than `SMALL_MAX`.
    pub fn new(b: &[u8]) -> Option<SmallStr> {
        let mut bytes = [0u8; SMALL_MAX];
        bytes.get_mut(..b.len())?.copy_from_slice(b);
        Some(SmallStr {
            len: b.len() as u8,
            bytes,
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl std::fmt::Debug for SmallStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_slice(), f)
    }
}

impl StrValue {
    /// Builds a value from client bytes, choosing the encoding Redis would choose.
    pub fn from_bytes(b: &[u8]) -> StrValue {
        if b.len() <= 20 {
            if let Some(v) = parse_canonical_i64(b) {
                return StrValue::Int(v);
            }
        }
        StrValue::from_bytes_not_int(b)
    }

    /// A string that is kept as bytes even when it reads as an integer (INCRBYFLOAT's
    /// result, which Redis never stores as `int`): in the entry when short.
    pub fn from_bytes_not_int(b: &[u8]) -> StrValue {
        match SmallStr::new(b) {
            Some(small) => StrValue::Small(small),
            None => StrValue::Plain(b.to_vec()),
        }
    }

    /// The bytes of a value stored as bytes; `None` for an integer.
    pub fn raw_bytes(&self) -> Option<&[u8]> {
        match self {
            StrValue::Int(_) => None,
            StrValue::Small(s) => Some(s.as_slice()),
            StrValue::Plain(v) | StrValue::Mutated(v) => Some(v),
        }
    }

    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        match self {
            StrValue::Int(i) => int_len(*i),
            StrValue::Small(s) => s.len as usize,
            StrValue::Plain(v) | StrValue::Mutated(v) => v.len(),
        }
    }

    /// The bytes of the value; integers are rendered into `scratch`.
    pub fn as_bytes<'a>(&'a self, scratch: &'a mut [u8; 20]) -> &'a [u8] {
        match self {
            StrValue::Int(i) => {
                let mut n = i.unsigned_abs();
                let mut pos = scratch.len();
                loop {
                    pos -= 1;
                    scratch[pos] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                if *i < 0 {
                    pos -= 1;
                    scratch[pos] = b'-';
                }
                &scratch[pos..]
            }
            StrValue::Small(s) => s.as_slice(),
            StrValue::Plain(v) | StrValue::Mutated(v) => v,
        }
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut s = [0u8; 20];
        self.as_bytes(&mut s).to_vec()
    }

    /// The bytes, for in-place mutation; the value becomes `raw` as in Redis.
    pub fn make_mut(&mut self) -> &mut Vec<u8> {
        let owned = match std::mem::replace(self, StrValue::Mutated(Vec::new())) {
            StrValue::Int(i) => i.to_string().into_bytes(),
            StrValue::Small(s) => s.as_slice().to_vec(),
            StrValue::Plain(v) | StrValue::Mutated(v) => v,
        };
        *self = StrValue::Mutated(owned);
        match self {
            StrValue::Mutated(v) => v,
            _ => unreachable!(),
        }
    }

    pub fn encoding(&self) -> &'static str {
        match self {
            StrValue::Int(_) => "int",
            StrValue::Small(_) => "embstr",
            StrValue::Plain(v) if v.len() <= EMBSTR_MAX => "embstr",
            _ => "raw",
        }
    }

    /// The value as an integer, as INCR and friends read it.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            StrValue::Int(i) => Some(*i),
            StrValue::Small(s) => parse_canonical_i64(s.as_slice()),
            StrValue::Plain(v) | StrValue::Mutated(v) => parse_canonical_i64(v),
        }
    }

    pub fn heap_size(&self) -> usize {
        match self {
            StrValue::Int(_) | StrValue::Small(_) => 0,
            StrValue::Plain(v) | StrValue::Mutated(v) => v.capacity(),
        }
    }
}

fn int_len(i: i64) -> usize {
    let mut n = i.unsigned_abs();
    let mut len = if i < 0 { 2 } else { 1 };
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

/// Parses an integer written exactly as Redis's `string2ll` accepts it: optional `-`, no
/// leading zeros, no `+`, no spaces, within i64.
pub fn parse_canonical_i64(b: &[u8]) -> Option<i64> {
    if b.is_empty() || b.len() > 20 {
        return None;
    }
    if b == b"0" {
        return Some(0);
    }
    let (neg, digits) = if b[0] == b'-' {
        (true, &b[1..])
    } else {
        (false, b)
    };
    if digits.is_empty() || digits[0] == b'0' {
        return None;
    }
    let mut acc: u64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        acc = acc.checked_mul(10)?.checked_add((c - b'0') as u64)?;
    }
    if neg {
        if acc > i64::MAX as u64 + 1 {
            None
        } else {
            Some((acc as i64).wrapping_neg())
        }
    } else if acc > i64::MAX as u64 {
        None
    } else {
        Some(acc as i64)
    }
}

// A short string fits in the 32 bytes a value takes anyway: keep it so.
const _: () = assert!(std::mem::size_of::<Value>() == 32);

/// What a key holds. Each data type lives in its own module; the enum only names them.
#[derive(Clone, Debug)]
pub enum Value {
    Str(StrValue),
    List(Box<super::list::List>),
    Hash(Box<super::hash::Hash>),
    Set(Box<super::set::Set>),
    ZSet(Box<super::zset::ZSet>),
    Stream(Box<super::stream::Stream>),
}

impl Value {
    /// Where a command on this value reads first after its entry, for a prefetch: a
    /// string's bytes, or a collection's header (nothing for an integer or a string kept in
    /// the entry).
    pub fn payload_ptr(&self) -> Option<*const u8> {
        match self {
            Value::Str(StrValue::Int(_) | StrValue::Small(_)) => None,
            Value::Str(StrValue::Plain(v) | StrValue::Mutated(v)) => Some(v.as_ptr()),
            Value::List(l) => Some((&**l as *const super::list::List).cast()),
            Value::Hash(h) => Some((&**h as *const super::hash::Hash).cast()),
            Value::Set(s) => Some((&**s as *const super::set::Set).cast()),
            Value::ZSet(z) => Some((&**z as *const super::zset::ZSet).cast()),
            Value::Stream(s) => Some((&**s as *const super::stream::Stream).cast()),
        }
    }

    /// The name TYPE reports.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::List(_) => "list",
            Value::Hash(_) => "hash",
            Value::Set(_) => "set",
            Value::ZSet(_) => "zset",
            Value::Stream(_) => "stream",
        }
    }

    pub fn encoding(&self) -> &'static str {
        match self {
            Value::Str(s) => s.encoding(),
            Value::List(l) => l.encoding(),
            Value::Hash(h) => h.encoding(),
            Value::Set(s) => s.encoding(),
            Value::ZSet(z) => z.encoding(),
            Value::Stream(x) => x.encoding(),
        }
    }

    /// An estimate of the heap bytes the value holds, for MEMORY USAGE and eviction.
    pub fn heap_size(&self) -> usize {
        match self {
            Value::Str(s) => s.heap_size(),
            Value::List(l) => l.heap_size(),
            Value::Hash(h) => h.heap_size(),
            Value::Set(s) => s.heap_size(),
            Value::ZSet(z) => z.heap_size(),
            Value::Stream(x) => x.heap_size(),
        }
    }
}

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_strings_stay_in_the_entry_and_read_back_the_same() {
        for len in 0..=EMBSTR_MAX + 2 {
            let b: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let v = StrValue::from_bytes(&b);
            assert_eq!(
                matches!(v, StrValue::Small(_)),
                len <= SMALL_MAX,
                "len {len}"
            );
            let mut scratch = [0u8; 20];
            assert_eq!(v.as_bytes(&mut scratch), &b[..]);
            assert_eq!(v.raw_bytes(), Some(&b[..]));
            assert_eq!(v.len(), len);
            assert_eq!(v.heap_size() == 0, len <= SMALL_MAX, "len {len}");
            let want = if len <= EMBSTR_MAX { "embstr" } else { "raw" };
            assert_eq!(v.encoding(), want, "len {len}");
            let mut m = v.clone();
            m.make_mut().push(b'!');
            assert_eq!(m.encoding(), "raw");
            assert_eq!(m.len(), len + 1);
        }
        let n = StrValue::from_bytes(b"12345");
        assert!(matches!(n, StrValue::Int(12345)));
        assert_eq!(n.raw_bytes(), None);
        assert_eq!(StrValue::from_bytes(b"012").as_i64(), None);
        assert_eq!(StrValue::from_bytes(b"-0").encoding(), "embstr");
    }

    #[test]
    fn canonical_integers() {
        assert_eq!(parse_canonical_i64(b"0"), Some(0));
        assert_eq!(parse_canonical_i64(b"-0"), None);
        assert_eq!(parse_canonical_i64(b"007"), None);
        assert_eq!(parse_canonical_i64(b"+7"), None);
        assert_eq!(parse_canonical_i64(b" 7"), None);
        assert_eq!(parse_canonical_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_canonical_i64(b"9223372036854775808"), None);
    }

    #[test]
    fn encodings_follow_redis() {
        assert_eq!(StrValue::from_bytes(b"123").encoding(), "int");
        assert_eq!(StrValue::from_bytes(b"abc").encoding(), "embstr");
        assert_eq!(StrValue::from_bytes(&[b'x'; 45]).encoding(), "raw");
        let mut s = StrValue::from_bytes(b"12");
        s.make_mut().push(b'3');
        assert_eq!(s.encoding(), "raw");
        let mut scratch = [0u8; 20];
        assert_eq!(s.as_bytes(&mut scratch), b"123");
        assert_eq!(StrValue::Int(-45).len(), 3);
    }
}
