//! The Lua libraries Redis bundles for scripts: cjson, cmsgpack, bit and struct.
//!
//! Each library lives in its own file and is written against the behaviour of
//! redis-server 7.0 (checked case by case against the real server).
//!
//! Errors: the C libraries raise plain string errors through `luaL_error`,
//! which prefixes the *caller's* position (`user_script:3: ...`), and scripts
//! may `pcall` them and inspect the text. mlua would instead raise a wrapped
//! Rust error object, so every library function here is a Rust "raw" function
//! that reports failure as a sentinel return value, wrapped in a tiny Lua
//! closure that turns the sentinel into `error(msg, level)`. The result is
//! the same string error, with the same position prefix, as Redis gives.

use std::ffi::{c_char, c_int, c_void, CString};

use mlua::{Function, LightUserData, Lua, MultiValue, Value};

mod bit;
mod cjson;
mod cmsgpack;
mod structlib;

/// Installs the bundled libraries as globals of `lua`.
pub fn register(lua: &Lua) -> mlua::Result<()> {
    let wrap = Wrapper::new(lua)?;
    let globals = lua.globals();
    globals.set("cjson", cjson::module(lua, &wrap)?)?;
    globals.set("cmsgpack", cmsgpack::module(lua, &wrap)?)?;
    globals.set("bit", bit::module(lua, &wrap)?)?;
    globals.set("struct", structlib::module(lua, &wrap)?)?;
    Ok(())
}

/// Lua's own limit on stack slots a C function may use (LUAI_MAXCSTACK).
/// The C libraries hit it on very deep or very long inputs; we mirror the
/// slot accounting so the same inputs fail with the same message.
pub(crate) const LUA_MAX_C_STACK: usize = 8000;

/// How a library function failed.
#[derive(Debug)]
pub(crate) enum LibError {
    /// A `luaL_error`-style error: prefixed with the caller's position.
    At(String),
    /// An error raised by the Lua core itself (e.g. "table index is nil"),
    /// which carries no position when raised inside a C function.
    Bare(String),
    /// An mlua failure (out of memory and the like), passed through as is.
    Lua(mlua::Error),
}

impl From<mlua::Error> for LibError {
    fn from(e: mlua::Error) -> Self {
        LibError::Lua(e)
    }
}

pub(crate) type LibResult<T> = Result<T, LibError>;

/// `bad argument #n to 'fname' (msg)`, as `luaL_argerror` words it.
pub(crate) fn arg_error(n: usize, fname: &str, msg: impl std::fmt::Display) -> LibError {
    LibError::At(format!("bad argument #{n} to '{fname}' ({msg})"))
}

/// Lua's name for the type of a value; `None` is an absent argument.
pub(crate) fn type_name(v: Option<&Value>) -> &'static str {
    match v {
        None => "no value",
        Some(Value::Nil) => "nil",
        Some(Value::Boolean(_)) => "boolean",
        Some(Value::Integer(_)) | Some(Value::Number(_)) => "number",
        Some(Value::String(_)) => "string",
        Some(Value::Table(_)) => "table",
        Some(Value::Function(_)) => "function",
        Some(Value::Thread(_)) => "thread",
        Some(_) => "userdata",
    }
}

/// The arguments of one call, with the `luaL_check*` family of helpers.
pub(crate) struct Args<'a> {
    pub lua: &'a Lua,
    pub vals: Vec<Value>,
    pub fname: &'static str,
}

impl<'a> Args<'a> {
    pub fn new(lua: &'a Lua, args: MultiValue, fname: &'static str) -> Self {
        Args {
            lua,
            vals: args.into_vec(),
            fname,
        }
    }

    pub fn len(&self) -> usize {
        self.vals.len()
    }

    /// Argument `n` (1-based), `None` when absent.
    pub fn get(&self, n: usize) -> Option<&Value> {
        self.vals.get(n.wrapping_sub(1))
    }

    pub fn is_none_or_nil(&self, n: usize) -> bool {
        matches!(self.get(n), None | Some(Value::Nil))
    }

    fn type_error(&self, n: usize, expected: &str) -> LibError {
        arg_error(
            n,
            self.fname,
            format!("{expected} expected, got {}", type_name(self.get(n))),
        )
    }

    /// Number or numeric string, like `luaL_checknumber`.
    pub fn number(&self, n: usize) -> LibResult<f64> {
        match self.get(n) {
            Some(Value::Number(x)) => Ok(*x),
            Some(Value::Integer(i)) => Ok(*i as f64),
            Some(v @ Value::String(_)) => match self.lua.coerce_number(v.clone())? {
                Some(x) => Ok(x),
                None => Err(self.type_error(n, "number")),
            },
            _ => Err(self.type_error(n, "number")),
        }
    }

    /// Like `luaL_checkinteger`: a number truncated toward zero.
    pub fn integer(&self, n: usize) -> LibResult<i64> {
        self.number(n).map(double_to_integer)
    }

    /// Like `luaL_optinteger`: `default` when absent or nil.
    pub fn opt_integer(&self, n: usize, default: i64) -> LibResult<i64> {
        if self.is_none_or_nil(n) {
            Ok(default)
        } else {
            self.integer(n)
        }
    }

    /// String or number (converted as Lua does), like `luaL_checklstring`.
    pub fn bytes(&self, n: usize) -> LibResult<mlua::String> {
        match self.get(n) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v @ (Value::Number(_) | Value::Integer(_))) => {
                match self.lua.coerce_string(v.clone())? {
                    Some(s) => Ok(s),
                    None => Err(self.type_error(n, "string")),
                }
            }
            _ => Err(self.type_error(n, "string")),
        }
    }
}

/// Lua 5.1's double to `lua_Integer` conversion on x86-64: truncation, with
/// out-of-range values (and NaN) giving the "integer indefinite" value.
pub(crate) fn double_to_integer(x: f64) -> i64 {
    if (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&x) {
        x as i64
    } else {
        i64::MIN
    }
}

/// A C `(int)` cast of a double on x86-64 (out of range gives `INT_MIN`).
pub(crate) fn double_to_int32(x: f64) -> i32 {
    if x > -2_147_483_649.0 && x < 2_147_483_648.0 {
        x as i32
    } else {
        i32::MIN
    }
}

/// Formats `x` like C's `printf("%.*g", precision, x)`, which is what Lua's
/// `tostring` (precision 14) and lua-cjson use.
pub(crate) fn format_g(x: f64, precision: i32) -> String {
    let mut buf = [0u8; 64];
    // SAFETY: the format takes exactly one int and one double, and snprintf
    // never writes past the given length.
    let n = unsafe {
        libc::snprintf(
            buf.as_mut_ptr() as *mut c_char,
            buf.len(),
            c"%.*g".as_ptr(),
            precision as c_int,
            x,
        )
    };
    let n = (n.max(0) as usize).min(buf.len() - 1);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Parses the longest number at the start of `s` the way C's `strtod` does
/// (decimal, hex, inf/infinity, nan), returning the value and bytes used.
pub(crate) fn strtod_prefix(s: &[u8]) -> Option<(f64, usize)> {
    // strtod only ever consumes these characters; copying just that run
    // keeps the work proportional to the number, not the whole input.
    let run = s
        .iter()
        .position(|b| !(b.is_ascii_alphanumeric() || b"+-._()".contains(b)))
        .unwrap_or(s.len());
    let text = CString::new(&s[..run]).ok()?;
    let mut end: *mut c_char = std::ptr::null_mut();
    // SAFETY: `text` is NUL-terminated and outlives the call; `end` points
    // into it afterwards.
    let value = unsafe { libc::strtod(text.as_ptr(), &mut end) };
    let used = end as usize - text.as_ptr() as usize;
    (used > 0).then_some((value, used))
}

/// The sentinel a raw function returns first to signal failure. Scripts
/// cannot make light userdata, so they can never produce this value.
static FAIL_MARK: u8 = 0;

fn fail_mark() -> Value {
    Value::LightUserData(LightUserData(&FAIL_MARK as *const u8 as *mut c_void))
}

/// Builds script-visible functions from Rust closures (see the module docs).
#[derive(Clone)]
pub(crate) struct Wrapper;

/// The C function every library function is: it calls its Rust part (upvalue 1) and
/// raises the error that part reports, with the caller's position as `luaL_error` adds
/// it. Being a C function, a script's `return cjson.decode(x)` keeps the script's own
/// frame, so the position is the script's line. Upvalue 2 says whether the Rust part
/// returns a table of results to spread.
pub(crate) unsafe extern "C-unwind" fn lib_call(state: *mut mlua::ffi::lua_State) -> c_int {
    use mlua::ffi;
    let n = ffi::lua_gettop(state);
    ffi::luaL_checkstack(state, 4, c"library call".as_ptr());
    ffi::lua_pushvalue(state, ffi::lua_upvalueindex(1));
    ffi::lua_insert(state, 1);
    ffi::lua_call(state, n, 3);
    // The stack is now: value, message, level.
    let failed = ffi::lua_type(state, -3) == ffi::LUA_TLIGHTUSERDATA
        && std::ptr::eq(ffi::lua_touserdata(state, -3) as *const u8, &FAIL_MARK);
    if failed {
        let level = ffi::lua_tointeger(state, -1);
        ffi::lua_pop(state, 1);
        if level > 0 {
            ffi::luaL_where(state, 1);
            ffi::lua_insert(state, -2);
            ffi::lua_concat(state, 2);
        }
        ffi::lua_error(state);
    }
    ffi::lua_pop(state, 2);
    if ffi::lua_toboolean(state, ffi::lua_upvalueindex(2)) == 0 {
        return 1;
    }
    // Spread fields 1..n of the results table, as many as a C function may return.
    ffi::lua_getfield(state, -1, c"n".as_ptr());
    let count = ffi::lua_tonumber(state, -1) as c_int;
    ffi::lua_pop(state, 1);
    if ffi::lua_checkstack(state, count) == 0 {
        ffi::luaL_error(state, c"too many results".as_ptr());
    }
    let table = ffi::lua_gettop(state);
    for i in 1..=count {
        ffi::lua_rawgeti(state, table, i as _);
    }
    count
}

impl Wrapper {
    fn new(_lua: &Lua) -> mlua::Result<Self> {
        Ok(Wrapper)
    }

    fn raw<F>(lua: &Lua, f: F) -> mlua::Result<Function>
    where
        F: Fn(&Lua, MultiValue) -> LibResult<Value> + 'static,
    {
        lua.create_function(move |lua, args: MultiValue| match f(lua, args) {
            Ok(v) => Ok(MultiValue::from_vec(vec![v, Value::Nil, Value::Nil])),
            Err(LibError::At(msg)) => Ok(MultiValue::from_vec(vec![
                fail_mark(),
                Value::String(lua.create_string(msg)?),
                Value::Integer(1),
            ])),
            Err(LibError::Bare(msg)) => Ok(MultiValue::from_vec(vec![
                fail_mark(),
                Value::String(lua.create_string(msg)?),
                Value::Integer(0),
            ])),
            Err(LibError::Lua(e)) => Err(e),
        })
    }

    fn wrap(lua: &Lua, raw: Function, multi: bool) -> mlua::Result<Function> {
        Self::wrap_with(lua, raw, multi, lib_call)
    }

    /// Like `wrap`, with a C function of the same upvalues that may answer some calls
    /// itself and hand the others to `lib_call`.
    fn wrap_with(
        lua: &Lua,
        raw: Function,
        multi: bool,
        cfn: mlua::ffi::lua_CFunction,
    ) -> mlua::Result<Function> {
        // SAFETY: pushcclosure takes the two pushed arguments as the upvalues of `cfn`,
        // which follows the C API's stack rules.
        unsafe {
            lua.exec_raw::<Function>((raw, multi), |state| {
                mlua::ffi::lua_pushcclosure(state, cfn, 2);
            })
        }
    }

    /// A multi-value function whose calls go to `cfn` first (a fast path).
    pub fn many_with<F>(
        &self,
        lua: &Lua,
        f: F,
        cfn: mlua::ffi::lua_CFunction,
    ) -> mlua::Result<Function>
    where
        F: Fn(&Lua, MultiValue) -> LibResult<Results> + 'static,
    {
        let raw = Self::raw(lua, move |lua, args| {
            let r = f(lua, args)?;
            r.t.raw_set("n", r.n)?;
            Ok(Value::Table(r.t))
        })?;
        Self::wrap_with(lua, raw, true, cfn)
    }

    /// A function returning exactly one value.
    pub fn one<F>(&self, lua: &Lua, f: F) -> mlua::Result<Function>
    where
        F: Fn(&Lua, MultiValue) -> LibResult<Value> + 'static,
    {
        Self::wrap(lua, Self::raw(lua, f)?, false)
    }

    /// A function returning any number of values.
    pub fn many<F>(&self, lua: &Lua, f: F) -> mlua::Result<Function>
    where
        F: Fn(&Lua, MultiValue) -> LibResult<Results> + 'static,
    {
        self.many_with(lua, f, lib_call)
    }
}

/// The results of a multi-value function, stored in a Lua table as they
/// are produced. (mlua keeps every value held on the Rust side in a slot of
/// an auxiliary Lua stack, which has room for fewer than 8000; building the
/// results in Lua keeps that use constant however many there are.)
pub(crate) struct Results {
    t: mlua::Table,
    n: usize,
}

impl Results {
    pub fn new(lua: &Lua) -> LibResult<Self> {
        Ok(Results {
            t: lua.create_table()?,
            n: 0,
        })
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn push(&mut self, v: Value) -> LibResult<()> {
        self.n += 1;
        self.t.raw_set(self.n, v)?;
        Ok(())
    }

    /// Replaces result `i` (1-based, within `len`).
    pub fn set(&self, i: usize, v: Value) -> LibResult<()> {
        self.t.raw_set(i, v)?;
        Ok(())
    }

    /// Removes and returns the last result.
    pub fn pop(&mut self) -> LibResult<Value> {
        let v: Value = self.t.raw_get(self.n)?;
        self.t.raw_set(self.n, Value::Nil)?;
        self.n -= 1;
        Ok(v)
    }
}

/// Open containers of a nested structure being built or walked, kept in a
/// Lua table (two fields per level: the table and a key) rather than as
/// Rust-held references, for the same reason as [`Results`]: nesting may go
/// thousands of levels deep.
pub(crate) struct Spine {
    t: mlua::Table,
}

impl Spine {
    pub fn new(lua: &Lua) -> LibResult<Self> {
        Ok(Spine {
            t: lua.create_table()?,
        })
    }

    /// The table open at `level` (1-based).
    pub fn table(&self, level: usize) -> LibResult<mlua::Table> {
        Ok(self.t.raw_get(2 * level - 1)?)
    }

    pub fn set_table(&self, level: usize, t: mlua::Table) -> LibResult<()> {
        self.t.raw_set(2 * level - 1, t)?;
        self.t.raw_set(2 * level, Value::Nil)?;
        Ok(())
    }

    /// The key remembered for `level` (nil when none).
    pub fn key(&self, level: usize) -> LibResult<Value> {
        Ok(self.t.raw_get(2 * level)?)
    }

    pub fn set_key(&self, level: usize, k: Value) -> LibResult<()> {
        self.t.raw_set(2 * level, k)?;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    use mlua::Lua;

    /// A Lua state with the libraries registered.
    pub fn lua() -> Lua {
        let lua = Lua::new();
        super::register(&lua).expect("register");
        lua
    }

    /// Evaluates a chunk returning one string (or a value tostring()'d).
    pub fn eval(lua: &Lua, code: &str) -> String {
        let f = lua
            .load(code)
            .set_name("=user_script")
            .into_function()
            .expect("compile");
        let v: mlua::Value = f.call(()).unwrap_or_else(|e| panic!("{code}: {e}"));
        match v {
            mlua::Value::String(s) => String::from_utf8_lossy(&s.as_bytes()).into_owned(),
            other => lua
                .globals()
                .get::<mlua::Function>("tostring")
                .unwrap()
                .call::<String>(other)
                .unwrap(),
        }
    }

    /// Runs a chunk expected to fail and returns the error as Lua saw it
    /// (through pcall of a wrapper function defined at line 1).
    pub fn err(lua: &Lua, code: &str) -> String {
        let wrapped = format!(
            "local ok, e = pcall(function() {code} end) assert(not ok, 'no error') return tostring(e)"
        );
        eval(lua, &wrapped)
    }
}
