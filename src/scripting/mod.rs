//! Lua scripting: EVAL, EVALSHA, FUNCTION and FCALL (see docs/scripting.md).

pub mod libs;
