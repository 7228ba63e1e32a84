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

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
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
