//! The data structures behind the command families.

pub mod table;
pub mod value;
