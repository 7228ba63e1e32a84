//! One Lua 5.1 interpreter per thread, set up as Redis 7 sets up its own: a fixed set of
//! libraries, the `redis` API, and read-only globals.
//!
//! Scripts see their globals through a proxy table: reading a missing global and writing
//! any global are errors, as in Redis. Compiled scripts are kept per thread by SHA, so a
//! script is compiled once on each thread that runs it.

use std::cell::RefCell;

use hashbrown::HashMap;
use mlua::{Function, Lua, LuaOptions, MultiValue, StdLib, Table, Value};

use super::run;

/// What a thread keeps of the Lua world.
pub struct Vm {
    pub lua: Lua,
    /// The globals scripts read, behind `env`.
    real: Table,
    /// The read-only proxy every script and function runs in.
    env: Table,
    setfenv: Function,
    run_script: Function,
    run_function: Function,
    /// The environment of FUNCTION libraries (with `redis.register_function`).
    lib_env: Table,
    compiled: HashMap<String, Function>,
    /// FCALL's functions as loaded on this thread, and the library generation they are.
    pub functions: HashMap<String, Function>,
    pub functions_generation: u64,
    /// The field names a script's table result is looked up by, made once.
    pub reply_keys: super::convert::ReplyKeys,
}

thread_local! {
    static VM: RefCell<Option<Vm>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's interpreter, creating it on first use.
pub fn with_vm<R>(f: impl FnOnce(&mut Vm) -> R) -> R {
    VM.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Vm::new().expect("the Lua interpreter starts"));
        }
        let vm = slot.as_mut().expect("just created");
        run::relax_hook(&vm.lua);
        f(vm)
    })
}

/// Drops this thread's interpreter (SCRIPT FLUSH): the next script gets a fresh one.
pub fn reset() {
    VM.with(|cell| *cell.borrow_mut() = None);
}

/// The globals a script may read, besides the bundled libraries and `redis`.
const BASE_GLOBALS: &[&str] = &[
    "assert",
    "collectgarbage",
    "coroutine",
    "error",
    "gcinfo",
    "getmetatable",
    "ipairs",
    "next",
    "pairs",
    "pcall",
    "rawequal",
    "rawget",
    "rawset",
    "select",
    "setmetatable",
    "string",
    "table",
    "math",
    "tonumber",
    "tostring",
    "type",
    "unpack",
    "xpcall",
    "_VERSION",
    "bit",
    "cjson",
    "cmsgpack",
    "struct",
];

/// Builds the sandbox. Runs with the stock globals; returns the proxy and the runners.
const SETUP: &str = r#"
local real, names, error_text = ...
local INTERNAL = "=kite"
local getinfo, type, tostring, error, rawget, setmetatable, xpcall, setfenv, loadstring, load =
  debug.getinfo, type, tostring, error, rawget, setmetatable, xpcall, setfenv, loadstring, load

for _, name in ipairs(names) do
  real[name] = _G[name]
end

-- Redis's pcall hands back the message of an {err=...} error, not the table.
local pcall_raw = pcall
local function pcall_result(ok, ...)
  if ok then return ok, ... end
  local e = ...
  if type(e) == "table" and (type(e.err) == "string" or type(e.err) == "number") then
    return false, e.err
  end
  return false, e
end
real.pcall = function(...)
  return pcall_result(pcall_raw(...))
end

local function deny_write()
  error("Attempt to modify a readonly table", 2)
end
-- Every table a script must not change: rawset and setmetatable refuse them too, as
-- Redis's read-only tables do.
local protected = setmetatable({}, { __mode = "k" })
local function readonly(t)
  local proxy = setmetatable({}, { __index = t, __newindex = deny_write, __metatable = false })
  protected[proxy] = true
  return proxy
end
local rawset_raw = rawset
real.rawset = function(t, k, v)
  if protected[t] then error("Attempt to modify a readonly table", 2) end
  return rawset_raw(t, k, v)
end
real.setmetatable = function(t, mt)
  if protected[t] then error("Attempt to modify a readonly table", 2) end
  return setmetatable(t, mt)
end

-- Errors leave a script as a table {err=...} that also says where they were raised:
-- the first frame that is neither C nor this file.
local function handler(err)
  local level, info = 2, nil
  while true do
    info = getinfo(level, "nSl")
    if info == nil or (info.what ~= "C" and info.source:sub(1, 5) ~= INTERNAL) then break end
    level = level + 1
  end
  if type(err) == "userdata" then
    err = { err = "ERR " .. error_text(err) }
  elseif type(err) ~= "table" then
    err = { err = "ERR " .. tostring(err) }
  end
  if info then
    err.source = info.source
    err.line = info.currentline
  end
  return err
end
real.__redis__err__handler = handler

-- FUNCTION libraries see the same globals, except that their `redis` also has
-- register_function; EVAL scripts do not see it at all.
local redis_base = real.redis
local lib_redis = {}
for k, v in pairs(redis_base) do lib_redis[k] = v end
redis_base.register_function = nil
local lib_globals = { redis = readonly(lib_redis) }

local function missing_global(_, key)
  error("Script attempted to access nonexistent global variable '" .. tostring(key) .. "'", 2)
end
-- A script's globals are read through `env`, whose __index is the table of real
-- globals itself, so Lua finds KEYS, ARGV and redis without calling a function; only a
-- name missing there too reaches `real`'s own __index (set last, below), which raises
-- Redis's error.
local env_meta = {
  __index = real,
  __newindex = deny_write,
}
-- getmetatable(_G) shows a read-only view of the globals' metatable, as in Redis.
env_meta.__metatable = readonly({
  __index = function(t, key)
    local value = rawget(real, key)
    if value == nil then missing_global(t, key) end
    return value
  end,
  __newindex = deny_write,
})
local env = setmetatable({}, env_meta)
real._G = env
-- Precompiled bytecode is never loaded: Lua 5.1 does not verify it, and a crafted
-- chunk reads and writes memory at will. Text is all a script may compile.
local BYTECODE = "\27"
local sub, concat = string.sub, table.concat
real.loadstring = function(s, name)
  if type(s) == "string" and sub(s, 1, 1) == BYTECODE then
    return nil, "attempt to load a binary chunk"
  end
  local f, e = loadstring(s, name)
  if f then setfenv(f, env) end
  return f, e
end
real.load = function(chunk, name)
  if type(chunk) == "function" then
    local parts = {}
    while true do
      local piece = chunk()
      if piece == nil or piece == "" then break end
      if type(piece) ~= "string" then return nil, "reader function must return a string" end
      parts[#parts + 1] = piece
    end
    chunk = concat(parts)
  end
  return real.loadstring(chunk, name)
end
for _, name in ipairs({ "string", "table", "math", "coroutine", "bit", "cjson", "cmsgpack", "struct", "redis" }) do
  if real[name] ~= nil then real[name] = readonly(real[name]) end
end
-- Strings share one metatable whose __index is the string library: scripts see a
-- read-only copy of it, so no script can change what another script's strings do.
local string_meta = getmetatable("")
string_meta.__metatable = readonly({ __index = real.string })
protected[env] = true

local function run_script(f)
  return xpcall(f, handler)
end
local function run_function(callback, keys, args)
  return xpcall(function() return callback(keys, args) end, handler)
end
local lib_env = setmetatable({}, {
  __index = function(_, key)
    local value = rawget(lib_globals, key)
    if value == nil then value = rawget(real, key) end
    if value == nil then
      error("Script attempted to access nonexistent global variable '" .. tostring(key) .. "'", 2)
    end
    return value
  end,
  __newindex = deny_write,
  __metatable = false,
})
protected[lib_env] = true
setmetatable(real, { __index = missing_global, __metatable = false })
return env, run_script, run_function, setfenv, lib_env
"#;

/// The message of an error raised by Rust code (a callback's own text, without mlua's
/// traceback), as Redis would show it.
fn error_text(e: &Value) -> String {
    fn inner(e: &mlua::Error) -> String {
        match e {
            mlua::Error::CallbackError { cause, .. } => inner(cause),
            mlua::Error::RuntimeError(m) => m.clone(),
            other => other.to_string(),
        }
    }
    match e {
        Value::Error(e) => inner(e),
        other => format!("{other:?}"),
    }
}

/// Memory one thread's interpreter may hold.
const LUA_MEMORY_LIMIT: usize = 1 << 30;

/// Lua 5.1 has no emergency collection: after a script that left much garbage (one that
/// ran out of memory, say), collect at once so the next script has room.
pub fn collect_if_large() {
    VM.with(|cell| {
        if let Some(vm) = cell.borrow().as_ref() {
            if vm.lua.used_memory() > LUA_MEMORY_LIMIT / 4 {
                let _ = vm.lua.gc_collect();
            }
        }
    });
}

thread_local! {
    /// `redis.call`'s argument buffer, argument vector and argument ends, reused from
    /// call to call.
    static CALL_ARGS: std::cell::RefCell<(bytes::BytesMut, Vec<bytes::Bytes>, Vec<usize>)> =
        std::cell::RefCell::new((bytes::BytesMut::new(), Vec::new(), Vec::new()));
}

/// `redis.call` is a C function, as in Redis: a command error is raised as the `{err=}`
/// table itself (so `pcall(redis.call, ...)` gets the table), and a script's
/// `return redis.call(...)` keeps its own frame, so errors name the script's line.
unsafe extern "C-unwind" fn redis_call_c(state: *mut mlua::ffi::lua_State) -> std::os::raw::c_int {
    call_through(state, true)
}

unsafe extern "C-unwind" fn redis_pcall_c(state: *mut mlua::ffi::lua_State) -> std::os::raw::c_int {
    call_through(state, false)
}

/// Reads the script's arguments, runs the command in Rust, then turns the reply into Lua
/// values straight on the stack (`convert::push_resp`), with no per-value protected call.
/// Everything that owns memory lives in the first block, which makes no Lua call that can
/// raise; what follows only touches raw pointers, so a Lua error (out of memory) may
/// unwind through it.
unsafe fn call_through(state: *mut mlua::ffi::lua_State, raise: bool) -> std::os::raw::c_int {
    use mlua::ffi;
    let is_error = {
        let n = ffi::lua_gettop(state);
        // The arguments are copied into one reused buffer and handed over as slices of it:
        // no allocation per argument, or per call once the buffer is big enough.
        let (mut buf, mut argv, mut ends) =
            CALL_ARGS.with(|c| std::mem::take(&mut *c.borrow_mut()));
        let mut bad = false;
        for i in 1..=n {
            match ffi::lua_type(state, i) {
                ffi::LUA_TSTRING => {
                    let mut len = 0usize;
                    let p = ffi::lua_tolstring(state, i, &mut len) as *const u8;
                    buf.extend_from_slice(std::slice::from_raw_parts(p, len));
                }
                ffi::LUA_TNUMBER => buf.extend_from_slice(
                    crate::protocol::reply::format_double(ffi::lua_tonumber(state, i)).as_bytes(),
                ),
                _ => {
                    bad = true;
                    break;
                }
            }
            ends.push(buf.len());
        }
        // One split for the call, then a slice per argument (a split each cost more).
        let all = buf.split().freeze();
        let mut start = 0;
        for &end in &ends {
            argv.push(all.slice(start..end));
            start = end;
        }
        drop(all);
        let is_error = run::call_into_buffer(&argv, bad);
        argv.clear();
        ends.clear();
        CALL_ARGS.with(|c| *c.borrow_mut() = (buf, argv, ends));
        is_error
    };
    let (ptr, len) = run::call_output();
    ffi::lua_settop(state, 0);
    ffi::luaL_checkstack(state, 8, c"redis.call".as_ptr());
    if is_error {
        ffi::lua_createtable(state, 0, 1);
        ffi::lua_pushlstring(state, ptr as *const _, len);
        ffi::lua_setfield(state, -2, c"err".as_ptr());
        if raise {
            ffi::lua_error(state);
        }
        return 1;
    }
    if len == 0 {
        ffi::lua_pushnil(state);
        return 1;
    }
    let mut pos = 0usize;
    super::convert::push_resp(state, std::slice::from_raw_parts(ptr, len), &mut pos);
    1
}

impl Vm {
    fn new() -> mlua::Result<Vm> {
        // The debug library is loaded for the error handler only; scripts never see it.
        let lua = unsafe {
            Lua::unsafe_new_with(
                StdLib::TABLE | StdLib::STRING | StdLib::MATH | StdLib::DEBUG,
                LuaOptions::new(),
            )
        };
        super::libs::register(&lua)?;
        // A script that allocates without end gets "not enough memory" instead of taking
        // the machine's memory.
        lua.set_memory_limit(LUA_MEMORY_LIMIT)?;
        let real = lua.create_table()?;
        let redis = run::redis_api(&lua)?;
        // SAFETY: both are plain Lua C functions that follow the C API's stack rules.
        unsafe {
            redis.raw_set("call", lua.create_c_function(redis_call_c)?)?;
            redis.raw_set("pcall", lua.create_c_function(redis_pcall_c)?)?;
        }
        real.raw_set("redis", redis)?;
        let names = lua.create_sequence_from(BASE_GLOBALS.iter().copied())?;
        let (env, run_script, run_function, setfenv, lib_env): (
            Table,
            Function,
            Function,
            Function,
            Table,
        ) = lua.load(SETUP).set_name("=kite").call((
            real.clone(),
            names,
            lua.create_function(|_, e: Value| Ok(error_text(&e)))?,
        ))?;
        run::install_hook(&lua);
        let reply_keys = super::convert::ReplyKeys::new(&lua)?;
        Ok(Vm {
            reply_keys,
            lua,
            real,
            env,
            setfenv,
            run_script,
            run_function,
            lib_env,
            compiled: HashMap::new(),
            functions: HashMap::new(),
            functions_generation: 0,
        })
    }

    /// Compiles a script body as Redis does (chunk `@user_script`), or returns Redis's
    /// compile error text.
    pub fn compile(&mut self, sha: &str, body: &[u8]) -> Result<Function, String> {
        if let Some(f) = self.compiled.get(sha) {
            return Ok(f.clone());
        }
        let f = self
            .load_chunk(body, "@user_script", false)
            .map_err(|e| format!("ERR Error compiling script (new function): {}", e))?;
        self.compiled.insert(sha.to_string(), f.clone());
        Ok(f)
    }

    /// Loads `body` under the sandbox. The error is Lua's message alone.
    pub fn load_chunk(&self, body: &[u8], name: &str, library: bool) -> Result<Function, String> {
        let f = self
            .lua
            .load(body)
            .set_name(name)
            .set_mode(mlua::ChunkMode::Text)
            .into_function()
            .map_err(|e| match e {
                mlua::Error::SyntaxError { message, .. } => message,
                other => other.to_string(),
            })?;
        self.setfenv
            .call::<()>((
                f.clone(),
                if library {
                    self.lib_env.clone()
                } else {
                    self.env.clone()
                },
            ))
            .map_err(|e| e.to_string())?;
        Ok(f)
    }

    /// Sets KEYS and ARGV, as Redis sets them before each script, and runs the compiled
    /// script under the error handler: Ok(value) or Err(error table). One protected call
    /// does both, with the arguments built on the raw stack: no Lua string or closure is
    /// made per argument, and no vector for the results.
    pub fn run_script_with(
        &self,
        f: &Function,
        keys: &[bytes::Bytes],
        argv: &[bytes::Bytes],
    ) -> mlua::Result<Result<Value, Value>> {
        // The globals table is at index 1; each array is set as its field `name`.
        unsafe fn fill(
            state: *mut mlua::ffi::lua_State,
            name: &std::ffi::CStr,
            items: &[bytes::Bytes],
        ) {
            use mlua::ffi;
            ffi::lua_createtable(state, items.len() as _, 0);
            for (i, s) in items.iter().enumerate() {
                ffi::lua_pushlstring(state, s.as_ptr() as *const _, s.len());
                ffi::lua_rawseti(state, -2, (i + 1) as _);
            }
            ffi::lua_setfield(state, 1, name.as_ptr());
        }
        // SAFETY: only stack operations on the state mlua hands us, inside its protected
        // call; nothing here owns memory that a Lua error could skip. `run_script` is
        // `xpcall` under the error handler, so the script's own errors come back as
        // values; what still raises (out of memory) leaves through mlua's protection.
        let (ok, value): (bool, Value) = unsafe {
            self.lua
                .exec_raw((&self.real, &self.run_script, f), |state| {
                    use mlua::ffi;
                    ffi::luaL_checkstack(state, 4, c"KEYS".as_ptr());
                    fill(state, c"KEYS", keys);
                    fill(state, c"ARGV", argv);
                    // run_script, f: call it for its two results.
                    ffi::lua_remove(state, 1);
                    ffi::lua_call(state, 1, 2);
                })?
        };
        Ok(if ok { Ok(value) } else { Err(value) })
    }

    pub fn strings(&self, items: &[bytes::Bytes]) -> mlua::Result<Table> {
        let t = self.lua.create_table_with_capacity(items.len(), 0)?;
        for (i, s) in items.iter().enumerate() {
            t.raw_set(i + 1, self.lua.create_string(&s[..])?)?;
        }
        Ok(t)
    }

    /// Runs a compiled script under the error handler: Ok(value) or Err(error table).
    pub fn run_script(&self, f: &Function) -> mlua::Result<Result<Value, Value>> {
        Ok(xpcall_result(
            self.run_script.call::<MultiValue>(f.clone())?,
        ))
    }

    /// Runs an FCALL function with its keys and arguments.
    pub fn run_function(
        &self,
        f: &Function,
        keys: &[bytes::Bytes],
        args: &[bytes::Bytes],
    ) -> mlua::Result<Result<Value, Value>> {
        let r = self.run_function.call::<MultiValue>((
            f.clone(),
            self.strings(keys)?,
            self.strings(args)?,
        ))?;
        Ok(xpcall_result(r))
    }
}

/// What `xpcall` returned: the script's first result, or the error (table).
fn xpcall_result(r: MultiValue) -> Result<Value, Value> {
    let mut r = r.into_iter();
    let ok = matches!(r.next(), Some(Value::Boolean(true)));
    let v = r.next().unwrap_or(Value::Nil);
    if ok {
        Ok(v)
    } else {
        Err(v)
    }
}
