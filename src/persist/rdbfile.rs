//! The snapshot writer thread: owns the RDB file while a snapshot is written.
//!
//! It writes the header (magic, version, AUX fields, FUNCTION libraries), then the
//! shards' records as they arrive, each message behind a SELECTDB. Large lists arrive in
//! parts over many messages; each goes to a temporary part file and is copied in after
//! the records, so parts of one record never interleave with others. Then EOF and the
//! CRC64, fsync, rename over the old file, fsync of the directory: a crash leaves the old
//! file or the new one. Blobs are LZF-compressed here, off the shards' threads.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;

use super::rdb::write::{put_len, put_maybe_compressed, put_raw_string, put_string, Options};
use super::rdb::{op, CRC64};
use super::serialize::{Msg, Piece};
use crate::shard::unix_ms;

/// Buffer of each file the writer writes or copies: big enough for few system calls,
/// small beside the memory the snapshot is meant to hold.
const IO_BUFFER: usize = 128 * 1024;

/// The file's opening: magic, version, AUX fields and the FUNCTION libraries.
pub fn header(opts: &Options) -> Vec<u8> {
    header_with(opts, &[])
}

/// The opening with extra AUX fields (a replication sync adds `repl-stream-db`,
/// `repl-id` and `repl-offset`, as Redis does).
pub fn header_with(opts: &Options, extra: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(format!("REDIS{:04}", opts.version).as_bytes());
    let mut aux = |k: &str, v: &[u8]| {
        out.push(op::AUX);
        put_raw_string(&mut out, k.as_bytes());
        put_string(&mut out, v, opts);
    };
    aux(
        "redis-ver",
        crate::commands::connection::SERVER_VERSION.as_bytes(),
    );
    aux("redis-bits", b"64");
    aux("ctime", (unix_ms() / 1000).to_string().as_bytes());
    aux("used-mem", b"0");
    aux("aof-base", b"0");
    for (k, v) in extra {
        aux(k, v);
    }
    for lib in crate::scripting::registry().snapshot() {
        out.push(op::FUNCTION2);
        put_string(&mut out, &lib.code, opts);
    }
    out
}

/// The main file (or a replica's socket), with the running checksum of what went into it.
struct Output<W: Write> {
    file: W,
    crc: crc::Digest<'static, u64, crc::Table<16>>,
    written: u64,
}

impl<W: Write> Output<W> {
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.crc.update(b);
        self.written += b.len() as u64;
        self.file.write_all(b)
    }

    fn select(&mut self, db: usize) -> std::io::Result<()> {
        let mut b = vec![op::SELECTDB];
        put_len(&mut b, db as u64);
        self.put(&b)
    }
}

fn write_pieces(
    pieces: &[Piece],
    opts: &Options,
    packed: &mut Vec<u8>,
    mut put: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    for piece in pieces {
        match piece {
            Piece::Raw(b) => put(b)?,
            Piece::Blob(b) => {
                packed.clear();
                put_maybe_compressed(packed, b, opts);
                put(packed)?;
            }
        }
    }
    Ok(())
}

struct PartFile {
    db: usize,
    path: PathBuf,
    file: BufWriter<File>,
}

/// Writes what the shards send to a temporary file, then moves it to `path` once it is
/// complete and on disk. Returns the file's size.
pub fn write_file(
    path: &Path,
    head: Vec<u8>,
    messages: Receiver<Msg>,
    checksum: bool,
    opts: Options,
) -> std::io::Result<u64> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let stamp = format!("{}-{}", std::process::id(), unix_ms());
    let tmp = dir.join(format!("temp-{stamp}.rdb"));
    let result = File::create(&tmp).and_then(|f| {
        let out = BufWriter::with_capacity(IO_BUFFER, f);
        let (out, n) = write_to(out, dir, &stamp, head, messages, checksum, opts)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(n)
    });
    match result {
        Ok(n) => {
            std::fs::rename(&tmp, path)?;
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(n)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Writes the whole RDB to `out` (a file, or a replica's socket for a diskless sync);
/// large records' parts wait in temporary files in `dir`. Returns `out` and the bytes
/// written.
pub fn write_to<W: Write>(
    out: W,
    dir: &Path,
    stamp: &str,
    head: Vec<u8>,
    messages: Receiver<Msg>,
    checksum: bool,
    opts: Options,
) -> std::io::Result<(W, u64)> {
    let mut parts: BTreeMap<u64, PartFile> = BTreeMap::new();
    let result = (|| {
        let mut out = Output {
            file: out,
            crc: CRC64.digest(),
            written: 0,
        };
        out.put(&head)?;
        let mut packed = Vec::new();
        // Every message is drained even after a failure, so no shard waits on us.
        let mut failure = None;
        for msg in messages {
            if failure.is_some() {
                continue;
            }
            let step = match msg {
                Msg::Records { db, pieces } => out
                    .select(db)
                    .and_then(|_| write_pieces(&pieces, &opts, &mut packed, |b| out.put(b))),
                Msg::Part { id, db, pieces } => {
                    let part = match parts.entry(id) {
                        std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                        std::collections::btree_map::Entry::Vacant(e) => {
                            let p = dir.join(format!("temp-{stamp}-part-{id}.rdb"));
                            let file = match File::create(&p) {
                                Ok(f) => BufWriter::with_capacity(IO_BUFFER, f),
                                Err(err) => {
                                    failure = Some(err);
                                    continue;
                                }
                            };
                            e.insert(PartFile { db, path: p, file })
                        }
                    };
                    write_pieces(&pieces, &opts, &mut packed, |b| part.file.write_all(b))
                }
            };
            if let Err(e) = step {
                failure = Some(e);
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        let mut buf = vec![0u8; IO_BUFFER];
        for part in parts.values_mut() {
            part.file.flush()?;
            out.select(part.db)?;
            let mut f = File::open(&part.path)?;
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                out.put(&buf[..n])?;
            }
        }
        out.put(&[op::EOF])?;
        let sum = if checksum {
            out.crc.clone().finalize()
        } else {
            0
        };
        out.file.write_all(&sum.to_le_bytes())?;
        out.file.flush()?;
        Ok((out.file, out.written + 8))
    })();
    for part in parts.values() {
        let _ = std::fs::remove_file(&part.path);
    }
    result
}
