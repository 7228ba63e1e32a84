//! Loading the AOF at start-up: the base file (an RDB, possibly followed by commands, or
//! commands alone), then each incremental file, replayed through the ordinary command path
//! by a session without a client on thread 0. A single-file `appendonly.aof` from an older
//! Redis is moved into the directory and becomes the base.
//!
//! Bad files stop start-up with the file's name and the offset. A file cut short at its
//! end (a crash mid-write) loads what it holds, with a warning, when `aof-load-truncated`
//! allows it, and is cut back to its last whole command (or to before an unfinished
//! MULTI) so that new effects follow whole ones.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::manifest::{self, FileEntry, Manifest, Names};
use super::writer::ToWriter;
use crate::commands::table;
use crate::server::session::Session;
use crate::shard::{Shared, Worker};

/// Where the AOF lives, from the configuration.
pub fn names(shared: &Shared) -> (Names, PathBuf) {
    let c = shared.config.lock().expect("config lock");
    let dir = Path::new(c.get("dir"));
    let stem = c.get("appendfilename").to_string();
    (
        Names {
            dir: dir.join(c.get("appenddirname")),
            stem: stem.clone(),
        },
        dir.join(stem),
    )
}

pub fn load_at_startup(shared: Arc<Shared>) {
    crate::persist::load::spawn_loader(shared, "kite-aof-loader", |shared| {
        let started = std::time::Instant::now();
        let commands = load(shared)?;
        tracing::info!(
            "DB loaded from append only file: {:.3} seconds ({} commands replayed)",
            started.elapsed().as_secs_f64(),
            commands
        );
        Ok(())
    });
}

/// An RDB holding nothing: the base of a new AOF.
pub fn empty_rdb(shared: &Shared) -> Vec<u8> {
    let version = shared
        .config
        .lock()
        .expect("config lock")
        .get_i64("rdb-version") as u16;
    let opts = crate::persist::rdb::write::Options {
        version,
        compress: true,
    };
    let mut out = crate::persist::rdbfile::header(&opts);
    out.push(crate::persist::rdb::op::EOF);
    let crc = crate::persist::rdb::CRC64.checksum(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    std::io::Write::write_all(&mut f, bytes)?;
    f.sync_all()
}

/// Finds or makes the layout, loads it, and starts logging. Returns the commands replayed.
fn load(shared: &Arc<Shared>) -> Result<u64, String> {
    let (names, old_single) = names(shared);
    let manifest_path = names.manifest();
    let manifest = if manifest_path.exists() {
        let text = std::fs::read_to_string(&manifest_path).map_err(|e| {
            format!(
                "can't read the AOF manifest {}: {e}",
                manifest_path.display()
            )
        })?;
        Manifest::parse(&text)
            .map_err(|e| format!("bad AOF manifest {}: {e}", manifest_path.display()))?
    } else {
        std::fs::create_dir_all(&names.dir).map_err(|e| {
            format!(
                "can't create the AOF directory {}: {e}",
                names.dir.display()
            )
        })?;
        if old_single.exists() {
            // Redis 6's single file: it becomes the base, under its own name.
            let target = names.dir.join(&names.stem);
            std::fs::rename(&old_single, &target).map_err(|e| {
                format!(
                    "can't move {} into {}: {e}",
                    old_single.display(),
                    names.dir.display()
                )
            })?;
            let m = Manifest {
                base: Some(FileEntry {
                    name: names.stem.clone(),
                    seq: 1,
                }),
                ..Manifest::default()
            };
            manifest::persist(&names, &m)
                .map_err(|e| format!("can't write the AOF manifest: {e}"))?;
            tracing::info!(
                "Moved {} into {} and made it the AOF's base",
                old_single.display(),
                names.dir.display()
            );
            m
        } else {
            let preamble = shared
                .config
                .lock()
                .expect("config lock")
                .get_bool("aof-use-rdb-preamble");
            let name = names.base(1, preamble);
            let body = if preamble {
                empty_rdb(shared)
            } else {
                Vec::new()
            };
            write_synced(&names.dir.join(&name), &body)
                .map_err(|e| format!("can't create the AOF base file {name}: {e}"))?;
            tracing::info!("Creating AOF base file {name} on server start");
            Manifest {
                base: Some(FileEntry { name, seq: 1 }),
                ..Manifest::default()
            }
        }
    };
    let truncated_ok = shared
        .config
        .lock()
        .expect("config lock")
        .get_bool("aof-load-truncated");
    let replayer = Replayer::start(shared);
    let mut files: Vec<(PathBuf, bool)> = Vec::new();
    if let Some(b) = &manifest.base {
        files.push((names.dir.join(&b.name), true));
    }
    for i in &manifest.incrs {
        files.push((names.dir.join(&i.name), false));
    }
    let last = files.len().saturating_sub(1);
    for (n, (path, is_base)) in files.iter().enumerate() {
        let mut start = 0;
        if !path.exists() {
            return Err(format!(
                "The AOF file {} doesn't exist (listed in {})",
                path.display(),
                manifest_path.display()
            ));
        }
        if *is_base && starts_with_rdb(path)? {
            match crate::persist::load::load_file(shared, path)? {
                Some(l) => start = l.end,
                None => return Err(format!("The AOF file {} doesn't exist", path.display())),
            }
        }
        replay_commands(&replayer, path, start, n == last && truncated_ok)?;
        // Each file's commands run before the next file's are read.
        replayer.sync()?;
    }
    let commands = replayer.sync()?;
    let (done, wait) = oneshot::channel();
    shared.persist.aof.send(ToWriter::Open {
        names,
        manifest,
        persist: true,
        done,
    });
    wait.blocking_recv()
        .map_err(|_| "the AOF writer stopped".to_string())??;
    super::refresh_settings(shared);
    let st = &shared.persist.aof;
    st.rewrite_base_size
        .store(st.current_size.load(Ordering::Relaxed), Ordering::Relaxed);
    st.on.store(true, Ordering::Release);
    Ok(commands)
}

fn starts_with_rdb(path: &Path) -> Result<bool, String> {
    let mut f = File::open(path).map_err(|e| format!("can't open {}: {e}", path.display()))?;
    let mut magic = [0u8; 5];
    let n = f
        .read(&mut magic)
        .map_err(|e| format!("can't read {}: {e}", path.display()))?;
    Ok(n == 5 && &magic == b"REDIS")
}

pub enum ParseError {
    /// The file ends inside a command.
    Truncated,
    Bad(String),
}

/// Reads one command (a RESP array of bulk strings); None at a clean end of file.
pub fn next_command<R: BufRead>(
    r: &mut R,
    offset: &mut u64,
) -> Result<Option<Vec<Bytes>>, ParseError> {
    let mut line = Vec::new();
    let n = r
        .read_until(b'\n', &mut line)
        .map_err(|e| ParseError::Bad(e.to_string()))?;
    if n == 0 {
        return Ok(None);
    }
    let header_at = *offset;
    *offset += n as u64;
    if !line.ends_with(b"\r\n") {
        return Err(ParseError::Truncated);
    }
    if line[0] != b'*' {
        return Err(ParseError::Bad(format!(
            "expected '*' at offset {header_at}"
        )));
    }
    let count = parse_len(&line[1..line.len() - 2])
        .filter(|&c| c >= 1)
        .ok_or_else(|| ParseError::Bad(format!("bad array length at offset {header_at}")))?;
    let mut args = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        line.clear();
        let at = *offset;
        let n = r
            .read_until(b'\n', &mut line)
            .map_err(|e| ParseError::Bad(e.to_string()))?;
        *offset += n as u64;
        if n == 0 || !line.ends_with(b"\r\n") {
            return Err(ParseError::Truncated);
        }
        if line[0] != b'$' {
            return Err(ParseError::Bad(format!("expected '$' at offset {at}")));
        }
        let len = parse_len(&line[1..line.len() - 2])
            .ok_or_else(|| ParseError::Bad(format!("bad bulk length at offset {at}")))?;
        let mut body = vec![0u8; len + 2];
        let mut got = 0;
        while got < body.len() {
            let k = r
                .read(&mut body[got..])
                .map_err(|e| ParseError::Bad(e.to_string()))?;
            if k == 0 {
                return Err(ParseError::Truncated);
            }
            got += k;
        }
        *offset += body.len() as u64;
        if &body[len..] != b"\r\n" {
            return Err(ParseError::Bad(format!(
                "bulk string not ended by CRLF at offset {at}"
            )));
        }
        body.truncate(len);
        args.push(Bytes::from(body));
    }
    Ok(Some(args))
}

fn parse_len(b: &[u8]) -> Option<usize> {
    if b.is_empty() || b.len() > 12 {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// Replays the commands of `path` from byte `start`.
fn replay_commands(
    replayer: &Replayer,
    path: &Path,
    start: u64,
    may_truncate: bool,
) -> Result<(), String> {
    let name = path.display().to_string();
    let mut file =
        File::open(path).map_err(|e| format!("can't open the append only file {name}: {e}"))?;
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(start))
        .map_err(|e| format!("can't read the append only file {name}: {e}"))?;
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut offset = start;
    // Where the last whole command ended, and where an unfinished MULTI began.
    let mut valid_up_to = start;
    let mut multi_at: Option<u64> = None;
    loop {
        let at = offset;
        match next_command(&mut r, &mut offset) {
            Ok(None) => break,
            Ok(Some(args)) => {
                if args[0].eq_ignore_ascii_case(b"multi") {
                    multi_at = Some(at);
                } else if args[0].eq_ignore_ascii_case(b"exec") {
                    multi_at = None;
                }
                replayer.send(args, &name, at)?;
                valid_up_to = offset;
            }
            Err(ParseError::Bad(e)) => {
                return Err(format!(
                    "Bad file format reading the append only file {name}: {e}. Kite will not start on part of it: fix the file with redis-check-aof --fix"
                ))
            }
            Err(ParseError::Truncated) => {
                if !may_truncate {
                    return Err(format!(
                        "Unexpected end of file reading the append only file {name} at offset {valid_up_to}. Start with aof-load-truncated yes, or fix it with redis-check-aof --fix"
                    ));
                }
                break;
            }
        }
    }
    let end = multi_at.unwrap_or(valid_up_to);
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(end);
    if end < len {
        if !may_truncate {
            return Err(format!(
                "Unexpected end of file reading the append only file {name}: a MULTI at offset {end} has no EXEC"
            ));
        }
        tracing::warn!(
            "!!! Warning: short read while loading the AOF file {name}!!! Truncating it at offset {end} (of {len} bytes): the last command{} was incomplete",
            if multi_at.is_some() { "s (an unfinished MULTI)" } else { "" }
        );
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| format!("can't truncate {name}: {e}"))?;
        f.set_len(end)
            .map_err(|e| format!("can't truncate {name}: {e}"))?;
        f.sync_all()
            .map_err(|e| format!("can't truncate {name}: {e}"))?;
    }
    Ok(())
}

enum Item {
    Cmd(Vec<Bytes>, Arc<str>, u64),
    Sync(oneshot::Sender<Result<u64, String>>),
}

/// The channel to the replay session on thread 0.
struct Replayer {
    tx: mpsc::Sender<Item>,
    file: std::cell::RefCell<(String, Arc<str>)>,
}

impl Replayer {
    fn start(shared: &Arc<Shared>) -> Replayer {
        let (tx, rx) = mpsc::channel::<Item>(1024);
        shared.send(
            0,
            Box::new(move |w| {
                crate::net::event_loop::spawn_local(replay_task(w.clone(), rx));
            }),
        );
        Replayer {
            tx,
            file: std::cell::RefCell::new((String::new(), Arc::from(""))),
        }
    }

    fn send(&self, args: Vec<Bytes>, name: &str, offset: u64) -> Result<(), String> {
        let mut f = self.file.borrow_mut();
        if f.0 != name {
            *f = (name.to_string(), Arc::from(name));
        }
        self.tx
            .blocking_send(Item::Cmd(args, f.1.clone(), offset))
            .map_err(|_| "the AOF replay stopped".to_string())
    }

    /// Waits until everything sent has run; the first error, if any.
    fn sync(&self) -> Result<u64, String> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .blocking_send(Item::Sync(tx))
            .map_err(|_| "the AOF replay stopped".to_string())?;
        rx.blocking_recv()
            .map_err(|_| "the AOF replay stopped".to_string())?
    }
}

async fn replay_task(worker: Rc<Worker>, mut rx: mpsc::Receiver<Item>) {
    let id = worker.shared.next_client_id.fetch_add(1, Ordering::Relaxed);
    let mut sess = Session::detached(&worker, id);
    sess.replaying = true;
    let mut error: Option<String> = None;
    let mut count = 0u64;
    while let Some(item) = rx.recv().await {
        crate::net::event_loop::cooperate().await;
        match item {
            Item::Cmd(args, file, offset) => {
                if error.is_some() {
                    continue;
                }
                let Some(cmd) = table().lookup(&args[0]) else {
                    error = Some(format!(
                        "Unknown command '{}' reading the append only file {file} at offset {offset}",
                        String::from_utf8_lossy(&args[0])
                    ));
                    continue;
                };
                crate::commands::execute(&mut sess, Some(cmd), args).await;
                // Replies go nowhere; errors inside the file are Redis's to ignore too.
                sess.out.buf.clear();
                count += 1;
            }
            Item::Sync(done) => {
                let _ = done.send(match &error {
                    Some(e) => Err(e.clone()),
                    None => Ok(count),
                });
            }
        }
    }
}
