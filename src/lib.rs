//! Kite's server as a library: the binary (`main.rs`) reads the configuration and
//! starts it; fuzz targets (`fuzz/`) call the parsers and loaders directly. It is not
//! an API for others, so lints about public APIs (`len` without `is_empty`, methods
//! named like trait methods) do not apply.
#![allow(clippy::len_without_is_empty, clippy::should_implement_trait)]

pub mod acl;
pub mod blocking;
pub mod clock;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod memory;
pub mod net;
pub mod observe;
pub mod persist;
pub mod protocol;
pub mod pubsub;
pub mod repl;
pub mod scripting;
pub mod server;
pub mod shard;
pub mod tracking;
pub mod types;
