//! The set value.

#[derive(Clone, Debug, Default)]
pub struct Set {}

impl Set {
    pub fn encoding(&self) -> &'static str {
        "listpack"
    }

    pub fn heap_size(&self) -> usize {
        0
    }
}
