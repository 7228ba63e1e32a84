pub mod parse;
pub mod reply;
