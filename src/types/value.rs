//! The values a key can hold.

/// A string value. Redis reports three encodings for strings and clients (and test suites)
/// read them back through OBJECT ENCODING, so the label is kept with the bytes.
#[derive(Clone, Debug)]
pub enum StrValue {
    /// A canonical decimal integer (what Redis stores as `int`).
    Int(i64),
    /// Bytes as first written; short ones are `embstr`, long ones `raw`.
    Plain(Vec<u8>),
    /// Bytes changed in place (APPEND, SETRANGE, SETBIT...): always `raw`.
    Mutated(Vec<u8>),
}

/// Redis stores short strings (up to 44 bytes) in one allocation with their header.
const EMBSTR_MAX: usize = 44;

impl StrValue {
    /// Builds a value from client bytes, choosing the encoding Redis would choose.
    pub fn from_bytes(b: &[u8]) -> StrValue {
        if b.len() <= 20 {
            if let Some(v) = parse_canonical_i64(b) {
                return StrValue::Int(v);
            }
        }
        StrValue::Plain(b.to_vec())
    }

    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        match self {
            StrValue::Int(i) => int_len(*i),
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
            StrValue::Plain(v) if v.len() <= EMBSTR_MAX => "embstr",
            _ => "raw",
        }
    }

    /// The value as an integer, as INCR and friends read it.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            StrValue::Int(i) => Some(*i),
            StrValue::Plain(v) | StrValue::Mutated(v) => parse_canonical_i64(v),
        }
    }

    pub fn heap_size(&self) -> usize {
        match self {
            StrValue::Int(_) => 0,
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
    /// string's bytes, or a collection's header (nothing for an integer).
    pub fn payload_ptr(&self) -> Option<*const u8> {
        match self {
            Value::Str(StrValue::Int(_)) => None,
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
