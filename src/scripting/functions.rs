//! FUNCTION libraries: loaded once into a registry every thread shares, then into each
//! thread's interpreter the first time that thread calls FCALL after a change.

use crate::persist::rdb::{self, op};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use mlua::{Function, Lua, MultiValue, Value};

use super::vm::Vm;
use super::ScriptFlags;

#[derive(Clone)]
pub struct FunctionInfo {
    pub name: String,
    pub description: Option<String>,
    pub flags: ScriptFlags,
    pub flag_names: Vec<String>,
}

#[derive(Clone)]
pub struct Library {
    pub name: String,
    pub code: Vec<u8>,
    pub functions: Vec<FunctionInfo>,
}

/// The libraries of the server. Changed by FUNCTION LOAD/DELETE/FLUSH/RESTORE; each
/// change bumps `generation`, which tells threads to reload.
#[derive(Default)]
pub struct Registry {
    pub libraries: Mutex<BTreeMap<String, Library>>,
    pub generation: AtomicU64,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Library>> {
        self.libraries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The flags of a function, or None when no library has it.
    pub fn function_flags(&self, name: &str) -> Option<ScriptFlags> {
        self.lock()
            .values()
            .flat_map(|l| l.functions.iter())
            .find(|f| f.name == name)
            .map(|f| f.flags)
    }

    pub fn snapshot(&self) -> Vec<Library> {
        self.lock().values().cloned().collect()
    }

    /// Adds libraries, checked together: all go in or none.
    pub fn install(&self, libs: Vec<Library>, replace: bool, quoted: bool) -> Result<(), String> {
        let mut map = self.lock();
        for lib in &libs {
            if map.contains_key(&lib.name) && !replace {
                // FUNCTION LOAD quotes the name, FUNCTION RESTORE does not.
                return Err(if quoted {
                    format!("ERR Library '{}' already exists", lib.name)
                } else {
                    format!("ERR Library {} already exists", lib.name)
                });
            }
            for f in &lib.functions {
                let clash = map
                    .values()
                    .filter(|l| l.name != lib.name)
                    .any(|l| l.functions.iter().any(|g| g.name == f.name));
                if clash {
                    return Err(format!("ERR Function {} already exists", f.name));
                }
            }
        }
        for lib in libs {
            map.insert(lib.name.clone(), lib);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    pub fn delete(&self, name: &str) -> bool {
        let removed = self.lock().remove(name).is_some();
        if removed {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        removed
    }

    pub fn flush(&self) {
        self.lock().clear();
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub fn replace_all(&self, libs: Vec<Library>) {
        let mut map = self.lock();
        map.clear();
        for lib in libs {
            map.insert(lib.name.clone(), lib);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

/// Functions registered by the library being loaded on this thread.
struct Loading {
    functions: Vec<(FunctionInfo, Function)>,
    /// A library's code gets this long to run, as in Redis.
    deadline: std::time::Instant,
}

/// How long a library's top-level code may run (Redis's FUNCTION LOAD timeout).
const LOAD_TIME_LIMIT: std::time::Duration = std::time::Duration::from_millis(500);

/// A library's top-level code is running on this thread (FUNCTION LOAD, or a reload
/// before FCALL): `redis.call` is not available to it.
pub fn loading() -> bool {
    LOADING.with(|l| l.try_borrow().map_or(true, |l| l.is_some()))
}

/// The library being loaded has run past its time limit.
pub fn load_timed_out() -> bool {
    LOADING.with(|l| {
        l.try_borrow().is_ok_and(|l| {
            l.as_ref()
                .is_some_and(|l| std::time::Instant::now() >= l.deadline)
        })
    })
}

thread_local! {
    static LOADING: RefCell<Option<Loading>> = const { RefCell::new(None) };
}

/// `redis.register_function(name, callback)` or `redis.register_function{...}`.
pub fn register_function(_lua: &Lua, args: MultiValue) -> mlua::Result<()> {
    let fail = |m: &str| Err(mlua::Error::RuntimeError(m.to_string()));
    let loading = LOADING.with(|l| l.borrow().is_some());
    if !loading {
        return fail("redis.register_function can only be called on FUNCTION LOAD command");
    }
    let args: Vec<Value> = args.into_iter().collect();
    let (name, callback, flags, description) = match args.as_slice() {
        [Value::String(name), Value::Function(cb)] => {
            (name.to_str()?.to_string(), cb.clone(), Vec::new(), None)
        }
        [Value::Table(t)] => {
            let name: Option<String> = t.get("function_name")?;
            let cb: Option<Function> = t.get("callback")?;
            for pair in t.clone().pairs::<String, Value>() {
                let (k, _) = pair?;
                if !["function_name", "callback", "flags", "description"].contains(&k.as_str()) {
                    return fail("unknown argument given to redis.register_function");
                }
            }
            let Some(name) = name else {
                return fail("redis.register_function must get a function name argument");
            };
            let Some(cb) = cb else {
                return fail("redis.register_function must get a callback argument");
            };
            let flags: Vec<String> = match t.get::<Value>("flags")? {
                Value::Nil => Vec::new(),
                Value::Table(f) => f
                    .sequence_values::<String>()
                    .collect::<mlua::Result<Vec<_>>>()?,
                _ => return fail("flags argument to redis.register_function must be a table representing function flags"),
            };
            let description: Option<String> = t.get("description")?;
            (name, cb, flags, description)
        }
        [_] => return fail("calling redis.register_function with a single argument is only applicable to Lua table (representing named arguments)."),
        _ => return fail("wrong number of arguments to redis.register_function"),
    };
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return fail("Function names can only contain letters, numbers, or underscores(_) and must be at least one character long");
    }
    let parsed = ScriptFlags::parse_list(flags.iter().map(|s| s.as_str()))
        .map_err(|_| mlua::Error::RuntimeError("unknown flag given".into()))?;
    LOADING.with(|l| {
        let mut l = l.borrow_mut();
        let loading = l.as_mut().expect("checked above");
        if loading.functions.iter().any(|(f, _)| f.name == name) {
            return fail("Function already exists in the library");
        }
        loading.functions.push((
            FunctionInfo {
                name,
                description,
                flags: parsed,
                flag_names: flags,
            },
            callback,
        ));
        Ok(())
    })
}

/// Reads a library's `#!lua name=...` first line.
pub fn library_name(code: &[u8]) -> Result<String, String> {
    if !code.starts_with(b"#!") {
        return Err("ERR Missing library metadata".into());
    }
    let end = code.iter().position(|&b| b == b'\n').unwrap_or(code.len());
    let line = String::from_utf8_lossy(&code[2..end]).into_owned();
    let mut words = line.split(' ').filter(|w| !w.is_empty());
    let engine = words.next().unwrap_or("");
    if !engine.eq_ignore_ascii_case("lua") {
        return Err(format!("ERR Engine '{engine}' not found"));
    }
    let mut name = None;
    for w in words {
        match w.split_once('=') {
            Some(("name", v)) => name = Some(v.to_string()),
            _ => return Err(format!("ERR Invalid metadata value given: {w}")),
        }
    }
    let name = name.ok_or_else(|| "ERR Library name was not given".to_string())?;
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err("ERR Library names can only contain letters, numbers, or underscores(_) and must be at least one character long".into());
    }
    Ok(name)
}

/// Runs a library's code on this thread and returns what it registered.
fn evaluate(vm: &Vm, code: &[u8]) -> Result<Vec<(FunctionInfo, Function)>, String> {
    let end = code.iter().position(|&b| b == b'\n').unwrap_or(code.len());
    let mut body = b" ".to_vec();
    body.extend_from_slice(&code[end..]);
    let chunk = vm
        .load_chunk(&body, "@user_function", true)
        .map_err(|e| format!("ERR Error compiling function: {e}"))?;
    LOADING.with(|l| {
        *l.borrow_mut() = Some(Loading {
            functions: Vec::new(),
            deadline: std::time::Instant::now() + LOAD_TIME_LIMIT,
        })
    });
    let result = vm.run_script(&chunk);
    let loading = LOADING.with(|l| l.borrow_mut().take()).expect("set above");
    match result {
        Err(e) => Err(format!("ERR Error registering functions: {e}")),
        Ok(Err(Value::Table(t))) => {
            let msg: String = t
                .raw_get("err")
                .unwrap_or_else(|_| "ERR unknown error".into());
            Err(format!("ERR Error registering functions: {msg}"))
        }
        Ok(Err(_)) => Err("ERR Error registering functions: ERR unknown error".into()),
        Ok(Ok(_)) => Ok(loading.functions),
    }
}

/// Checks and evaluates FUNCTION LOAD's code on this thread: the library to install.
pub fn compile_library(vm: &Vm, code: &[u8]) -> Result<Library, String> {
    let name = library_name(code)?;
    let functions = evaluate(vm, code)?;
    if functions.is_empty() {
        return Err("ERR No functions registered".into());
    }
    Ok(Library {
        name,
        code: code.to_vec(),
        functions: functions.into_iter().map(|(f, _)| f).collect(),
    })
}

/// The function `name` in this thread's interpreter, reloading libraries if they changed.
pub fn load_into(vm: &mut Vm, name: &str) -> Result<Function, String> {
    let registry = super::registry();
    let generation = registry.generation.load(Ordering::Acquire);
    if vm.functions_generation != generation || vm.functions.is_empty() {
        vm.functions.clear();
        for lib in registry.snapshot() {
            for (info, f) in evaluate(vm, &lib.code)? {
                vm.functions.insert(info.name, f);
            }
        }
        vm.functions_generation = generation;
    }
    vm.functions
        .get(name)
        .cloned()
        .ok_or_else(|| "ERR Function not found".to_string())
}

// FUNCTION DUMP's payload: Redis's framing (one RDB function record per library, the
// RDB version, a CRC64), written and read with the RDB codec (`persist::rdb`).

pub fn dump(libs: &[Library]) -> Vec<u8> {
    let mut out = Vec::new();
    for lib in libs {
        out.push(op::FUNCTION2);
        rdb::write::put_raw_string(&mut out, &lib.code);
    }
    // Version 10, as DUMP writes by default: Redis 7.0 refuses anything newer.
    out.extend_from_slice(&rdb::VERSION_DEFAULT.to_le_bytes());
    let crc = rdb::crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The library codes in a DUMP payload, or None when it is not one.
pub fn undump(payload: &[u8]) -> Option<Vec<Vec<u8>>> {
    if payload.len() < 10 {
        return None;
    }
    let (body, crc) = payload.split_at(payload.len() - 8);
    if rdb::crc64(body).to_le_bytes() != crc {
        return None;
    }
    let (records, version) = body.split_at(body.len() - 2);
    if u16::from_le_bytes([version[0], version[1]]) > rdb::VERSION_MAX {
        return None;
    }
    let mut r = rdb::read::Reader::new(records);
    let mut codes = Vec::new();
    while (r.offset() as usize) < records.len() {
        if r.u8().ok()? != op::FUNCTION2 {
            return None;
        }
        codes.push(r.string().ok()?);
    }
    Some(codes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dump_round_trips() {
        let lib = Library {
            name: "l".into(),
            code: vec![b'x'; 300],
            functions: Vec::new(),
        };
        let payload = dump(&[lib.clone(), lib]);
        assert_eq!(undump(&payload).unwrap().len(), 2);
        let mut bad = payload.clone();
        bad[3] ^= 1;
        assert!(undump(&bad).is_none());
    }
}
