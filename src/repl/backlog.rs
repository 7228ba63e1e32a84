//! The replication backlog: the last `repl-backlog-size` bytes of the stream, so a replica
//! that lost its link can continue from its offset instead of copying everything again.
//! Owned by the writer thread alone.

use std::collections::VecDeque;

pub struct Backlog {
    data: VecDeque<u8>,
    size: usize,
    /// The offset of the byte at the front of `data` (offsets count from 1, as Redis's do:
    /// the stream's first byte is offset 1 and `master_repl_offset` is the last one).
    first: u64,
}

impl Backlog {
    /// An empty backlog whose next byte will have offset `offset + 1`.
    pub fn new(size: usize, offset: u64) -> Backlog {
        Backlog {
            data: VecDeque::with_capacity(size.min(1 << 20)),
            size,
            first: offset + 1,
        }
    }

    pub fn append(&mut self, bytes: &[u8]) {
        if bytes.len() >= self.size {
            let skip = bytes.len() - self.size;
            self.first += (self.data.len() + skip) as u64;
            self.data.clear();
            self.data.extend(&bytes[skip..]);
            return;
        }
        self.data.extend(bytes);
        let over = self.data.len().saturating_sub(self.size);
        if over > 0 {
            self.data.drain(..over);
            self.first += over as u64;
        }
    }

    pub fn resize(&mut self, size: usize) {
        self.size = size.max(1);
        let over = self.data.len().saturating_sub(self.size);
        if over > 0 {
            self.data.drain(..over);
            self.first += over as u64;
        }
    }

    /// The offset of the first byte held (Redis's `repl_backlog_first_byte_offset`).
    pub fn first(&self) -> u64 {
        self.first
    }

    pub fn histlen(&self) -> u64 {
        self.data.len() as u64
    }

    /// The bytes from offset `from` to the end, if the backlog still holds them all
    /// (`from` one past the end gives nothing to send, and is fine).
    pub fn since(&self, from: u64) -> Option<Vec<u8>> {
        let end = self.first + self.data.len() as u64;
        if from < self.first || from > end {
            return None;
        }
        let skip = (from - self.first) as usize;
        let (a, b) = self.data.as_slices();
        let mut out = Vec::with_capacity(self.data.len() - skip);
        if skip < a.len() {
            out.extend_from_slice(&a[skip..]);
            out.extend_from_slice(b);
        } else {
            out.extend_from_slice(&b[skip - a.len()..]);
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_bytes_and_answers_offsets_inside_them() {
        let mut b = Backlog::new(8, 100);
        assert_eq!(b.first(), 101);
        assert_eq!(b.since(101), Some(Vec::new()));
        b.append(b"abcdef");
        assert_eq!(b.since(103), Some(b"cdef".to_vec()));
        b.append(b"ghij");
        // 10 bytes written into 8: the first two are gone.
        assert_eq!(b.first(), 103);
        assert_eq!(b.since(102), None);
        assert_eq!(b.since(103), Some(b"cdefghij".to_vec()));
        assert_eq!(b.since(111), Some(Vec::new()));
        assert_eq!(b.since(112), None);
        b.append(b"0123456789");
        assert_eq!(b.first(), 113);
        assert_eq!(b.since(113), Some(b"23456789".to_vec()));
    }
}
