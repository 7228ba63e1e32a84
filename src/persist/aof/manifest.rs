//! The manifest of Redis 7's multi-part AOF: which base and incremental files make up the
//! log, in order. One line per file: `file <name> seq <n> type <b|h|i>`.

use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileEntry {
    pub name: String,
    pub seq: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    pub base: Option<FileEntry>,
    pub incrs: Vec<FileEntry>,
    /// Files a finished rewrite made obsolete, deleted once the new manifest is on disk.
    pub history: Vec<FileEntry>,
}

/// Splits a line into words the way Redis's sdssplitargs does for what the manifest
/// holds: plain words and double-quoted ones with backslash escapes.
fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= b.len() {
            break;
        }
        let mut w = Vec::new();
        if b[i] == b'"' {
            i += 1;
            loop {
                match b.get(i) {
                    None => return Err("unbalanced quotes".into()),
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') if i + 3 < b.len() && b[i + 1] == b'x' => {
                        let hex =
                            std::str::from_utf8(&b[i + 2..i + 4]).map_err(|e| e.to_string())?;
                        w.push(u8::from_str_radix(hex, 16).map_err(|e| e.to_string())?);
                        i += 4;
                    }
                    Some(b'\\') if i + 1 < b.len() => {
                        w.push(match b[i + 1] {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            c => c,
                        });
                        i += 2;
                    }
                    Some(&c) => {
                        w.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < b.len() && !b[i].is_ascii_whitespace() {
                w.push(b[i]);
                i += 1;
            }
        }
        words.push(String::from_utf8_lossy(&w).into_owned());
    }
    Ok(words)
}

fn quote_if_needed(name: &str) -> String {
    if !name.is_empty()
        && name
            .bytes()
            .all(|c| c.is_ascii_graphic() && c != b'"' && c != b'\\' && c != b'\'')
    {
        return name.to_string();
    }
    let mut s = String::from("\"");
    for c in name.bytes() {
        match c {
            b'"' | b'\\' => {
                s.push('\\');
                s.push(c as char);
            }
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            b'\t' => s.push_str("\\t"),
            c if c.is_ascii_graphic() || c == b' ' => s.push(c as char),
            c => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    s.push('"');
    s
}

impl Manifest {
    pub fn parse(text: &str) -> Result<Manifest, String> {
        let mut m = Manifest::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words = split_words(line).map_err(|e| format!("line {}: {e}", n + 1))?;
            if words.len() % 2 != 0 {
                return Err(format!("line {}: expected key/value pairs", n + 1));
            }
            let (mut name, mut seq, mut kind) = (None, None, None);
            for kv in words.chunks(2) {
                match kv[0].as_str() {
                    "file" => name = Some(kv[1].clone()),
                    "seq" => seq = kv[1].parse::<u64>().ok(),
                    "type" => kind = Some(kv[1].clone()),
                    _ => {} // Later versions may add keys: ignored, as Redis does.
                }
            }
            let (Some(name), Some(seq), Some(kind)) = (name, seq, kind) else {
                return Err(format!("line {}: missing file, seq or type", n + 1));
            };
            let e = FileEntry { name, seq };
            match kind.as_str() {
                "b" => {
                    if m.base.is_some() {
                        return Err(format!("line {}: a second base file", n + 1));
                    }
                    m.base = Some(e);
                }
                "i" => m.incrs.push(e),
                "h" => m.history.push(e),
                other => return Err(format!("line {}: unknown file type '{other}'", n + 1)),
            }
        }
        Ok(m)
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        let mut line = |e: &FileEntry, t: &str| {
            s.push_str(&format!(
                "file {} seq {} type {t}\n",
                quote_if_needed(&e.name),
                e.seq
            ));
        };
        if let Some(b) = &self.base {
            line(b, "b");
        }
        for h in &self.history {
            line(h, "h");
        }
        for i in &self.incrs {
            line(i, "i");
        }
        s
    }

    /// The highest incremental sequence number in use, history included, so a new file
    /// never reuses an old name.
    pub fn last_incr_seq(&self) -> u64 {
        let hist = self
            .history
            .iter()
            .filter(|e| e.name.ends_with(".incr.aof"));
        self.incrs
            .iter()
            .chain(hist)
            .map(|e| e.seq)
            .max()
            .unwrap_or(0)
    }

    pub fn base_seq(&self) -> u64 {
        let hist = self.history.iter().filter(|e| e.name.contains(".base."));
        self.base
            .iter()
            .chain(hist)
            .map(|e| e.seq)
            .max()
            .unwrap_or(0)
    }
}

/// File names under `appenddirname`, from `appendfilename`.
pub struct Names {
    pub dir: PathBuf,
    pub stem: String,
}

impl Names {
    pub fn manifest(&self) -> PathBuf {
        self.dir.join(format!("{}.manifest", self.stem))
    }

    pub fn temp_manifest(&self) -> PathBuf {
        self.dir.join(format!("temp-{}.manifest", self.stem))
    }

    pub fn base(&self, seq: u64, rdb: bool) -> String {
        let ext = if rdb { "rdb" } else { "aof" };
        format!("{}.{seq}.base.{ext}", self.stem)
    }

    pub fn incr(&self, seq: u64) -> String {
        format!("{}.{seq}.incr.aof", self.stem)
    }

    pub fn temp_rewrite(&self) -> PathBuf {
        self.dir
            .join(format!("temp-rewriteaof-bg-{}.aof", std::process::id()))
    }
}

/// Writes the manifest atomically: a temporary file, fsynced, renamed, then the directory
/// fsynced.
pub fn persist(names: &Names, m: &Manifest) -> std::io::Result<()> {
    let tmp = names.temp_manifest();
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(m.render().as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, names.manifest())?;
    sync_dir(&names.dir)
}

pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_redis_writes_and_writes_it_back() {
        let text = "file appendonly.aof.1.base.rdb seq 1 type b\n\
                    file appendonly.aof.1.incr.aof seq 1 type i\n\
                    file appendonly.aof.2.incr.aof seq 2 type i\n";
        let m = Manifest::parse(text).unwrap();
        assert_eq!(m.base.as_ref().unwrap().name, "appendonly.aof.1.base.rdb");
        assert_eq!(m.incrs.len(), 2);
        assert_eq!(m.last_incr_seq(), 2);
        assert_eq!(m.render(), text);
        let quoted = Manifest::parse("file \"my file.aof\" seq 3 type b newkey x\n").unwrap();
        assert_eq!(quoted.base.unwrap().name, "my file.aof");
        assert!(Manifest::parse("file a seq 1 type z\n").is_err());
        assert!(Manifest::parse("file a seq\n").is_err());
    }
}
