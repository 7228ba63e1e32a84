//! The list value: a deque of chunks, each holding up to ~8 KiB of packed elements.
//!
//! A queued job must cost no more memory than in Redis, which packs list elements into
//! listpacks of 8 KiB. Here each element is stored as `varint(len) bytes varint_rev(len)`
//! inside its chunk's buffer, so both ends can be read and popped without per-element
//! allocations: a 150-byte job costs 154 bytes plus a share of its chunk's header.
//! Chunks grow towards the end for pushes at the tail and are filled from their end for
//! pushes at the head, so both kinds of push append without moving data.

use std::collections::VecDeque;
use std::sync::Arc;

/// Target size of a chunk's packed data (Redis's default list-max-listpack-size -2).
const CHUNK_BYTES: usize = 8192;

/// Redis 7.2 keeps a list in a single listpack while it stays under 8 KiB and 128
/// entries; OBJECT ENCODING reports that.
const LISTPACK_MAX_ITEMS: usize = 128;

#[derive(Clone, Debug, Default)]
struct Chunk {
    /// Packed elements live in `data[head..]`.
    data: Vec<u8>,
    head: usize,
    count: usize,
    /// When elements were pushed (queue metrics, docs/observe.md): the first and last
    /// push, how many pushes, and how many pops from the end the oldest elements sit at.
    /// The k-th push's time is estimated by spreading the pushes evenly in between, so a
    /// job costs no memory for its timestamp.
    first_ms: u64,
    span_ms: u32,
    pushes: u32,
    taken_old: u32,
    /// Pushes land at the front (LPUSH): the oldest elements are at the back.
    new_at_front: bool,
}

fn varint_len(mut n: usize) -> usize {
    let mut len = 1;
    while n >= 0x80 {
        n >>= 7;
        len += 1;
    }
    len
}

fn encoded_len(n: usize) -> usize {
    2 * varint_len(n) + n
}

/// Writes `v` packed into `out` (which has exactly `encoded_len(v.len())` bytes).
fn encode_into(out: &mut [u8], v: &[u8]) {
    let n = v.len();
    let k = varint_len(n);
    let mut x = n;
    for b in out.iter_mut().take(k) {
        *b = (x & 0x7f) as u8 | if x >= 0x80 { 0x80 } else { 0 };
        x >>= 7;
    }
    out[k..k + n].copy_from_slice(v);
    // The trailing copy is stored most-significant group first, so it can be read
    // backwards from the end of the element.
    let tail = &mut out[k + n..];
    let mut x = n;
    for i in (0..k).rev() {
        tail[i] = (x & 0x7f) as u8 | if i > 0 { 0x80 } else { 0 };
        x >>= 7;
    }
}

/// Reads the element starting at `pos`: (payload range, next position).
fn decode_at(data: &[u8], pos: usize) -> (std::ops::Range<usize>, usize) {
    let mut n = 0usize;
    let mut shift = 0;
    let mut p = pos;
    loop {
        let b = data[p];
        n |= ((b & 0x7f) as usize) << shift;
        p += 1;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    let k = p - pos;
    (p..p + n, p + n + k)
}

/// Reads the element ending at `end`: (payload range, its start position).
fn decode_before(data: &[u8], end: usize) -> (std::ops::Range<usize>, usize) {
    let mut n = 0usize;
    let mut shift = 0;
    let mut p = end;
    loop {
        p -= 1;
        let b = data[p];
        n |= ((b & 0x7f) as usize) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    let k = end - p;
    let payload_end = p;
    let start = payload_end - n - k;
    (payload_end - n..payload_end, start)
}

impl Chunk {
    fn used(&self) -> usize {
        self.data.len() - self.head
    }

    fn stamp_push(&mut self, now_ms: u64, at_front: bool) {
        if self.pushes == 0 {
            self.first_ms = now_ms;
            self.new_at_front = at_front;
        }
        self.span_ms = now_ms.saturating_sub(self.first_ms).min(u32::MAX as u64) as u32;
        self.pushes = self.pushes.saturating_add(1);
    }

    /// The estimated push time of the k-th element pushed into this chunk.
    fn push_time(&self, k: u32) -> u64 {
        if self.pushes <= 1 {
            return self.first_ms;
        }
        let k = k.min(self.pushes - 1) as u64;
        self.first_ms + self.span_ms as u64 * k / (self.pushes as u64 - 1)
    }

    /// The push time of the element about to leave from the front (or the back).
    fn stamp_pop(&mut self, front: bool) -> u64 {
        if front != self.new_at_front {
            let t = self.push_time(self.taken_old);
            self.taken_old = self.taken_old.saturating_add(1);
            t
        } else {
            self.push_time(self.taken_old + (self.count as u32).saturating_sub(1))
        }
    }

    /// Stamps a chunk rebuilt by an edit in the middle with the times of `from`: the
    /// elements it kept were pushed within that span.
    fn restamp(mut self, from: &Chunk) -> Chunk {
        self.first_ms = from.first_ms;
        self.span_ms = from.span_ms;
        self.pushes = self.count as u32;
        self.taken_old = 0;
        self.new_at_front = from.new_at_front;
        self
    }

    fn push_back(&mut self, v: &[u8]) {
        let need = encoded_len(v.len());
        let at = self.data.len();
        if self.data.capacity() - at < need {
            // Grow in steps up to the chunk size, then exactly: a queue's last chunk
            // should not hold twice the memory it uses.
            let target = (self.data.capacity() * 2)
                .clamp(64, CHUNK_BYTES)
                .max(at + need);
            self.data.reserve_exact(target - at);
        }
        self.data.resize(at + need, 0);
        encode_into(&mut self.data[at..], v);
        self.count += 1;
    }

    fn push_front(&mut self, v: &[u8]) {
        let need = encoded_len(v.len());
        debug_assert!(self.head >= need);
        self.head -= need;
        let head = self.head;
        encode_into(&mut self.data[head..head + need], v);
        self.count += 1;
    }

    fn front(&self) -> (std::ops::Range<usize>, usize) {
        decode_at(&self.data, self.head)
    }

    fn back(&self) -> (std::ops::Range<usize>, usize) {
        decode_before(&self.data, self.data.len())
    }

    /// Removes the first element after `take` has seen its bytes; returns what `take`
    /// made of them and their length.
    fn pop_front_with<R>(&mut self, take: impl FnOnce(&[u8]) -> R) -> (R, usize) {
        let (range, next) = self.front();
        let len = range.len();
        let r = take(&self.data[range]);
        self.head = next;
        self.count -= 1;
        (r, len)
    }

    fn pop_back_with<R>(&mut self, take: impl FnOnce(&[u8]) -> R) -> (R, usize) {
        let (range, start) = self.back();
        let len = range.len();
        let r = take(&self.data[range]);
        self.data.truncate(start);
        self.count -= 1;
        (r, len)
    }

    fn iter(&self) -> ChunkIter<'_> {
        ChunkIter {
            data: &self.data,
            front: self.head,
            back: self.data.len(),
            left: self.count,
        }
    }

    /// Rebuilds the chunk from `items` (for edits in the middle).
    fn from_items<'a>(items: impl Iterator<Item = &'a [u8]>) -> Chunk {
        let mut c = Chunk::default();
        for v in items {
            c.push_back(v);
        }
        c
    }
}

struct ChunkIter<'a> {
    data: &'a [u8],
    front: usize,
    back: usize,
    left: usize,
}

impl<'a> Iterator for ChunkIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        let (range, next) = decode_at(self.data, self.front);
        self.front = next;
        self.left -= 1;
        Some(&self.data[range])
    }
}

impl DoubleEndedIterator for ChunkIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let (range, start) = decode_before(self.data, self.back);
        self.back = start;
        self.left -= 1;
        Some(&self.data[range])
    }
}

#[derive(Clone, Debug, Default)]
pub struct List {
    /// Chunks are shared, not copied, when the list is cloned (a snapshot takes a list as
    /// it is at its cut that way); a shared chunk is copied before it changes.
    chunks: VecDeque<Arc<Chunk>>,
    len: usize,
    bytes: usize,
}

impl List {
    pub fn new() -> List {
        List::default()
    }

    /// For a prefetch: where the pointers to the first and last chunks are kept. Reads
    /// the list's header, not those pointers.
    pub fn end_slots(&self) -> [*const u8; 2] {
        let (a, b) = self.chunks.as_slices();
        let first = a.as_ptr().cast::<u8>();
        let last = b
            .last()
            .or(a.last())
            .map_or(first, |l| (l as *const Arc<Chunk>).cast());
        [first, last]
    }

    /// For a prefetch: the first and last chunks' headers, with the reference counts
    /// just before them that `Arc::make_mut` reads first (each may span two lines). Reads
    /// the pointers `end_slots` gave, not the chunks.
    pub fn end_chunks(&self) -> [*const u8; 4] {
        let header = |c: &Arc<Chunk>| {
            let at = Arc::as_ptr(c).cast::<u8>();
            let counts = 2 * std::mem::size_of::<usize>();
            [
                at.wrapping_sub(counts),
                at.wrapping_add(std::mem::size_of::<Chunk>() - 1),
            ]
        };
        match (self.chunks.front(), self.chunks.back()) {
            (Some(f), Some(b)) => {
                let ([f0, f1], [b0, b1]) = (header(f), header(b));
                [f0, f1, b0, b1]
            }
            _ => [std::ptr::null(); 4],
        }
    }

    /// For a prefetch: the bytes at the list's two ends, the element a pop reads (a push
    /// writes next to them). Reads the chunks' headers `end_chunks` gave.
    pub fn end_bytes(&self) -> [*const u8; 2] {
        match (self.chunks.front(), self.chunks.back()) {
            (Some(f), Some(b)) => [
                f.data.as_ptr().wrapping_add(f.head),
                b.data.as_ptr().wrapping_add(b.data.len().saturating_sub(1)),
            ],
            _ => [std::ptr::null(); 2],
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn push_back(&mut self, v: &[u8]) {
        self.push_back_at(v, crate::clock::unix_ms());
    }

    pub fn push_front(&mut self, v: &[u8]) {
        self.push_front_at(v, crate::clock::unix_ms());
    }

    /// Appends `v`, pushed at `now_ms` (the command's clock).
    pub fn push_back_at(&mut self, v: &[u8], now_ms: u64) {
        let need = encoded_len(v.len());
        let fits = self
            .chunks
            .back()
            .is_some_and(|c| c.data.len() + need <= CHUNK_BYTES || c.count == 0);
        if !fits {
            self.chunks.push_back(Arc::default());
        }
        let c = Arc::make_mut(self.chunks.back_mut().expect("a chunk"));
        c.push_back(v);
        c.stamp_push(now_ms, false);
        self.len += 1;
        self.bytes += v.len();
    }

    /// Prepends `v`, pushed at `now_ms`.
    pub fn push_front_at(&mut self, v: &[u8], now_ms: u64) {
        let need = encoded_len(v.len());
        let fits = self
            .chunks
            .front()
            .is_some_and(|c| c.head >= need && c.used() + need <= CHUNK_BYTES);
        if !fits {
            // A chunk for head pushes is filled from its end. It starts small and doubles
            // up to the chunk size, so a queue that empties and refills with one job at a
            // time does not allocate (and zero) 8 KiB per job.
            let front_size = self.chunks.front().map_or(0, |c| c.data.len());
            let size = (front_size * 2).clamp(64, CHUNK_BYTES).max(need);
            self.chunks.push_front(Arc::new(Chunk {
                data: vec![0; size],
                head: size,
                ..Chunk::default()
            }));
        }
        let c = Arc::make_mut(self.chunks.front_mut().expect("a chunk"));
        c.push_front(v);
        c.stamp_push(now_ms, true);
        self.len += 1;
        self.bytes += v.len();
    }

    pub fn pop_front(&mut self) -> Option<Box<[u8]>> {
        self.pop_front_timed().map(|(v, _)| v)
    }

    pub fn pop_back(&mut self) -> Option<Box<[u8]>> {
        self.pop_back_timed().map(|(v, _)| v)
    }

    /// Pops the first element with the (estimated) time it was pushed.
    pub fn pop_front_timed(&mut self) -> Option<(Box<[u8]>, u64)> {
        self.pop_with(true, |v| Box::<[u8]>::from(v))
    }

    /// Pops the last element with the (estimated) time it was pushed.
    pub fn pop_back_timed(&mut self) -> Option<(Box<[u8]>, u64)> {
        self.pop_with(false, |v| Box::<[u8]>::from(v))
    }

    /// Pops an element from the front (or the back), handing its bytes to `take` while
    /// they are still in their chunk: a reply can be written from them without the
    /// element being copied out first. Returns what `take` made and the element's
    /// (estimated) push time.
    pub fn pop_with<R>(&mut self, front: bool, take: impl FnOnce(&[u8]) -> R) -> Option<(R, u64)> {
        let end = if front {
            self.chunks.front_mut()
        } else {
            self.chunks.back_mut()
        };
        let c = Arc::make_mut(end?);
        let pushed = c.stamp_pop(front);
        let (r, len) = if front {
            c.pop_front_with(take)
        } else {
            c.pop_back_with(take)
        };
        if c.count == 0 {
            if front {
                self.chunks.pop_front();
            } else {
                self.chunks.pop_back();
            }
        }
        self.len -= 1;
        self.bytes -= len;
        Some((r, pushed))
    }

    /// The estimated push time of the oldest element: the older of the oldest elements
    /// of the two end chunks (a queue's old end is one of them).
    pub fn oldest_push_ms(&self) -> Option<u64> {
        let oldest = |c: &Chunk| c.push_time(c.taken_old);
        let front = self.chunks.front().map(|c| oldest(c));
        let back = self.chunks.back().map(|c| oldest(c));
        match (front, back) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether pushes land mostly at the front (LPUSH queues): the newest elements are
    /// there.
    pub fn newest_at_front(&self) -> bool {
        self.chunks.front().is_some_and(|c| c.new_at_front)
    }

    /// The chunk holding element `index`, and the element's position inside it.
    fn locate(&self, index: usize) -> Option<(usize, usize)> {
        if index >= self.len {
            return None;
        }
        let mut i = index;
        for (ci, c) in self.chunks.iter().enumerate() {
            if i < c.count {
                return Some((ci, i));
            }
            i -= c.count;
        }
        None
    }

    pub fn get(&self, index: usize) -> Option<&[u8]> {
        let (ci, i) = self.locate(index)?;
        self.chunks[ci].iter().nth(i)
    }

    /// Rewrites one chunk with a change applied to its elements.
    fn edit_chunk(&mut self, ci: usize, f: impl FnOnce(&mut Vec<Vec<u8>>)) {
        let mut items: Vec<Vec<u8>> = self.chunks[ci].iter().map(|v| v.to_vec()).collect();
        let before: usize = items.iter().map(|v| v.len()).sum();
        let count_before = items.len();
        f(&mut items);
        let after: usize = items.iter().map(|v| v.len()).sum();
        self.bytes = self.bytes + after - before;
        self.len = self.len + items.len() - count_before;
        if items.is_empty() {
            self.chunks.remove(ci);
        } else {
            let rebuilt = Chunk::from_items(items.iter().map(|v| &v[..])).restamp(&self.chunks[ci]);
            self.chunks[ci] = Arc::new(rebuilt);
        }
    }

    /// Replaces the element at `index`; false when out of range.
    pub fn set(&mut self, index: usize, v: &[u8]) -> bool {
        let Some((ci, i)) = self.locate(index) else {
            return false;
        };
        self.edit_chunk(ci, |items| items[i] = v.to_vec());
        true
    }

    /// Inserts `v` so that it ends up at `index` (0..=len).
    pub fn insert(&mut self, index: usize, v: &[u8]) {
        if index == 0 {
            return self.push_front(v);
        }
        if index >= self.len {
            return self.push_back(v);
        }
        let (ci, i) = self.locate(index).expect("index within the list");
        self.edit_chunk(ci, |items| items.insert(i, v.to_vec()));
    }

    /// Removes up to `count` elements equal to `v` (all when 0), from the tail when
    /// `from_tail`; returns how many went.
    pub fn remove_matching(&mut self, v: &[u8], count: usize, from_tail: bool) -> usize {
        let limit = if count == 0 { usize::MAX } else { count };
        let mut removed = 0;
        let order: Vec<usize> = if from_tail {
            (0..self.chunks.len()).rev().collect()
        } else {
            (0..self.chunks.len()).collect()
        };
        let mut emptied = Vec::new();
        for ci in order {
            if removed >= limit {
                break;
            }
            if !self.chunks[ci].iter().any(|x| x == v) {
                continue;
            }
            let mut items: Vec<Vec<u8>> = self.chunks[ci].iter().map(|x| x.to_vec()).collect();
            let mut idx: Vec<usize> = (0..items.len()).filter(|&i| items[i] == v).collect();
            if from_tail {
                idx.reverse();
            }
            idx.truncate(limit - removed);
            removed += idx.len();
            idx.sort_unstable();
            for &i in idx.iter().rev() {
                items.remove(i);
            }
            self.len -= idx.len();
            self.bytes -= idx.len() * v.len();
            if items.is_empty() {
                emptied.push(ci);
            } else {
                let rebuilt =
                    Chunk::from_items(items.iter().map(|x| &x[..])).restamp(&self.chunks[ci]);
                self.chunks[ci] = Arc::new(rebuilt);
            }
        }
        emptied.sort_unstable();
        for ci in emptied.into_iter().rev() {
            self.chunks.remove(ci);
        }
        removed
    }

    /// Keeps only the elements in `start..=end` (indices already clamped, start <= end).
    pub fn keep_range(&mut self, start: usize, end: usize) {
        // What is kept was pushed no earlier than the oldest element was.
        let since = self.oldest_push_ms().unwrap_or_else(crate::clock::unix_ms);
        let kept: Vec<Vec<u8>> = self
            .iter()
            .skip(start)
            .take(end + 1 - start)
            .map(|v| v.to_vec())
            .collect();
        self.clear();
        for v in kept {
            self.push_back_at(&v, since);
        }
    }

    pub fn clear(&mut self) {
        self.chunks.clear();
        self.len = 0;
        self.bytes = 0;
    }

    pub fn iter(&self) -> ListIter<'_> {
        ListIter {
            chunks: self.chunks.iter(),
            front: None,
            back: None,
            left: self.len,
        }
    }

    /// The chunks holding elements: the nodes a snapshot writes, one listpack each.
    pub fn node_count(&self) -> usize {
        self.chunks.iter().filter(|c| c.count > 0).count()
    }

    /// The elements of every non-empty chunk from chunk index `from` on, with the index
    /// of the chunk after each: a snapshot writes a list a few nodes at a time.
    pub fn nodes_from(
        &self,
        from: usize,
    ) -> impl Iterator<Item = (usize, impl Iterator<Item = &[u8]>)> {
        self.chunks
            .iter()
            .enumerate()
            .skip(from)
            .filter(|(_, c)| c.count > 0)
            .map(|(i, c)| (i + 1, c.iter()))
    }

    pub fn encoding(&self) -> &'static str {
        if self.len <= LISTPACK_MAX_ITEMS && self.chunks.len() <= 1 {
            "listpack"
        } else {
            "quicklist"
        }
    }

    pub fn heap_size(&self) -> usize {
        self.chunks.iter().map(|c| c.data.capacity()).sum::<usize>()
            + self.chunks.len() * (std::mem::size_of::<Chunk>() + 16)
            + self.chunks.capacity() * std::mem::size_of::<Arc<Chunk>>()
    }
}

pub struct ListIter<'a> {
    chunks: std::collections::vec_deque::Iter<'a, Arc<Chunk>>,
    front: Option<ChunkIter<'a>>,
    back: Option<ChunkIter<'a>>,
    left: usize,
}

impl<'a> Iterator for ListIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        loop {
            if let Some(it) = &mut self.front {
                if let Some(v) = it.next() {
                    self.left -= 1;
                    return Some(v);
                }
            }
            match self.chunks.next() {
                Some(c) => self.front = Some(c.iter()),
                None => {
                    let v = self.back.as_mut()?.next();
                    if v.is_some() {
                        self.left -= 1;
                    }
                    return v;
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl DoubleEndedIterator for ListIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        loop {
            if let Some(it) = &mut self.back {
                if let Some(v) = it.next_back() {
                    self.left -= 1;
                    return Some(v);
                }
            }
            match self.chunks.next_back() {
                Some(c) => self.back = Some(c.iter()),
                None => {
                    let v = self.front.as_mut()?.next_back();
                    if v.is_some() {
                        self.left -= 1;
                    }
                    return v;
                }
            }
        }
    }
}

impl ExactSizeIterator for ListIter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> List {
        let mut l = List::new();
        for i in items {
            l.push_back(i.as_bytes());
        }
        l
    }

    fn items(l: &List) -> Vec<String> {
        l.iter()
            .map(|v| String::from_utf8(v.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn remove_matching_from_either_end() {
        let mut l = list(&["a", "b", "a", "c", "a"]);
        assert_eq!(l.remove_matching(b"a", 2, true), 2);
        assert_eq!(items(&l), ["a", "b", "c"]);
        let mut l = list(&["a", "b", "a", "c", "a"]);
        assert_eq!(l.remove_matching(b"a", 0, false), 3);
        assert_eq!(items(&l), ["b", "c"]);
    }

    #[test]
    fn keep_range_set_insert() {
        let mut l = list(&["a", "b", "c", "d"]);
        l.keep_range(1, 2);
        assert_eq!(items(&l), ["b", "c"]);
        assert!(l.set(1, b"x"));
        assert!(!l.set(2, b"x"));
        l.insert(0, b"z");
        assert_eq!(items(&l), ["z", "b", "x"]);
    }

    /// Random operations compared with a VecDeque model, with element sizes that cross
    /// varint widths and chunk boundaries.
    #[test]
    fn behaves_like_a_deque() {
        let mut model: VecDeque<Vec<u8>> = VecDeque::new();
        let mut l = List::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..60_000u64 {
            let size = match rand() % 10 {
                0 => 0,
                1 => 127,
                2 => 128,
                3 => 300 + (rand() % 9000) as usize,
                _ => (rand() % 40) as usize,
            };
            let v: Vec<u8> = (0..size).map(|i| (step as usize + i) as u8).collect();
            match rand() % 12 {
                0..=2 => {
                    l.push_back(&v);
                    model.push_back(v);
                }
                3..=5 => {
                    l.push_front(&v);
                    model.push_front(v);
                }
                6 | 7 => assert_eq!(l.pop_front().map(|b| b.to_vec()), model.pop_front()),
                8 | 9 => assert_eq!(l.pop_back().map(|b| b.to_vec()), model.pop_back()),
                10 if !model.is_empty() => {
                    let i = (rand() as usize) % model.len();
                    assert_eq!(l.get(i), Some(&model[i][..]));
                    l.set(i, &v);
                    model[i] = v;
                }
                _ if !model.is_empty() => {
                    let i = (rand() as usize) % (model.len() + 1);
                    l.insert(i, &v);
                    model.insert(i, v);
                }
                _ => {}
            }
            assert_eq!(l.len(), model.len());
            if step % 997 == 0 {
                let got: Vec<&[u8]> = l.iter().collect();
                let want: Vec<&[u8]> = model.iter().map(|v| &v[..]).collect();
                assert_eq!(got, want);
                let got_rev: Vec<&[u8]> = l.iter().rev().collect();
                let want_rev: Vec<&[u8]> = model.iter().rev().map(|v| &v[..]).collect();
                assert_eq!(got_rev, want_rev);
                assert_eq!(l.bytes, model.iter().map(|v| v.len()).sum::<usize>());
            }
        }
    }

    #[test]
    fn a_queued_job_costs_about_its_size() {
        let mut l = List::new();
        let job = [b'j'; 150];
        for _ in 0..10_000 {
            l.push_front(&job);
        }
        let per_job = l.heap_size() as f64 / 10_000.0;
        assert!(per_job < 160.0, "{per_job} bytes per job");
    }
}
