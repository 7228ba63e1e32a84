//! Lua scripting: EVAL, EVALSHA, FUNCTION and FCALL (see docs/scripting.md).
//!
//! The script cache is shared by every thread (a script loaded through one connection
//! runs through any other); each thread compiles a script the first time it runs it.

pub mod busy;
pub mod convert;
pub mod functions;
pub mod libs;
pub mod run;
pub mod vm;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hashbrown::HashMap;

/// The flags a script declares on its `#!lua flags=...` first line.
#[derive(Clone, Copy, Default, Debug)]
pub struct ScriptFlags {
    /// The script has a shebang line: Redis 7's stricter rules apply.
    pub shebang: bool,
    pub no_writes: bool,
    pub allow_oom: bool,
    pub allow_stale: bool,
    pub no_cluster: bool,
    pub allow_cross_slot: bool,
}

impl ScriptFlags {
    /// Parses the `flags=` list of a shebang or of `redis.register_function`.
    pub fn parse_list<'a>(names: impl Iterator<Item = &'a str>) -> Result<ScriptFlags, String> {
        let mut f = ScriptFlags {
            shebang: true,
            ..Default::default()
        };
        for name in names {
            match name {
                "no-writes" => f.no_writes = true,
                "allow-oom" => f.allow_oom = true,
                "allow-stale" => f.allow_stale = true,
                "no-cluster" => f.no_cluster = true,
                "allow-cross-slot-keys" => f.allow_cross_slot = true,
                "" => {}
                other => return Err(other.to_string()),
            }
        }
        Ok(f)
    }
}

/// Reads a script's shebang. Returns its flags and the body Lua compiles: the shebang
/// line is blanked so that line numbers stay right.
pub fn parse_shebang(body: &[u8]) -> Result<(ScriptFlags, Bytes), String> {
    if !body.starts_with(b"#!") {
        return Ok((ScriptFlags::default(), Bytes::copy_from_slice(body)));
    }
    let Some(end) = body.iter().position(|&b| b == b'\n') else {
        return Err("ERR Invalid script shebang".into());
    };
    let line = String::from_utf8_lossy(&body[..end]).into_owned();
    let mut words = line.split(' ').filter(|w| !w.is_empty());
    let engine = words.next().unwrap_or("");
    if engine != "#!lua" {
        return Err(format!("ERR Unexpected engine in script shebang: {engine}"));
    }
    let mut flags = ScriptFlags {
        shebang: true,
        ..Default::default()
    };
    for w in words {
        match w.strip_prefix("flags=") {
            Some(list) => {
                flags = ScriptFlags::parse_list(list.split(','))
                    .map_err(|f| format!("ERR Unexpected flag in script shebang: {f}"))?
            }
            None => return Err(format!("ERR Unknown lua shebang option: {w}")),
        }
    }
    let mut code = body[end..].to_vec();
    code.insert(0, b' ');
    Ok((flags, Bytes::from(code)))
}

pub struct Script {
    pub sha: String,
    /// The body as Lua compiles it (shebang blanked).
    pub code: Bytes,
    pub flags: ScriptFlags,
    /// This script once reached keys outside its shard: it runs on the global path.
    pub wide: AtomicBool,
}

impl Script {
    pub fn is_wide(&self) -> bool {
        self.wide.load(Ordering::Relaxed)
    }
}

/// Every script loaded by EVAL or SCRIPT LOAD, by SHA. The mutex is taken once per
/// EVAL/EVALSHA; it is never held while a script runs.
#[derive(Default)]
pub struct ScriptCache {
    scripts: Mutex<HashMap<String, Arc<Script>>>,
    generation: std::sync::atomic::AtomicU64,
}

/// Scripts a thread has found, by the name its clients used (raw bytes, any case).
type SeenScripts = HashMap<Vec<u8>, Arc<Script>>;

thread_local! {
    /// What this thread already found in the shared cache, so EVALSHA takes no lock:
    /// valid while the cache's generation (bumped by SCRIPT FLUSH) is unchanged.
    static SEEN: std::cell::RefCell<(u64, SeenScripts)> =
        std::cell::RefCell::new((0, HashMap::new()));
}

impl ScriptCache {
    /// The script named by an EVALSHA argument (any case), as its raw bytes: the
    /// thread's own map is asked first, without decoding or copying the name.
    pub fn get(&self, sha: &[u8]) -> Option<Arc<Script>> {
        let generation = self.generation.load(Ordering::Acquire);
        let seen = SEEN.with(|s| {
            let mut s = s.borrow_mut();
            if s.0 != generation {
                *s = (generation, HashMap::new());
            }
            s.1.get(sha).cloned()
        });
        if seen.is_some() {
            return seen;
        }
        let lower = String::from_utf8_lossy(sha).to_ascii_lowercase();
        let found = self
            .scripts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&lower)
            .cloned()?;
        SEEN.with(|s| s.borrow_mut().1.insert(sha.to_vec(), found.clone()));
        Some(found)
    }

    /// Adds a script (or finds it) and returns it; a bad shebang is refused.
    pub fn add(&self, body: &[u8]) -> Result<Arc<Script>, String> {
        let sha = sha1_hex(body);
        if let Some(s) = self.get(sha.as_bytes()) {
            return Ok(s);
        }
        let (flags, code) = parse_shebang(body)?;
        let script = Arc::new(Script {
            sha: sha.clone(),
            code,
            flags,
            wide: AtomicBool::new(false),
        });
        self.scripts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(sha)
            .or_insert(script.clone());
        Ok(script)
    }

    pub fn flush(&self) {
        self.scripts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub fn len(&self) -> usize {
        self.scripts.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn body_bytes(&self) -> usize {
        self.scripts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|s| s.code.len())
            .sum()
    }
}

impl ScriptCache {
    pub fn remove(&self, sha: &str) {
        self.scripts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(sha);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

static CACHE: std::sync::OnceLock<ScriptCache> = std::sync::OnceLock::new();
static REGISTRY: std::sync::OnceLock<functions::Registry> = std::sync::OnceLock::new();
/// FCALL functions that once reached beyond their shard, as scripts' `wide` flag.
static WIDE_FUNCTIONS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The server's script cache.
pub fn cache() -> &'static ScriptCache {
    CACHE.get_or_init(ScriptCache::default)
}

/// The server's FUNCTION libraries.
pub fn registry() -> &'static functions::Registry {
    REGISTRY.get_or_init(functions::Registry::default)
}

pub fn function_is_wide(name: &str) -> bool {
    WIDE_FUNCTIONS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|n| n == name)
}

pub fn mark_function_wide(name: &str) {
    let mut w = WIDE_FUNCTIONS.lock().unwrap_or_else(|p| p.into_inner());
    if !w.iter().any(|n| n == name) {
        w.push(name.to_string());
    }
}

pub fn sha1_hex(data: &[u8]) -> String {
    sha1_smol::Sha1::from(data).digest().to_string()
}
