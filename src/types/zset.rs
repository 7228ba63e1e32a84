//! The sorted set value.

#[derive(Clone, Debug, Default)]
pub struct ZSet {}

impl ZSet {
    pub fn encoding(&self) -> &'static str {
        "listpack"
    }

    pub fn heap_size(&self) -> usize {
        0
    }
}
