//! The stream value.

#[derive(Clone, Debug, Default)]
pub struct Stream {}

impl Stream {
    pub fn encoding(&self) -> &'static str {
        "stream"
    }

    pub fn heap_size(&self) -> usize {
        0
    }
}
