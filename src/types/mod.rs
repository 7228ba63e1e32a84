//! The data structures behind the command families.

pub mod geohash;
pub mod hash;
pub mod hll;
pub mod key;
pub mod list;
pub mod longdouble;
pub mod set;
pub mod stream;
pub mod table;
pub mod value;
pub mod zset;
