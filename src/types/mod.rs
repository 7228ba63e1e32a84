//! The data structures behind the command families.

pub mod list;
pub mod longdouble;
pub mod table;
pub mod value;
