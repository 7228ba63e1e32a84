//! A shard's effects on their way to the log.
//!
//! Every write a shard runs appends its effect (the command as Redis would propagate it)
//! to the shard's `Effects`, encoded as RESP. Code that must keep a group whole (a batch,
//! a transaction step, a script) holds the buffer, or marks it and takes what came after
//! the mark; everything else is handed to the writer as soon as it is appended.

use bytes::Bytes;

use crate::protocol::reply::put_int;

/// Effects in RESP, each run of them relative to the database in force at its start.
#[derive(Default)]
pub struct Effects {
    buf: Vec<u8>,
    /// The database the first byte of `buf` runs in, and the one after its last byte.
    start_db: usize,
    last_db: usize,
    count: u32,
    hold: u32,
}

/// Effects taken out of a shard (or composed by a transaction), with the database they
/// start in and end in; `bytes` switch databases with SELECT where they need to.
pub struct Piece {
    pub start_db: usize,
    pub end_db: usize,
    /// Commands in it, SELECT not counted.
    pub count: u32,
    pub bytes: Vec<u8>,
}

/// A point in an `Effects` buffer to take from.
#[derive(Clone, Copy)]
pub struct Mark {
    len: usize,
    db: usize,
    count: u32,
}

/// Appends one command as a RESP array.
pub fn encode<A: AsRef<[u8]>>(out: &mut Vec<u8>, argv: &[A]) {
    out.push(b'*');
    put_int(out, argv.len() as i64);
    out.extend_from_slice(b"\r\n");
    for a in argv {
        let a = a.as_ref();
        out.push(b'$');
        put_int(out, a.len() as i64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

pub fn select_bytes(db: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(24);
    encode(&mut v, &[b"SELECT".as_slice(), db.to_string().as_bytes()]);
    v
}

impl Effects {
    fn switch_to(&mut self, db: usize) {
        if self.buf.is_empty() {
            self.start_db = db;
        } else if db != self.last_db {
            encode(
                &mut self.buf,
                &[b"SELECT".as_slice(), db.to_string().as_bytes()],
            );
        }
        self.last_db = db;
    }

    pub fn push<A: AsRef<[u8]>>(&mut self, db: usize, argv: &[A]) {
        self.switch_to(db);
        encode(&mut self.buf, argv);
        self.count += 1;
    }

    pub fn push_piece(&mut self, p: Piece) {
        if p.bytes.is_empty() {
            return;
        }
        self.switch_to(p.start_db);
        self.buf.extend_from_slice(&p.bytes);
        self.last_db = p.end_db;
        self.count += p.count;
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn held(&self) -> bool {
        self.hold > 0
    }

    pub fn hold(&mut self) {
        self.hold += 1;
    }

    /// How many holds are open, to put back with `set_holds` after a panic inside them.
    pub fn holds(&self) -> u32 {
        self.hold
    }

    pub fn set_holds(&mut self, holds: u32) {
        self.hold = holds;
    }

    /// Ends one hold; true when none is left, so the caller hands the buffer over.
    pub fn release(&mut self) -> bool {
        self.hold -= 1;
        self.hold == 0
    }

    pub fn mark(&self) -> Mark {
        Mark {
            len: self.buf.len(),
            db: self.last_db,
            count: self.count,
        }
    }

    /// Takes everything appended since `m`.
    pub fn take_since(&mut self, m: Mark) -> Piece {
        let bytes = self.buf.split_off(m.len);
        let piece = Piece {
            start_db: if m.len == 0 { self.start_db } else { m.db },
            end_db: self.last_db,
            count: self.count - m.count,
            bytes,
        };
        self.last_db = if m.len == 0 { piece.start_db } else { m.db };
        self.count = m.count;
        piece
    }

    /// Takes the whole buffer.
    pub fn take_all(&mut self) -> Piece {
        // The next batch is likely the size of this one: one allocation instead of a
        // run of reallocations as it grows.
        let cap = self.buf.len().clamp(64, 1 << 16);
        let piece = Piece {
            start_db: self.start_db,
            end_db: self.last_db,
            count: self.count,
            bytes: std::mem::replace(&mut self.buf, Vec::with_capacity(cap)),
        };
        self.start_db = self.last_db;
        self.count = 0;
        piece
    }

    /// Puts what came after `m` inside MULTI/EXEC when it is more than one command, as
    /// Redis propagates a transaction or a script.
    pub fn wrap_since(&mut self, m: Mark) {
        // One command or none needs no wrapping (taking it out and putting it back
        // would give the same bytes); a script usually writes once.
        if self.count.saturating_sub(m.count) <= 1 {
            return;
        }
        let p = self.take_since(m);
        self.push_piece(wrap(vec![p]));
    }
}

/// One piece holding `pieces` in order, inside MULTI/EXEC when they hold more than one
/// command.
pub fn wrap(pieces: Vec<Piece>) -> Piece {
    let pieces: Vec<Piece> = pieces.into_iter().filter(|p| !p.bytes.is_empty()).collect();
    let count: u32 = pieces.iter().map(|p| p.count).sum();
    let Some(first) = pieces.first() else {
        return Piece {
            start_db: 0,
            end_db: 0,
            count: 0,
            bytes: Vec::new(),
        };
    };
    let start_db = first.start_db;
    let multi = count > 1;
    let mut bytes = Vec::new();
    if multi {
        encode(&mut bytes, &[b"MULTI".as_slice()]);
    }
    let mut db = start_db;
    for p in pieces {
        if p.start_db != db {
            bytes.extend_from_slice(&select_bytes(p.start_db));
        }
        bytes.extend_from_slice(&p.bytes);
        db = p.end_db;
    }
    if multi {
        encode(&mut bytes, &[b"EXEC".as_slice()]);
    }
    Piece {
        start_db,
        end_db: db,
        count,
        bytes,
    }
}

/// A command made of owned words, for rewritten effects.
pub fn words(list: &[&[u8]]) -> Vec<Bytes> {
    list.iter().map(|w| Bytes::copy_from_slice(w)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_take_their_own_effects_and_keep_databases_straight() {
        let mut e = Effects::default();
        e.push(0, &[b"SET".as_slice(), b"a", b"1"]);
        let m = e.mark();
        e.push(3, &[b"SET".as_slice(), b"b", b"2"]);
        e.push(3, &[b"DEL".as_slice(), b"c"]);
        let p = e.take_since(m);
        assert_eq!((p.start_db, p.end_db, p.count), (0, 3, 2));
        assert!(p.bytes.starts_with(b"*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n"));
        // After the take the buffer is back in database 0.
        e.push(0, &[b"SET".as_slice(), b"d", b"4"]);
        let all = e.take_all();
        assert_eq!(all.count, 2);
        assert!(!all.bytes.windows(6).any(|w| w == b"SELECT"));
        let w = wrap(vec![all, p]);
        assert_eq!(w.count, 4);
        assert!(w.bytes.starts_with(b"*1\r\n$5\r\nMULTI\r\n"));
        assert!(w.bytes.ends_with(b"*1\r\n$4\r\nEXEC\r\n"));
    }
}
