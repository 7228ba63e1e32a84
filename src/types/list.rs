//! The list value. The representation is private so it can become more compact later
//! without touching the command family.

use std::collections::VecDeque;

#[derive(Clone, Debug, Default)]
pub struct List {
    items: VecDeque<Box<[u8]>>,
    bytes: usize,
}

/// Redis 7.2 keeps a list in one listpack while it stays under 8 KiB (and 128 entries
/// for our estimate); OBJECT ENCODING reports that.
const LISTPACK_MAX_BYTES: usize = 8192;
const LISTPACK_MAX_ITEMS: usize = 128;

impl List {
    pub fn new() -> List {
        List::default()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn push_front(&mut self, v: &[u8]) {
        self.bytes += v.len();
        self.items.push_front(v.into());
    }

    pub fn push_back(&mut self, v: &[u8]) {
        self.bytes += v.len();
        self.items.push_back(v.into());
    }

    pub fn pop_front(&mut self) -> Option<Box<[u8]>> {
        let v = self.items.pop_front()?;
        self.bytes -= v.len();
        Some(v)
    }

    pub fn pop_back(&mut self) -> Option<Box<[u8]>> {
        let v = self.items.pop_back()?;
        self.bytes -= v.len();
        Some(v)
    }

    pub fn get(&self, index: usize) -> Option<&[u8]> {
        self.items.get(index).map(|v| &v[..])
    }

    /// Replaces the element at `index`; false when out of range.
    pub fn set(&mut self, index: usize, v: &[u8]) -> bool {
        match self.items.get_mut(index) {
            Some(slot) => {
                self.bytes = self.bytes - slot.len() + v.len();
                *slot = v.into();
                true
            }
            None => false,
        }
    }

    /// Inserts `v` so that it ends up at `index` (0..=len).
    pub fn insert(&mut self, index: usize, v: &[u8]) {
        self.bytes += v.len();
        self.items.insert(index, v.into());
    }

    /// Removes up to `count` elements equal to `v` (all when 0), from the tail when
    /// `from_tail`; returns how many went.
    pub fn remove_matching(&mut self, v: &[u8], count: usize, from_tail: bool) -> usize {
        let mut removed = 0;
        let limit = if count == 0 { usize::MAX } else { count };
        if from_tail {
            let mut i = self.items.len();
            while i > 0 && removed < limit {
                i -= 1;
                if &self.items[i][..] == v {
                    self.items.remove(i);
                    removed += 1;
                }
            }
        } else {
            let mut i = 0;
            while i < self.items.len() && removed < limit {
                if &self.items[i][..] == v {
                    self.items.remove(i);
                    removed += 1;
                } else {
                    i += 1;
                }
            }
        }
        self.bytes -= removed * v.len();
        removed
    }

    /// Keeps only the elements in `start..=end` (indices already clamped, start <= end).
    pub fn keep_range(&mut self, start: usize, end: usize) {
        self.items.truncate(end + 1);
        self.items.drain(..start);
        self.bytes = self.items.iter().map(|v| v.len()).sum();
    }

    pub fn clear(&mut self) {
        self.items.clear();
        self.bytes = 0;
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &[u8]> + ExactSizeIterator {
        self.items.iter().map(|v| &v[..])
    }

    pub fn encoding(&self) -> &'static str {
        if self.items.len() <= LISTPACK_MAX_ITEMS && self.bytes <= LISTPACK_MAX_BYTES {
            "listpack"
        } else {
            "quicklist"
        }
    }

    pub fn heap_size(&self) -> usize {
        self.bytes + self.items.capacity() * std::mem::size_of::<Box<[u8]>>()
    }
}

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
}
