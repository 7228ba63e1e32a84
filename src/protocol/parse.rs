//! Incremental, zero-copy parser for client requests, matching Redis 7.2.
//!
//! Two request forms are accepted, chosen by the first byte of a request:
//!
//! * multibulk (`*`): `*<count>\r\n` followed by `count` bulk arguments
//!   `$<len>\r\n<len bytes>\r\n`;
//! * inline (anything else): one line up to `\n` (a `\r` before it is dropped),
//!   split into arguments like `redis-cli` does (spaces, double quotes with
//!   escapes, single quotes).
//!
//! The parser keeps its place between calls: arguments that are complete are
//! split off the buffer at once and a header line that is still incomplete is
//! never scanned twice, so a request arriving in many reads costs time linear
//! in its size.
//!
//! Redis quirks reproduced on purpose (differential tests compare with a real
//! server):
//!
//! * numbers follow Redis's `string2ll`: an optional `-`, no `+`, no spaces, no
//!   leading zeros (`0` alone is fine, `-0` is not), at most 20 characters;
//! * a header line ends at the first `\r`; the byte after it is skipped
//!   without being checked, and so are the two bytes after a bulk payload
//!   (they should be `\r\n` but are never looked at);
//! * lines are searched like C strings: a NUL byte before the terminator hides
//!   it, so the request stays incomplete until more than 64 KiB is buffered
//!   and then fails as "too big";
//! * the multibulk count may be anything up to `i32::MAX` (Redis 7 removed the
//!   old limit of 1024*1024); a count `<= 0` is an empty request.

use bytes::{Buf, Bytes, BytesMut};
use std::fmt;

/// Longest header line or inline request that may wait for its terminator
/// (`PROTO_INLINE_MAX_SIZE` in Redis).
pub const MAX_LINE_LEN: usize = 64 * 1024;

/// Bulk arguments at least this long get their whole size (up to 1 GiB)
/// reserved in the buffer as soon as their header is read
/// (`PROTO_MBULK_BIG_ARG` in Redis).
pub const BIG_ARG_LEN: usize = 32 * 1024;

/// Largest multibulk count accepted (Redis 7 allows up to `INT_MAX`).
pub const MAX_MULTIBULK_LEN: i64 = i32::MAX as i64;

/// Most buffer space reserved for a big bulk before its bytes arrive (the
/// default proto-max-bulk-len is below it); a larger bulk grows the buffer as
/// it is read. Keeps an absurd configured limit from aborting on allocation.
const MAX_UPFRONT_RESERVE: usize = 1 << 30;

/// Most argument slots allocated before the arguments actually arrive.
const INITIAL_ARGS_CAPACITY: usize = 1024;

/// Largest multibulk count accepted from a client that must still authenticate.
const UNAUTH_MAX_MULTIBULK_LEN: i64 = 10;

/// Largest bulk accepted from a client that must still authenticate.
const UNAUTH_MAX_BULK_LEN: i64 = 16 * 1024;

const ERR_TOO_BIG_INLINE: &str = "ERR Protocol error: too big inline request";
const ERR_TOO_BIG_MBULK: &str = "ERR Protocol error: too big mbulk count string";
const ERR_TOO_BIG_BULK: &str = "ERR Protocol error: too big bulk count string";
const ERR_INVALID_MBULK: &str = "ERR Protocol error: invalid multibulk length";
const ERR_INVALID_BULK: &str = "ERR Protocol error: invalid bulk length";
const ERR_UNAUTH_MBULK: &str = "ERR Protocol error: unauthenticated multibulk length";
const ERR_UNAUTH_BULK: &str = "ERR Protocol error: unauthenticated bulk length";
const ERR_UNBALANCED: &str = "ERR Protocol error: unbalanced quotes in request";

/// Limits applied while parsing requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseLimits {
    /// Largest bulk argument accepted (`proto-max-bulk-len`).
    pub max_bulk_len: usize,
}

impl Default for ParseLimits {
    fn default() -> Self {
        ParseLimits {
            max_bulk_len: 512 * 1024 * 1024,
        }
    }
}

/// A protocol error: the text is the full error message WITHOUT the leading
/// '-', e.g. "ERR Protocol error: invalid multibulk length". After it the
/// server replies it and closes the connection.
///
/// The text is ASCII except in one case: "expected '$', got 'X'" names the
/// byte found, and a byte of 0x80 or above is stored as the char with the same
/// number (U+0080..U+00FF). [`ProtocolError::to_bytes`] gives the exact bytes
/// Redis would send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl ProtocolError {
    fn new(msg: &str) -> Self {
        ProtocolError(msg.to_owned())
    }

    /// The message as the bytes Redis puts on the wire (still without the
    /// leading '-' and the trailing CRLF): each char up to U+00FF becomes one
    /// byte, so a non-ASCII byte named in "expected '$', got 'X'" comes out
    /// as that single byte.
    #[allow(dead_code)]
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0
            .chars()
            .map(|c| u8::try_from(u32::from(c)).unwrap_or(b'?'))
            .collect()
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtocolError {}

/// Emptied argument vectors of commands already run, kept for the next requests, so that
/// a request's vector is neither allocated nor freed on the common path
/// (`RequestParser::whole_commands` takes from here, the dispatcher gives back).
#[derive(Debug, Default)]
pub struct SpareArgs(Vec<Vec<Bytes>>);

impl SpareArgs {
    /// A pipeline of 16's worth: a deeper one allocates past it, as before.
    const KEEP: usize = 16;
    /// A vector grown by a long request (MSET, a big HSET) is not kept.
    const MAX_CAPACITY: usize = 16;

    pub fn give(&mut self, mut args: Vec<Bytes>) {
        if self.0.len() < Self::KEEP && args.capacity() <= Self::MAX_CAPACITY {
            args.clear();
            self.0.push(args);
        }
    }

    fn take(&mut self, count: usize) -> Vec<Bytes> {
        if count <= Self::MAX_CAPACITY {
            if let Some(mut args) = self.0.pop() {
                args.reserve_exact(count);
                return args;
            }
        }
        Vec::with_capacity(count)
    }

    /// What the kept vectors hold, for the client's memory figure.
    pub fn bytes(&self) -> usize {
        self.0
            .iter()
            .map(|a| a.capacity() * std::mem::size_of::<Bytes>())
            .sum()
    }
}

/// Keeps state between calls so that a huge multibulk (1M args) or a huge
/// bulk (500 MB) arriving in many reads is never re-parsed from the start
/// (no quadratic cost).
///
/// Between calls that return `Ok(None)` the caller may only append to the
/// buffer (read more bytes into it); it must not drop or change bytes already
/// in it.
#[derive(Debug, Default)]
pub struct RequestParser {
    /// Arguments of the multibulk in progress that are already complete.
    args: Vec<Bytes>,
    /// Arguments of the multibulk in progress not yet complete; zero when no
    /// multibulk is in progress.
    remaining: usize,
    /// Length of the bulk argument whose header has been read but whose
    /// payload has not fully arrived.
    bulk_len: Option<usize>,
    /// Bytes at the front of the buffer already searched, in vain, for the
    /// terminator of the current line; or where a NUL byte stopped the search.
    scan_from: usize,
    /// Apply Redis's limits for clients that have not authenticated yet.
    auth_required: bool,
    /// Where the arguments of the requests found by `whole_commands` lie, and how many
    /// each request has: kept between calls so that no group allocates them.
    spans: Vec<(usize, usize)>,
    counts: Vec<usize>,
    /// Bytes looked at by terminator searches (to check linear parsing).
    #[cfg(test)]
    scanned: usize,
    /// Never take `whole_command`'s fast path (to compare the two paths).
    #[cfg(test)]
    slow_only: bool,
}

impl RequestParser {
    /// A parser waiting for the first byte of a request.
    #[allow(dead_code)]
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the next complete command from the front of `buf`, consuming its bytes.
    ///
    /// * `Ok(Some(args))`: one command (args non-empty; each arg a zero-copy
    ///   `Bytes` split off `buf`, except inline arguments written with quotes).
    /// * `Ok(None)`: need more bytes (partial state kept inside self;
    ///   already-complete args may already be consumed from buf).
    /// * `Err(e)`: protocol error; the connection will be closed. The parser is
    ///   reset, but what is left in `buf` is meaningless.
    ///
    /// Empty commands (an empty inline line, `*0\r\n`, `*-1\r\n`) are skipped
    /// silently as Redis does: parsing continues with what follows.
    pub fn next_command(
        &mut self,
        buf: &mut BytesMut,
        limits: &ParseLimits,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let result = self.parse(buf, limits);
        if result.is_err() {
            self.reset();
        }
        result
    }

    /// Takes every request that lies whole at the front of `buf` and is written the plain
    /// way (as `whole_command` wants), up to `room` of them, and appends each one's
    /// arguments to `out`. They leave the buffer as one piece, whose slices their
    /// arguments are: one split per group, not one per request. Returns how many it took.
    /// It stops at the first request that is not whole or not plain, which
    /// `next_command` then reads (so replies and errors stay exactly its own), and takes
    /// nothing while a request is under way or limits for an unauthenticated client
    /// apply.
    pub fn whole_commands(
        &mut self,
        buf: &mut BytesMut,
        limits: &ParseLimits,
        out: &mut Vec<Vec<Bytes>>,
        room: usize,
        spare: &mut SpareArgs,
    ) -> usize {
        #[cfg(test)]
        if self.slow_only {
            return 0;
        }
        if self.remaining != 0 || self.auth_required {
            return 0;
        }
        let b = &buf[..];
        // Worked on as locals: through `self` each push would reload the vectors.
        let mut spans = std::mem::take(&mut self.spans);
        let mut counts = std::mem::take(&mut self.counts);
        spans.clear();
        counts.clear();
        let mut pos = 0;
        'requests: while counts.len() < room {
            let Some((count, mut at)) = plain_length(b, pos, b'*') else {
                break;
            };
            // A count the buffer cannot hold is left to `next_command`.
            if count == 0
                || count.saturating_mul(MIN_ARG_BYTES) > b.len() - at
                || count as i64 > MAX_MULTIBULK_LEN
            {
                break;
            }
            let first = spans.len();
            for _ in 0..count {
                let whole = plain_length(b, at, b'$').and_then(|(len, start)| {
                    let end = start.checked_add(len)?;
                    // The two bytes after the payload are skipped unchecked, as the slow
                    // path does.
                    (len <= limits.max_bulk_len && end.checked_add(2)? <= b.len())
                        .then_some((start, end))
                });
                let Some((start, end)) = whole else {
                    spans.truncate(first);
                    break 'requests;
                };
                spans.push((start, end));
                at = end + 2;
            }
            pos = at;
            counts.push(count);
        }
        let taken = counts.len();
        if taken > 0 {
            let frame = buf.split_to(pos).freeze();
            self.scan_from = 0;
            out.reserve(taken);
            let mut next = 0;
            for &count in &counts {
                let mut args = spare.take(count);
                for &(start, end) in &spans[next..next + count] {
                    args.push(frame.slice(start..end));
                }
                next += count;
                out.push(args);
            }
        }
        // A huge request's places are not kept for the connection's life.
        if spans.capacity() <= 4096 {
            self.spans = spans;
        }
        self.counts = counts;
        taken
    }

    /// True when a command is partially parsed (used to know if a client
    /// vanished mid-frame): a multibulk header, and maybe some of its
    /// arguments, have been consumed from the buffer. The start of an
    /// incomplete line (an inline request or a header) stays in the buffer
    /// and does not count here: check the buffer for that.
    #[allow(dead_code)]
    /// Bytes of the complete arguments of the request in progress.
    pub fn held_bytes(&self) -> usize {
        self.args.iter().map(|a| a.len()).sum()
    }

    pub fn in_progress(&self) -> bool {
        self.remaining > 0
    }

    /// Whether the client still has to authenticate. While it has to, Redis
    /// refuses a multibulk of more than 10 arguments ("unauthenticated
    /// multibulk length") and a bulk of more than 16384 bytes
    /// ("unauthenticated bulk length"). Off by default. Redis applies the
    /// limits as each command is parsed, so clear it right after a successful
    /// AUTH/HELLO, before parsing the next command of a pipeline.
    #[allow(dead_code)]
    pub fn set_auth_required(&mut self, required: bool) {
        self.auth_required = required;
    }

    fn reset(&mut self) {
        self.args = Vec::new();
        self.remaining = 0;
        self.bulk_len = None;
        self.scan_from = 0;
    }

    fn parse(
        &mut self,
        buf: &mut BytesMut,
        limits: &ParseLimits,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        #[cfg(test)]
        let fast = !self.slow_only;
        #[cfg(not(test))]
        let fast = true;
        if fast && self.remaining == 0 && !self.auth_required {
            if let Some(args) = whole_command(buf, limits.max_bulk_len) {
                self.scan_from = 0;
                return Ok(Some(args));
            }
        }
        while self.remaining == 0 {
            let Some(&first) = buf.first() else {
                return Ok(None);
            };
            if first == b'*' {
                if !self.parse_multibulk_header(buf)? {
                    return Ok(None);
                }
            } else {
                match self.parse_inline(buf)? {
                    None => return Ok(None),
                    Some(args) if args.is_empty() => {}
                    Some(args) => return Ok(Some(args)),
                }
            }
        }
        self.parse_bulks(buf, limits)
    }

    /// Reads a `*<count>` line. Returns false when the line is incomplete;
    /// true when it was consumed, with `remaining` set (left at zero for an
    /// empty request).
    fn parse_multibulk_header(&mut self, buf: &mut BytesMut) -> Result<bool, ProtocolError> {
        let Some(cr) = self.header_line(buf, ERR_TOO_BIG_MBULK)? else {
            return Ok(false);
        };
        let count = match parse_redis_int(&buf[1..cr]) {
            Some(n) if n <= MAX_MULTIBULK_LEN => n,
            _ => return Err(ProtocolError::new(ERR_INVALID_MBULK)),
        };
        if self.auth_required && count > UNAUTH_MAX_MULTIBULK_LEN {
            return Err(ProtocolError::new(ERR_UNAUTH_MBULK));
        }
        self.consume(buf, cr + 2);
        if count > 0 {
            // `count <= i32::MAX`, so it fits in usize.
            let count = usize::try_from(count).unwrap_or(usize::MAX);
            self.remaining = count;
            self.args = Vec::with_capacity(count.min(INITIAL_ARGS_CAPACITY));
        }
        Ok(true)
    }

    /// Reads the bulk arguments of the multibulk in progress, as many as the
    /// buffer holds; returns the command once the last one is complete.
    fn parse_bulks(
        &mut self,
        buf: &mut BytesMut,
        limits: &ParseLimits,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        while self.remaining > 0 {
            let len = match self.bulk_len {
                Some(len) => len,
                None => {
                    let Some(cr) = self.header_line(buf, ERR_TOO_BIG_BULK)? else {
                        return Ok(None);
                    };
                    if buf[0] != b'$' {
                        return Err(expected_dollar(buf[0]));
                    }
                    let len = self.bulk_length(&buf[1..cr], limits)?;
                    self.consume(buf, cr + 2);
                    // Make room for the whole bulk now so that the reads
                    // filling it never reallocate and copy it again.
                    let target = len.saturating_add(2).min(MAX_UPFRONT_RESERVE);
                    if len >= BIG_ARG_LEN && buf.len() < target {
                        buf.reserve(target - buf.len());
                    }
                    self.bulk_len = Some(len);
                    len
                }
            };
            if buf.len() < len.saturating_add(2) {
                return Ok(None);
            }
            let arg = buf.split_to(len).freeze();
            // Redis skips the two bytes after the payload without checking
            // that they are CRLF.
            buf.advance(2);
            self.bulk_len = None;
            self.push_arg(arg);
        }
        Ok(Some(std::mem::take(&mut self.args)))
    }

    /// Validates the number of a `$<len>` line.
    fn bulk_length(&self, digits: &[u8], limits: &ParseLimits) -> Result<usize, ProtocolError> {
        let len = parse_redis_int(digits)
            .and_then(|n| u64::try_from(n).ok())
            .filter(|&n| n <= limits.max_bulk_len as u64)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| ProtocolError::new(ERR_INVALID_BULK))?;
        if self.auth_required && len as u64 > UNAUTH_MAX_BULK_LEN as u64 {
            return Err(ProtocolError::new(ERR_UNAUTH_BULK));
        }
        Ok(len)
    }

    /// Adds a complete argument, growing the vector at most to the number of
    /// arguments the request still announces.
    fn push_arg(&mut self, arg: Bytes) {
        if self.args.len() == self.args.capacity() {
            let grow = self.args.capacity().max(1).min(self.remaining);
            self.args.reserve_exact(grow);
        }
        self.args.push(arg);
        self.remaining -= 1;
    }

    /// Finds the header line at the front of `buf` (it starts with `*` or `$`).
    /// Returns the position of its `\r` once the byte after it has arrived too.
    fn header_line(
        &mut self,
        buf: &BytesMut,
        too_big: &'static str,
    ) -> Result<Option<usize>, ProtocolError> {
        match self.find_terminator(buf, b'\r') {
            Some(cr) if cr + 2 <= buf.len() => Ok(Some(cr)),
            Some(_) => Ok(None),
            None if buf.len() > MAX_LINE_LEN => Err(ProtocolError::new(too_big)),
            None => Ok(None),
        }
    }

    /// Reads one inline request line. Returns its arguments (maybe none) once
    /// the line is complete.
    fn parse_inline(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let Some(nl) = self.find_terminator(buf, b'\n') else {
            if buf.len() > MAX_LINE_LEN {
                return Err(ProtocolError::new(ERR_TOO_BIG_INLINE));
            }
            return Ok(None);
        };
        let end = if nl > 0 && buf[nl - 1] == b'\r' {
            nl - 1
        } else {
            nl
        };
        let mut line = buf.split_to(nl + 1).freeze();
        self.scan_from = 0;
        line.truncate(end);
        match split_inline(&line) {
            Some(args) => Ok(Some(args)),
            None => Err(ProtocolError::new(ERR_UNBALANCED)),
        }
    }

    /// Searches `buf` for `target` like C's `strchr`: a NUL byte met first
    /// ends the search in vain. Resumes where the last search of the same
    /// line stopped.
    fn find_terminator(&mut self, buf: &[u8], target: u8) -> Option<usize> {
        let from = self.scan_from.min(buf.len());
        let found = buf[from..].iter().position(|&b| b == target || b == 0);
        #[cfg(test)]
        {
            self.scanned += found.map_or(buf.len() - from, |i| i + 1);
        }
        match found {
            Some(i) => {
                let pos = from + i;
                // Found either the terminator or a NUL that hides it for good;
                // both are met again at once by the next search.
                self.scan_from = pos;
                (buf[pos] == target).then_some(pos)
            }
            None => {
                self.scan_from = buf.len();
                None
            }
        }
    }

    /// Drops `n` bytes from the front of `buf`.
    fn consume(&mut self, buf: &mut BytesMut, n: usize) {
        buf.advance(n);
        self.scan_from = 0;
    }
}

/// Most arguments whose places [`whole_command`] keeps on the stack; a longer request
/// keeps them in a vector.
const FAST_STACK_ARGS: usize = 16;

/// The fewest bytes one argument takes: `$0\r\n\r\n`.
const MIN_ARG_BYTES: usize = 6;

/// The common case, done cheaply: a multibulk request that is whole in the buffer,
/// written the plain way (`*N\r\n`, then `$L\r\n<L bytes>\r\n` each). It is split off the
/// buffer at once and its arguments are slices of that one piece: one split instead of
/// one per argument and per header line. Anything else (an incomplete request, an empty
/// one, an odd number, a NUL, a length past the limit) returns `None` without touching
/// `buf`, and the incremental parser decides, so replies and errors stay exactly what it
/// gives. It is tried only where a request starts (the incremental parser carries on
/// with a request it has begun), so a long request arriving in pieces is not rescanned.
/// Long requests matter too: Sidekiq's BRPOP names every queue of a process, and
/// the incremental parser costs several hundred instructions an argument (callgrind).
fn whole_command(buf: &mut BytesMut, max_bulk_len: usize) -> Option<Vec<Bytes>> {
    let b = &buf[..];
    let (count, pos) = plain_length(b, 0, b'*')?;
    if count == 0 {
        return None;
    }
    if count <= FAST_STACK_ARGS {
        let mut spans = [(0usize, 0usize); FAST_STACK_ARGS];
        let end = bulk_spans(b, pos, max_bulk_len, &mut spans[..count])?;
        return Some(split_frame(buf, end, &spans[..count]));
    }
    // A count the buffer cannot hold is left to the incremental parser before any vector
    // of that size is made.
    if count > (b.len() - pos) / MIN_ARG_BYTES || count as i64 > MAX_MULTIBULK_LEN {
        return None;
    }
    let mut spans = vec![(0usize, 0usize); count];
    let end = bulk_spans(b, pos, max_bulk_len, &mut spans)?;
    Some(split_frame(buf, end, &spans))
}

/// The key the request `b` starts with most likely names, where the bytes up to it are
/// there and plain: the argument after the command name, or for a script call (EVAL,
/// EVALSHA, FCALL and their read-only forms) the first of its declared keys. A hint for
/// loading a key before the request is parsed for real, which alone decides what the
/// bytes mean.
pub fn peek_first_key(b: &[u8]) -> Option<&[u8]> {
    let (count, pos) = plain_length(b, 0, b'*')?;
    if count < 2 {
        return None;
    }
    let (name_len, name_at) = plain_length(b, pos, b'$')?;
    let name_end = name_at.checked_add(name_len)?;
    let name = b.get(name_at..name_end)?;
    let (len, at) = plain_length(b, name_end.checked_add(2)?, b'$')?;
    let first_end = at.checked_add(len)?;
    if !is_script_call(name) {
        return b.get(at..first_end);
    }
    let (n_len, n_at) = plain_length(b, first_end.checked_add(2)?, b'$')?;
    let n_end = n_at.checked_add(n_len)?;
    if count < 4 || !declares_keys(b.get(n_at..n_end)?) {
        return None;
    }
    let (key_len, key_at) = plain_length(b, n_end.checked_add(2)?, b'$')?;
    b.get(key_at..key_at.checked_add(key_len)?)
}

/// `peek_first_key` for a parsed request.
pub fn first_key(args: &[Bytes]) -> Option<&Bytes> {
    match args.first() {
        Some(name) if is_script_call(name) => args.get(3).filter(|_| declares_keys(&args[2])),
        _ => args.get(1),
    }
}

/// EVAL, EVALSHA, FCALL or a read-only form: a body or name, then the number of keys,
/// then the keys.
fn is_script_call(name: &[u8]) -> bool {
    matches!(name.len(), 4 | 5 | 7 | 8 | 10)
        && matches!(name[0], b'e' | b'E' | b'f' | b'F')
        && [
            &b"eval"[..],
            b"evalsha",
            b"eval_ro",
            b"evalsha_ro",
            b"fcall",
            b"fcall_ro",
        ]
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n))
}

/// A script call's number of keys is a positive decimal.
fn declares_keys(numkeys: &[u8]) -> bool {
    numkeys.first().is_some_and(|&d| (b'1'..=b'9').contains(&d))
        && numkeys.iter().all(u8::is_ascii_digit)
}

/// Finds where each bulk of a request lies, starting at `pos`; returns where the request
/// ends, or `None` if any bulk is not plain, too long or not all there.
#[inline]
fn bulk_spans(
    b: &[u8],
    mut pos: usize,
    max_bulk_len: usize,
    spans: &mut [(usize, usize)],
) -> Option<usize> {
    for span in spans {
        let (len, start) = plain_length(b, pos, b'$')?;
        if len > max_bulk_len {
            return None;
        }
        // The two bytes after the payload are skipped unchecked, as the slow path does.
        let end = start.checked_add(len)?;
        if end.checked_add(2)? > b.len() {
            return None;
        }
        *span = (start, end);
        pos = end + 2;
    }
    Some(pos)
}

fn split_frame(buf: &mut BytesMut, end: usize, spans: &[(usize, usize)]) -> Vec<Bytes> {
    let frame = buf.split_to(end).freeze();
    spans
        .iter()
        .map(|&(start, end)| frame.slice(start..end))
        .collect()
}

/// Reads `<marker><digits>\r\n` at `at`: a number with no sign and no leading zero
/// (a lone `0` is fine), short enough not to overflow. Returns it and where the line
/// ends, or `None` for anything else (the slow path then reads the same bytes).
#[inline]
fn plain_length(b: &[u8], at: usize, marker: u8) -> Option<(usize, usize)> {
    if *b.get(at)? != marker {
        return None;
    }
    let mut i = at + 1;
    let first = *b.get(i)?;
    let mut n = (first.wrapping_sub(b'0')) as usize;
    if n > 9 {
        return None;
    }
    i += 1;
    loop {
        let c = *b.get(i)?;
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        if n == 0 || i - at > 15 {
            return None;
        }
        // Checked: fifteen digits fit a 64-bit usize but not a 32-bit one.
        n = n.checked_mul(10)?.checked_add(d as usize)?;
        i += 1;
    }
    if b[i] != b'\r' || *b.get(i + 1)? != b'\n' {
        return None;
    }
    Some((n, i + 2))
}

/// The error for a bulk header not starting with `$`. Redis prints the byte
/// with `%c` and then turns CR and LF into spaces.
fn expected_dollar(found: u8) -> ProtocolError {
    let shown = match found {
        b'\r' | b'\n' => ' ',
        other => char::from(other),
    };
    ProtocolError(format!("ERR Protocol error: expected '$', got '{shown}'"))
}

/// Parses a decimal integer exactly as Redis's `string2ll` accepts it: `0`,
/// or an optional `-` then a digit 1-9 then digits; at most 20 characters;
/// within the range of i64. Anything else (`+1`, ` 1`, `01`, `-0`, `1 `,
/// the empty string) is rejected.
fn parse_redis_int(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    if s == b"0" {
        return Some(0);
    }
    let (negative, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    let (&first, rest) = digits.split_first()?;
    if !(b'1'..=b'9').contains(&first) {
        return None;
    }
    let mut value = u64::from(first - b'0');
    for &d in rest {
        if !d.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if negative {
        i64::try_from(-i128::from(value)).ok()
    } else {
        i64::try_from(value).ok()
    }
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Splits an inline request line into arguments with the rules of Redis's
/// `sdssplitargs`. Returns None on unbalanced quotes.
///
/// * Arguments are separated by whitespace (`isspace`); inside an unquoted
///   argument only space, tab, CR and LF end it (a vertical tab or form feed
///   is part of the argument).
/// * A double or single quote starts a quoted part, even in the middle of an
///   argument (`a"b c"` is `ab c`); the closing quote ends the argument and
///   must be followed by whitespace or the end of the line.
/// * In double quotes: `\xHH` (two hex digits) is a byte; `\n \r \t \b \a`
///   are control characters; a backslash before any other character stands
///   for that character.
/// * In single quotes only `\'` is an escape.
///
/// The line never holds a NUL byte (the line search stops at one), so the
/// C-string end of the original is the end of the slice here.
fn split_inline(line: &Bytes) -> Option<Vec<Bytes>> {
    let s: &[u8] = line;
    let n = s.len();
    let at = |i: usize| s.get(i).copied().unwrap_or(0);
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while i < n && is_c_space(s[i]) {
            i += 1;
        }
        if i >= n {
            return Some(args);
        }
        let start = i;
        while i < n && !matches!(s[i], b' ' | b'\t' | b'\r' | b'\n' | b'"' | b'\'') {
            i += 1;
        }
        let quote = at(i);
        if quote != b'"' && quote != b'\'' {
            // A plain argument: share the line's bytes.
            args.push(line.slice(start..i));
            continue;
        }
        let mut arg = s[start..i].to_vec();
        i += 1;
        loop {
            if i >= n {
                return None;
            }
            let c = s[i];
            if quote == b'"' {
                if c == b'\\' && at(i + 1) == b'x' {
                    if let (Some(hi), Some(lo)) = (hex_value(at(i + 2)), hex_value(at(i + 3))) {
                        arg.push(hi * 16 + lo);
                        i += 4;
                        continue;
                    }
                }
                if c == b'\\' && i + 1 < n {
                    arg.push(match s[i + 1] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        other => other,
                    });
                    i += 2;
                    continue;
                }
            } else if c == b'\\' && at(i + 1) == b'\'' {
                arg.push(b'\'');
                i += 2;
                continue;
            }
            if c == quote {
                if i + 1 < n && !is_c_space(s[i + 1]) {
                    return None;
                }
                i += 1;
                break;
            }
            arg.push(c);
            i += 1;
        }
        args.push(Bytes::from(arg));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Outcome = (Vec<Vec<Bytes>>, Option<ProtocolError>);

    #[test]
    fn the_first_key_is_peeked_only_where_it_is_whole() {
        let set = b"*3\r\n$3\r\nSET\r\n$5\r\nkey:1\r\n$1\r\nv\r\n";
        assert_eq!(peek_first_key(set), Some(&b"key:1"[..]));
        // Cut anywhere inside the key (or before it): nothing.
        for cut in 0..22 {
            assert_eq!(peek_first_key(&set[..cut]), None, "cut at {cut}");
        }
        assert_eq!(peek_first_key(&set[..22]), Some(&b"key:1"[..]));
        assert_eq!(peek_first_key(b"*1\r\n$4\r\nPING\r\n"), None);
        assert_eq!(peek_first_key(b"GET key\r\n"), None);
        assert_eq!(peek_first_key(b"*2\r\n$3\r\nGET\r\n:5\r\n"), None);
        // A length past the end of the bytes: nothing.
        assert_eq!(peek_first_key(b"*2\r\n$99999999999\r\nGET\r\n"), None);
        // A name whose length is not its header's: the peek looks for the next header at
        // the wrong place and finds none here (elsewhere it might find a wrong key, which
        // only wastes a prefetch: the parser decides what the bytes are).
        assert_eq!(peek_first_key(b"*2\r\n$5\r\nGET\r\n$3\r\nkey\r\n"), None);
        assert_eq!(peek_first_key(b"*2\r\n$1\r\nGET\r\n$3\r\nkey\r\n"), None);
        assert_eq!(
            peek_first_key(b"*2\r\n$0\r\n\r\n$0\r\n\r\n"),
            Some(&b""[..])
        );
        // A script call's first key is its third argument, the SHA or body skipped.
        let call = b"*5\r\n$7\r\nevalsha\r\n$3\r\nabc\r\n$1\r\n2\r\n$2\r\nq1\r\n$2\r\nq2\r\n";
        assert_eq!(peek_first_key(call), Some(&b"q1"[..]));
        for cut in 0..call.len() - 10 {
            assert_eq!(peek_first_key(&call[..cut]), None, "cut at {cut}");
        }
        assert_eq!(
            peek_first_key(b"*4\r\n$8\r\nFCALL_RO\r\n$1\r\nf\r\n$2\r\n10\r\n$1\r\nk\r\n"),
            Some(&b"k"[..])
        );
        // No keys, or a count that is not a positive number: no key to hint.
        for numkeys in ["0", "-1", "01", "x", ""] {
            let req = format!(
                "*4\r\n$4\r\nEVAL\r\n$1\r\nb\r\n${}\r\n{numkeys}\r\n$1\r\nk\r\n",
                numkeys.len()
            );
            assert_eq!(peek_first_key(req.as_bytes()), None, "numkeys {numkeys:?}");
        }
        assert_eq!(
            peek_first_key(b"*3\r\n$4\r\nEVAL\r\n$1\r\nb\r\n$1\r\n1\r\n"),
            None
        );
        // The parsed form agrees.
        let args = |v: &[&str]| -> Vec<Bytes> {
            v.iter()
                .map(|a| Bytes::copy_from_slice(a.as_bytes()))
                .collect()
        };
        assert_eq!(
            first_key(&args(&["evalsha", "abc", "2", "q1", "q2"])).map(|k| &k[..]),
            Some(&b"q1"[..])
        );
        assert_eq!(first_key(&args(&["EVAL", "b", "0"])), None);
        assert_eq!(first_key(&args(&["EVAL", "b", "1"])), None);
        assert_eq!(
            first_key(&args(&["SET", "k", "v"])).map(|k| &k[..]),
            Some(&b"k"[..])
        );
        assert_eq!(first_key(&args(&["PING"])), None);
    }

    fn limits() -> ParseLimits {
        ParseLimits::default()
    }

    /// Feeds `chunks` one after another, draining commands after each.
    fn drive<'a>(chunks: impl IntoIterator<Item = &'a [u8]>, limits: &ParseLimits) -> Outcome {
        drive_with(RequestParser::new(), chunks, limits)
    }

    fn drive_with<'a>(
        mut parser: RequestParser,
        chunks: impl IntoIterator<Item = &'a [u8]>,
        limits: &ParseLimits,
    ) -> Outcome {
        let mut buf = BytesMut::new();
        let mut cmds = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            loop {
                match parser.next_command(&mut buf, limits) {
                    Ok(Some(cmd)) => {
                        assert!(!cmd.is_empty(), "empty command returned");
                        cmds.push(cmd);
                    }
                    Ok(None) => break,
                    Err(e) => return (cmds, Some(e)),
                }
            }
        }
        (cmds, None)
    }

    /// As the connection loop reads: whole requests in groups of up to `room`, then the
    /// incremental parser for whatever follows them.
    fn drive_grouped<'a>(
        chunks: impl IntoIterator<Item = &'a [u8]>,
        limits: &ParseLimits,
        room: usize,
    ) -> Outcome {
        let mut parser = RequestParser::new();
        let mut buf = BytesMut::new();
        let mut cmds = Vec::new();
        let mut spare = SpareArgs::default();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            loop {
                let before = cmds.len();
                let taken = parser.whole_commands(&mut buf, limits, &mut cmds, room, &mut spare);
                assert_eq!(cmds.len(), before + taken);
                assert!(taken <= room);
                match parser.next_command(&mut buf, limits) {
                    Ok(Some(cmd)) => cmds.push(cmd),
                    Ok(None) => break,
                    Err(e) => return (cmds, Some(e)),
                }
            }
        }
        (cmds, None)
    }

    fn parse_all(input: &[u8]) -> Outcome {
        drive([input], &limits())
    }

    fn cmds(input: &[u8]) -> Vec<Vec<Bytes>> {
        let (cmds, err) = parse_all(input);
        assert_eq!(err, None, "unexpected error for {input:?}");
        cmds
    }

    fn one(input: &[u8]) -> Vec<Bytes> {
        let mut all = cmds(input);
        assert_eq!(all.len(), 1, "expected one command from {input:?}");
        all.pop().unwrap_or_default()
    }

    fn err(input: &[u8]) -> String {
        err_with(input, &limits())
    }

    fn err_with(input: &[u8], limits: &ParseLimits) -> String {
        match drive([input], limits).1 {
            Some(e) => e.0,
            None => panic!("expected an error for {input:?}"),
        }
    }

    fn pending(input: &[u8]) {
        let (cmds, e) = parse_all(input);
        assert!(
            cmds.is_empty() && e.is_none(),
            "expected pending for {input:?}"
        );
    }

    fn b(items: &[&[u8]]) -> Vec<Bytes> {
        items.iter().map(|s| Bytes::copy_from_slice(s)).collect()
    }

    fn multibulk(args: &[&[u8]]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    #[test]
    fn parses_multibulk() {
        assert_eq!(
            one(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n"),
            b(&[b"SET", b"k", b"hello"])
        );
        assert_eq!(one(b"*1\r\n$0\r\n\r\n"), b(&[b""]));
    }

    #[test]
    fn parses_inline() {
        assert_eq!(one(b"PING\r\n"), b(&[b"PING"]));
        assert_eq!(one(b"PING\n"), b(&[b"PING"]));
        assert_eq!(one(b" \t PING\t\r\n"), b(&[b"PING"]));
        assert_eq!(one(b"set  a   b\n"), b(&[b"set", b"a", b"b"]));
        // A CR inside the line separates arguments too.
        assert_eq!(one(b"a\rb\r\n"), b(&[b"a", b"b"]));
        // Only the CR right before the LF is dropped.
        assert_eq!(one(b"a\r\r\n"), b(&[b"a"]));
    }

    #[test]
    fn inline_quotes_and_escapes() {
        assert_eq!(one(b"SET \"a b\" 'c d'\n"), b(&[b"SET", b"a b", b"c d"]));
        assert_eq!(
            one(b"\"\\n\\r\\t\\b\\a\\\\\\\"\\q\"\n"),
            b(&[b"\n\r\t\x08\x07\\\"q"])
        );
        assert_eq!(one(b"\"\\x41\\x7a\\xfF\\x00\"\n"), b(&[b"Az\xff\x00"]));
        // \x without two hex digits is just an escaped 'x'.
        assert_eq!(one(b"\"\\xZZ\\x4\"\n"), b(&[b"xZZx4"]));
        assert_eq!(one(b"'it\\'s' 'a\\b'\n"), b(&[b"it's", b"a\\b"]));
        assert_eq!(one(b"'\\x41\\n'\n"), b(&[b"\\x41\\n"]));
        assert_eq!(one(b"\"\" ''\n"), b(&[b"", b""]));
        // A quote opens in the middle of an argument and ends it.
        assert_eq!(one(b"a\"b c\" d\n"), b(&[b"ab c", b"d"]));
        assert_eq!(one(b"a'b c'\n"), b(&[b"ab c"]));
        // Vertical tab and form feed are skipped between arguments but do
        // not end an unquoted one.
        assert_eq!(one(b"\x0ba\x0bb\x0c c\n"), b(&[b"a\x0bb\x0c", b"c"]));
        // A closing quote may be followed by any isspace byte.
        assert_eq!(one(b"\"a\"\x0bb\n"), b(&[b"a", b"b"]));
        // Quotes inside quotes of the other kind are plain.
        assert_eq!(
            one(b"\"it's\" 'say \"hi\"'\n"),
            b(&[b"it's", b"say \"hi\""])
        );
        // High bytes are not whitespace.
        assert_eq!(one(b"\xa0x\xff\n"), b(&[b"\xa0x\xff"]));
    }

    #[test]
    fn inline_unbalanced_quotes() {
        const UNBALANCED: &str = "ERR Protocol error: unbalanced quotes in request";
        for input in [
            &b"ECHO \"a\n"[..],
            b"ECHO 'a\r\n",
            b"ECHO \"a\"x\n",
            b"ECHO 'a'x\n",
            b"ECHO \"a\\\"\n",
            b"ECHO 'a\\'\n",
            b"ECHO \"a\\\n",
            b"\"\n",
            b"'\n",
            b"\"a\"\"b\"\n",
        ] {
            assert_eq!(err(input), UNBALANCED, "input {input:?}");
        }
    }

    #[test]
    fn empty_commands_are_skipped() {
        let input = b"\r\n\n  \t \r\n*0\r\n*-1\r\n*-10\r\nPING\r\n*0\r\n";
        assert_eq!(cmds(input), vec![b(&[b"PING"])]);
        let (cmds, e) = parse_all(b"\r\n*0\r\n\n");
        assert!(cmds.is_empty() && e.is_none());
        // Everything was consumed.
        let mut p = RequestParser::new();
        let mut buf = BytesMut::from(&b"\r\n*0\r\n\n"[..]);
        assert_eq!(p.next_command(&mut buf, &limits()), Ok(None));
        assert!(buf.is_empty());
    }

    #[test]
    fn pipelines() {
        let mut input = Vec::new();
        let mut expected = Vec::new();
        for i in 0..1000 {
            let key = format!("key:{i}");
            if i % 3 == 0 {
                input.extend_from_slice(format!("GET {key}\r\n").as_bytes());
                expected.push(b(&[b"GET", key.as_bytes()]));
            } else {
                input.extend_from_slice(&multibulk(&[b"SET", key.as_bytes(), b"v\r\n"]));
                expected.push(b(&[b"SET", key.as_bytes(), b"v\r\n"]));
            }
        }
        assert_eq!(cmds(&input), expected);
    }

    #[test]
    fn every_split_point_gives_the_same_commands() {
        let mut input = Vec::new();
        input.extend_from_slice(&multibulk(&[b"SET", b"a", b"1"]));
        input.extend_from_slice(b"\r\n");
        input.extend_from_slice(b"*0\r\n");
        input.extend_from_slice(b"ECHO \"x y\" 'z'\r\n");
        input.extend_from_slice(&multibulk(&[b"GET", b""]));
        input.extend_from_slice(b"*-1\r\nPING\n");
        input.extend_from_slice(&multibulk(&[b"ECHO", b"\r\n\0*$"]));
        let (whole, e) = parse_all(&input);
        assert!(e.is_none());
        assert_eq!(whole.len(), 5);
        for split in 0..=input.len() {
            let (a, b) = input.split_at(split);
            assert_eq!(
                drive([a, b], &limits()),
                (whole.clone(), None),
                "split {split}"
            );
        }
        let bytes = input.chunks(1);
        assert_eq!(drive(bytes, &limits()), (whole, None));
    }

    #[test]
    fn binary_safe_arguments() {
        let payloads: [&[u8]; 5] = [
            b"\0",
            b"a\r\nb",
            b"\r\n",
            b"*1\r\n$3\r\nfoo\r\n",
            &[0xff, 0, 0x80],
        ];
        let input = multibulk(&payloads);
        assert_eq!(one(&input), b(&payloads));
        let bytes = input.chunks(1);
        assert_eq!(drive(bytes, &limits()), (vec![b(&payloads)], None));
    }

    #[test]
    fn arguments_are_zero_copy() {
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nfoo\r\n$3\r\nbar\r\nGET key\r\n"[..]);
        let base = buf.as_ptr() as usize;
        let mut p = RequestParser::new();
        let args = p.next_command(&mut buf, &limits()).unwrap().unwrap();
        assert_eq!(args[0].as_ptr() as usize, base + 8);
        assert_eq!(args[1].as_ptr() as usize, base + 17);
        let args = p.next_command(&mut buf, &limits()).unwrap().unwrap();
        assert_eq!(args, b(&[b"GET", b"key"]));
        assert_eq!(args[1].as_ptr() as usize, base + 26);
        assert!(buf.is_empty());
    }

    #[test]
    fn multibulk_count_errors() {
        const INVALID: &str = "ERR Protocol error: invalid multibulk length";
        for input in [
            &b"*abc\r\n"[..],
            b"*\r\n",
            b"*+1\r\n",
            b"* 1\r\n",
            b"*1 \r\n",
            b"*01\r\n",
            b"*-0\r\n",
            b"*-\r\n",
            b"*1.0\r\n",
            b"*2147483648\r\n",
            b"*9223372036854775807\r\n",
            b"*-9223372036854775809\r\n",
            b"*000000000000000000001\r\n",
        ] {
            assert_eq!(err(input), INVALID, "input {input:?}");
        }
        // Redis 7 accepts counts up to INT_MAX.
        let (cmds, e) = parse_all(b"*2147483647\r\n");
        assert!(cmds.is_empty() && e.is_none());
        let (cmds, e) = parse_all(b"*-9223372036854775808\r\nPING\r\n");
        assert_eq!((cmds, e), (vec![b(&[b"PING"])], None));
    }

    #[test]
    fn multibulk_count_too_big() {
        let mut input = b"*".to_vec();
        input.resize(MAX_LINE_LEN, b'0');
        pending(&input);
        let mut longer = input.clone();
        longer.push(b'0');
        assert_eq!(
            err(&longer),
            "ERR Protocol error: too big mbulk count string"
        );
        // A terminator makes it an invalid number instead, however long.
        let mut with_cr = longer.clone();
        with_cr.push(b'\r');
        pending(&with_cr);
        with_cr.push(b'\n');
        assert_eq!(
            err(&with_cr),
            "ERR Protocol error: invalid multibulk length"
        );
    }

    #[test]
    fn bulk_header_errors() {
        assert_eq!(
            err(b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n"),
            "ERR Protocol error: expected '$', got 'f'"
        );
        assert_eq!(
            err(b"*1\r\nfoo\r\n"),
            "ERR Protocol error: expected '$', got 'f'"
        );
        assert_eq!(
            err(b"*1\r\n:1\r\n"),
            "ERR Protocol error: expected '$', got ':'"
        );
        // CR and LF are shown as spaces.
        assert_eq!(
            err(b"*1\r\n\r\n"),
            "ERR Protocol error: expected '$', got ' '"
        );
        assert_eq!(
            err(b"*1\r\n\n\r\n"),
            "ERR Protocol error: expected '$', got ' '"
        );
        // A high byte is kept as the char with its number, one byte on the wire.
        let e = drive([&b"*1\r\n\xff\r\n"[..]], &limits()).1.unwrap();
        assert_eq!(e.0, "ERR Protocol error: expected '$', got '\u{ff}'");
        assert_eq!(
            e.to_bytes(),
            b"ERR Protocol error: expected '$', got '\xff'".to_vec()
        );
        // The check waits for a complete line.
        pending(b"*1\r\nfoo");
        pending(b"*1\r\nfoo\r");

        const INVALID: &str = "ERR Protocol error: invalid bulk length";
        for header in [
            &b"$-1"[..],
            b"$-10",
            b"$abc",
            b"$blabla",
            b"$+5",
            b"$ 5",
            b"$5 ",
            b"$05",
            b"$-0",
            b"$",
            b"$2000000000",
            b"$536870913",
            b"$18446744073709551616",
        ] {
            let mut input = b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n".to_vec();
            input.extend_from_slice(header);
            input.extend_from_slice(b"\r\n");
            assert_eq!(err(&input), INVALID, "header {header:?}");
        }
        // proto-max-bulk-len itself is fine.
        pending(b"*1\r\n$536870912\r\n");
        let small = ParseLimits { max_bulk_len: 3 };
        assert_eq!(
            drive([&b"*1\r\n$3\r\nfoo\r\n"[..]], &small).0,
            vec![b(&[b"foo"])]
        );
        assert_eq!(err_with(b"*1\r\n$4\r\nfooo\r\n", &small), INVALID);
    }

    #[test]
    fn bulk_count_too_big() {
        let mut input = b"*1\r\n$".to_vec();
        input.resize(4 + MAX_LINE_LEN, b'1');
        pending(&input);
        input.push(b'1');
        assert_eq!(err(&input), "ERR Protocol error: too big bulk count string");
        input.extend_from_slice(b"\r\n");
        assert_eq!(err(&input), "ERR Protocol error: invalid bulk length");
    }

    #[test]
    fn bytes_after_payload_and_header_cr_are_not_checked() {
        assert_eq!(one(b"*1\r\n$3\r\nfooXY"), b(&[b"foo"]));
        assert_eq!(one(b"*1\rX$3\rYfooZZ"), b(&[b"foo"]));
        assert_eq!(
            cmds(b"*2\r\n$1\r\na\n\n$1\r\nb\r\r*1\r\n$1\r\nc\0\0"),
            vec![b(&[b"a", b"b"]), b(&[b"c"])]
        );
        // The payload waits for two bytes after it, whatever they are.
        pending(b"*1\r\n$3\r\nfoo");
        pending(b"*1\r\n$3\r\nfoo\r");
    }

    #[test]
    fn inline_too_big() {
        let mut input = vec![b'x'; MAX_LINE_LEN];
        pending(&input);
        input.push(b'x');
        assert_eq!(err(&input), "ERR Protocol error: too big inline request");
        // A long line that arrives with its newline is fine.
        let mut line = vec![b'x'; 3 * MAX_LINE_LEN];
        line.push(b'\n');
        assert_eq!(one(&line)[0].len(), 3 * MAX_LINE_LEN);
    }

    #[test]
    fn nul_byte_hides_line_terminator() {
        pending(b"PING\0\n");
        pending(b"\0\r\n");
        pending(b"*1\0\r\n");
        pending(b"*1\r\n$3\0\r\nfoo\r\n");
        // ... until more than 64 KiB is buffered.
        for (prefix, msg) in [
            (
                &b"PING\0\n"[..],
                "ERR Protocol error: too big inline request",
            ),
            (
                b"*1\0\r\n",
                "ERR Protocol error: too big mbulk count string",
            ),
            (
                b"*1\r\n$3\0\r\n",
                "ERR Protocol error: too big bulk count string",
            ),
        ] {
            let filler = vec![b'\n'; MAX_LINE_LEN];
            let (cmds, e) = drive([prefix, &filler[..]], &limits());
            assert!(cmds.is_empty());
            assert_eq!(e.map(|e| e.0).as_deref(), Some(msg));
        }
        // NUL inside a bulk payload is just data.
        assert_eq!(one(b"*1\r\n$1\r\n\0\r\n"), b(&[b"\0"]));
    }

    #[test]
    fn in_progress_tracks_partial_multibulk() {
        let mut p = RequestParser::new();
        let mut buf = BytesMut::from(&b"*2\r"[..]);
        assert_eq!(p.next_command(&mut buf, &limits()), Ok(None));
        assert!(!p.in_progress());
        buf.extend_from_slice(b"\n$3\r\nfoo\r\n$3\r\nba");
        assert_eq!(p.next_command(&mut buf, &limits()), Ok(None));
        assert!(p.in_progress());
        // The complete header of the second bulk is consumed too.
        assert_eq!(&buf[..], b"ba");
        buf.extend_from_slice(b"r\r\n");
        assert_eq!(
            p.next_command(&mut buf, &limits()),
            Ok(Some(b(&[b"foo", b"bar"])))
        );
        assert!(!p.in_progress());
        assert!(buf.is_empty());
        // An error resets the parser.
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nfoo\r\n?\r\n"[..]);
        assert!(p.next_command(&mut buf, &limits()).is_err());
        assert!(!p.in_progress());
    }

    #[test]
    fn huge_count_does_not_preallocate() {
        let mut p = RequestParser::new();
        let mut buf = BytesMut::from(&b"*2147483647\r\n$1\r\na\r\n"[..]);
        assert_eq!(p.next_command(&mut buf, &limits()), Ok(None));
        assert!(p.args.capacity() <= INITIAL_ARGS_CAPACITY);
        assert_eq!(p.args.len(), 1);
        let mut p = RequestParser::new();
        let mut buf = BytesMut::from(&b"*3\r\n"[..]);
        assert_eq!(p.next_command(&mut buf, &limits()), Ok(None));
        assert_eq!(p.args.capacity(), 3);
    }

    #[test]
    fn big_bulk_reserves_buffer() {
        let len = 100_000;
        let mut p = RequestParser::new();
        let mut buf = BytesMut::with_capacity(64);
        buf.extend_from_slice(format!("*1\r\n${len}\r\nabc").as_bytes());
        assert_eq!(p.next_command(&mut buf, &limits()), Ok(None));
        assert!(buf.capacity() >= len + 2);
        let start = buf.as_ptr() as usize;
        let cap = buf.capacity();
        while buf.len() < len + 2 {
            let n = (len + 2 - buf.len()).min(4096);
            buf.extend_from_slice(&vec![b'z'; n]);
            // No reallocation while the bulk arrives.
            assert_eq!((buf.as_ptr() as usize, buf.capacity()), (start, cap));
            if buf.len() < len + 2 {
                assert_eq!(p.next_command(&mut buf, &limits()), Ok(None));
            }
        }
        let args = p.next_command(&mut buf, &limits()).unwrap().unwrap();
        assert_eq!(args[0].len(), len);
        assert_eq!(args[0].as_ptr() as usize, start);
        assert!(args[0].starts_with(b"abczz"));
    }

    #[test]
    fn million_args_in_chunks_is_linear() {
        let n = 1 << 20;
        let mut input = format!("*{n}\r\n").into_bytes();
        for i in 0..n {
            let arg = (i % 1000).to_string();
            input.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
        }
        input.extend_from_slice(b"PING\r\n");
        let mut p = RequestParser::new();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut calls = 0usize;
        for chunk in input.chunks(1000) {
            buf.extend_from_slice(chunk);
            calls += 1;
            while let Some(cmd) = p.next_command(&mut buf, &limits()).unwrap() {
                got.push(cmd);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].len(), n);
        assert_eq!(&got[0][999][..], b"999");
        assert_eq!(got[1], b(&[b"PING"]));
        // Header lines are scanned once, plus a few bytes per call.
        assert!(
            p.scanned <= input.len() + 16 * calls,
            "scanned {}",
            p.scanned
        );

        // One byte at a time, with a smaller request.
        let n = 50_000;
        let args: Vec<Vec<u8>> = (0..n).map(|i| format!("arg{i}").into_bytes()).collect();
        let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        let input = multibulk(&refs);
        let mut p = RequestParser::new();
        let mut buf = BytesMut::new();
        let mut got = None;
        for &byte in &input {
            buf.extend_from_slice(&[byte]);
            if let Some(cmd) = p.next_command(&mut buf, &limits()).unwrap() {
                got = Some(cmd);
            }
        }
        assert_eq!(got.map(|c| c.len()), Some(n));
        assert!(p.scanned <= 2 * input.len(), "scanned {}", p.scanned);
    }

    #[test]
    fn long_line_byte_by_byte_is_linear() {
        let mut p = RequestParser::new();
        let mut buf = BytesMut::new();
        for _ in 0..MAX_LINE_LEN - 1 {
            buf.extend_from_slice(b"x");
            assert_eq!(p.next_command(&mut buf, &limits()), Ok(None));
        }
        buf.extend_from_slice(b"\n");
        let cmd = p.next_command(&mut buf, &limits()).unwrap().unwrap();
        assert_eq!(cmd[0].len(), MAX_LINE_LEN - 1);
        assert!(p.scanned <= MAX_LINE_LEN + 1);
    }

    #[test]
    fn unauthenticated_limits() {
        let run = |input: &[u8]| {
            let mut p = RequestParser::new();
            p.set_auth_required(true);
            let mut buf = BytesMut::from(input);
            p.next_command(&mut buf, &limits())
        };
        let unauth = |msg: &str| Err(ProtocolError(msg.to_owned()));
        assert_eq!(
            run(b"*11\r\n"),
            unauth("ERR Protocol error: unauthenticated multibulk length")
        );
        assert_eq!(run(b"*10\r\n"), Ok(None));
        assert_eq!(
            run(b"*1\r\n$16385\r\n"),
            unauth("ERR Protocol error: unauthenticated bulk length")
        );
        assert_eq!(run(b"*1\r\n$16384\r\n"), Ok(None));
        // Invalid numbers are reported first.
        assert_eq!(
            run(b"*2147483648\r\n"),
            unauth("ERR Protocol error: invalid multibulk length")
        );
        assert_eq!(
            run(b"*1\r\n$536870913\r\n"),
            unauth("ERR Protocol error: invalid bulk length")
        );
        // Inline requests have no such limit.
        let long = format!("AUTH {}\n", "p".repeat(20_000));
        assert_eq!(run(long.as_bytes()).unwrap().unwrap().len(), 2);
    }

    #[test]
    fn redis_integers() {
        let ok: [(&[u8], i64); 7] = [
            (b"0", 0),
            (b"1", 1),
            (b"-1", -1),
            (b"1234567890", 1_234_567_890),
            (b"9223372036854775807", i64::MAX),
            (b"-9223372036854775808", i64::MIN),
            (b"10", 10),
        ];
        for (s, v) in ok {
            assert_eq!(parse_redis_int(s), Some(v), "{s:?}");
        }
        for s in [
            &b""[..],
            b"-",
            b"+1",
            b" 1",
            b"1 ",
            b"01",
            b"00",
            b"-0",
            b"-01",
            b"1a",
            b"0x1",
            b"9223372036854775808",
            b"-9223372036854775809",
            b"18446744073709551616",
            b"99999999999999999999",
            b"000000000000000000001",
        ] {
            assert_eq!(parse_redis_int(s), None, "{s:?}");
        }
    }

    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn random_byte(rng: &mut XorShift) -> u8 {
        const INTERESTING: &[u8] = b"*$\r\n\r\n0123456789-+ \t\"'\\x\0\x0bafAF";
        if rng.below(4) == 0 {
            rng.next() as u8
        } else {
            INTERESTING[rng.below(INTERESTING.len())]
        }
    }

    fn random_frames(rng: &mut XorShift) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..1 + rng.below(4) {
            // Now and then a long request (the fast path keeps those in a vector).
            let argc = if rng.below(8) == 0 {
                rng.below(300)
            } else {
                rng.below(5)
            };
            let args: Vec<Vec<u8>> = (0..argc)
                .map(|_| (0..rng.below(12)).map(|_| random_byte(rng)).collect())
                .collect();
            if rng.below(3) == 0 {
                for a in &args {
                    out.push(b'"');
                    for &c in a {
                        out.extend_from_slice(format!("\\x{c:02x}").as_bytes());
                    }
                    out.extend_from_slice(b"\" ");
                }
                out.extend_from_slice(b"\r\n");
            } else {
                let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
                out.extend_from_slice(&multibulk(&refs));
            }
        }
        out
    }

    fn mutate(rng: &mut XorShift, data: &mut Vec<u8>) {
        for _ in 0..rng.below(4) {
            let pos = rng.below(data.len() + 1);
            match rng.below(5) {
                0 if pos < data.len() => data[pos] = random_byte(rng),
                1 => data.insert(pos, random_byte(rng)),
                2 if pos < data.len() => {
                    data.remove(pos);
                }
                3 => data.truncate(pos),
                _ => {
                    let n = rng.below(8);
                    for _ in 0..n {
                        data.insert(pos, random_byte(rng));
                    }
                }
            }
        }
    }

    fn random_chunks<'a>(rng: &mut XorShift, data: &'a [u8]) -> Vec<&'a [u8]> {
        let mut chunks = Vec::new();
        let mut rest = data;
        while !rest.is_empty() {
            let n = 1 + rng.below(rest.len().min(16));
            let (a, b) = rest.split_at(n);
            chunks.push(a);
            rest = b;
        }
        chunks
    }

    #[test]
    fn valid_random_frames_round_trip() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2000 {
            let data = random_frames(&mut rng);
            let (whole, e) = parse_all(&data);
            assert!(e.is_none(), "error {e:?} for {data:?}");
            let chunks = random_chunks(&mut rng, &data);
            assert_eq!(drive(chunks, &limits()), (whole, None));
        }
    }

    #[test]
    fn random_input_never_panics_and_ignores_chunking() {
        let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
        for round in 0..20_000 {
            let data: Vec<u8> = if round % 2 == 0 {
                (0..rng.below(200)).map(|_| random_byte(&mut rng)).collect()
            } else {
                let mut d = random_frames(&mut rng);
                mutate(&mut rng, &mut d);
                d
            };
            let limits = ParseLimits {
                max_bulk_len: if rng.below(2) == 0 {
                    rng.below(16)
                } else {
                    1 << 20
                },
            };
            let whole = drive([&data[..]], &limits);
            let chunks = random_chunks(&mut rng, &data);
            assert_eq!(drive(chunks, &limits), whole, "input {data:?}");
        }
        // Big random inputs, past the line limits.
        for _ in 0..20 {
            let len = rng.below(200_000);
            let data: Vec<u8> = (0..len).map(|_| random_byte(&mut rng)).collect();
            let chunks = random_chunks(&mut rng, &data);
            let _ = drive(chunks.iter().copied(), &limits());
            let _ = drive([&data[..]], &limits());
        }
    }

    /// The fast path for whole requests gives exactly what the incremental parser gives,
    /// commands and errors, for well-formed, damaged and random input in random chunks.
    #[test]
    fn fast_path_agrees_with_the_incremental_parser() {
        let slow = || RequestParser {
            slow_only: true,
            ..RequestParser::new()
        };
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for round in 0..30_000 {
            let mut data = random_frames(&mut rng);
            if round % 3 != 0 {
                mutate(&mut rng, &mut data);
            }
            if round % 5 == 0 {
                // Numbers the fast path refuses: leading zeros, signs, long digit runs.
                let tricky: [&[u8]; 6] = [
                    b"*01\r\n$4\r\nPING\r\n",
                    b"*1\r\n$04\r\nPING\r\n",
                    b"*1\r\n$-1\r\n",
                    b"*1\r\n$0000000000000000004\r\nPING\r\n",
                    b"*1\r\n$4\rxPING\r\n",
                    b"*17\r\n",
                ];
                data.extend_from_slice(tricky[rng.below(tricky.len())]);
            }
            let limits = ParseLimits {
                max_bulk_len: if rng.below(2) == 0 {
                    rng.below(16)
                } else {
                    1 << 20
                },
            };
            let chunks = random_chunks(&mut rng, &data);
            let fast_whole = drive([&data[..]], &limits);
            assert_eq!(
                fast_whole,
                drive_with(slow(), [&data[..]], &limits),
                "input {data:?}"
            );
            assert_eq!(
                drive(chunks.iter().copied(), &limits),
                drive_with(slow(), chunks.iter().copied(), &limits),
                "input {data:?}"
            );
            let room = 1 + rng.below(4);
            assert_eq!(
                drive_grouped([&data[..]], &limits, room),
                fast_whole,
                "input {data:?}"
            );
            assert_eq!(
                drive_grouped(chunks.iter().copied(), &limits, room),
                drive_with(slow(), chunks.iter().copied(), &limits),
                "input {data:?}"
            );
        }
        let mut ping = BytesMut::from(&b"*1\r\n$4\r\nPING\r\n*1"[..]);
        assert_eq!(whole_command(&mut ping, 100), Some(b(&[b"PING"])));
        assert_eq!(&ping[..], b"*1");
        // Sixteen arguments keep their places on the stack, more in a vector; all parse.
        for n in [16usize, 17, 240] {
            let args: Vec<Vec<u8>> = (0..n).map(|i| format!("a{i}").into_bytes()).collect();
            let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
            let input = multibulk(&refs);
            assert_eq!(
                parse_all(&input),
                drive_with(slow(), [&input[..]], &limits())
            );
            assert_eq!(cmds(&input)[0].len(), n);
            let mut whole = BytesMut::from(&input[..]);
            assert_eq!(whole_command(&mut whole, 100).map(|a| a.len()), Some(n));
        }
        // A group leaves the buffer as one piece; what follows it stays.
        let mut group =
            BytesMut::from(&b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1"[..]);
        let mut out = Vec::new();
        let mut parser = RequestParser::new();
        let mut spare = SpareArgs::default();
        assert_eq!(
            parser.whole_commands(&mut group, &limits(), &mut out, 8, &mut spare),
            2
        );
        assert_eq!(out, vec![b(&[b"PING"]), b(&[b"GET", b"k"])]);
        assert_eq!(&group[..], b"*1");
        // A vector given back is reused: it holds only the new request's arguments.
        spare.give(out.pop().unwrap());
        spare.give(out.pop().unwrap());
        let mut again = BytesMut::from(&b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"[..]);
        assert_eq!(
            parser.whole_commands(&mut again, &limits(), &mut out, 8, &mut spare),
            1
        );
        assert_eq!(out, vec![b(&[b"SET", b"k", b"v"])]);
        assert_eq!(spare.0.len(), 1);
        out.clear();
        // Nothing is taken for a client that has yet to authenticate.
        let mut group = BytesMut::from(&b"*1\r\n$4\r\nPING\r\n"[..]);
        parser.set_auth_required(true);
        assert_eq!(
            parser.whole_commands(&mut group, &limits(), &mut out, 8, &mut spare),
            0
        );
        assert_eq!(group.len(), 14);
        // A count no buffer this size could hold goes to the incremental parser.
        let mut huge = BytesMut::from(&b"*1000000\r\n$1\r\na\r\n"[..]);
        assert_eq!(whole_command(&mut huge, 100), None);
        assert_eq!(&huge[..], b"*1000000\r\n$1\r\na\r\n");
    }
}
