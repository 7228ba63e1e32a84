//! The hash value.

#[derive(Clone, Debug, Default)]
pub struct Hash {}

impl Hash {
    pub fn encoding(&self) -> &'static str {
        "listpack"
    }

    pub fn heap_size(&self) -> usize {
        0
    }
}
