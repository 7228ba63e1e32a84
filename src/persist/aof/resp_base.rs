//! The AOF base as commands (`aof-use-rdb-preamble no`): a snapshot read back and written
//! as the commands that rebuild it, in the forms Redis's own rewrite uses.

use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

use super::effects::encode;
use crate::persist::rdb::read::{FileReader, Record};
use crate::types::stream::{Stream, StreamId};
use crate::types::value::Value;

/// Items per command for collections, as Redis's rewrite batches them.
const ITEMS_PER_COMMAND: usize = 64;

fn id(i: StreamId) -> Vec<u8> {
    i.to_string().into_bytes()
}

/// Writes `rdb` (a snapshot) to `out` as commands.
pub fn rdb_to_commands(rdb: &Path, out: &Path) -> std::io::Result<u64> {
    let file = std::fs::File::open(rdb)?;
    let mut reader = FileReader::open(BufReader::with_capacity(1 << 20, file), true)
        .map_err(|e| std::io::Error::other(e.msg))?;
    let mut w = BufWriter::with_capacity(1 << 17, std::fs::File::create(out)?);
    let mut buf = Vec::with_capacity(1 << 16);
    let mut db: Option<u64> = None;
    let mut selected = None;
    loop {
        let record = reader.next().map_err(|e| std::io::Error::other(e.msg))?;
        match record {
            None | Some(Record::Eof) => break,
            Some(Record::SelectDb(n)) => db = Some(n),
            Some(Record::Function(code)) => {
                encode(&mut buf, &[b"FUNCTION".as_slice(), b"LOAD", &code])
            }
            Some(Record::Key(k)) => {
                let Some(value) = k.value else { continue };
                let want = db.unwrap_or(0);
                if selected != Some(want) {
                    encode(
                        &mut buf,
                        &[b"SELECT".as_slice(), want.to_string().as_bytes()],
                    );
                    selected = Some(want);
                }
                key_commands(&mut buf, &k.key, &value);
                if k.expire_at != 0 {
                    let at = k.expire_at.to_string();
                    encode(&mut buf, &[b"PEXPIREAT".as_slice(), &k.key, at.as_bytes()]);
                }
            }
            Some(_) => {}
        }
        if buf.len() > 1 << 16 {
            w.write_all(&buf)?;
            buf.clear();
        }
    }
    w.write_all(&buf)?;
    let f = w.into_inner().map_err(|e| e.into_error())?;
    f.sync_all()?;
    Ok(f.metadata()?.len())
}

/// Emits `name key item...` in batches.
fn batched(buf: &mut Vec<u8>, name: &[u8], key: &[u8], items: &[Vec<u8>], per: usize) {
    for chunk in items.chunks(ITEMS_PER_COMMAND * per) {
        let mut argv: Vec<&[u8]> = Vec::with_capacity(chunk.len() + 2);
        argv.push(name);
        argv.push(key);
        argv.extend(chunk.iter().map(|v| v.as_slice()));
        encode(buf, &argv);
    }
}

fn key_commands(buf: &mut Vec<u8>, key: &[u8], value: &Value) {
    match value {
        Value::Str(s) => encode(buf, &[b"SET".as_slice(), key, &s.to_vec()]),
        Value::List(l) => {
            let items: Vec<Vec<u8>> = l
                .nodes_from(0)
                .flat_map(|(_, n)| n.map(|i| i.to_vec()))
                .collect();
            batched(buf, b"RPUSH", key, &items, 1);
        }
        Value::Set(s) => {
            let mut scratch = [0u8; 20];
            let items: Vec<Vec<u8>> = s.iter().map(|m| m.bytes(&mut scratch).to_vec()).collect();
            batched(buf, b"SADD", key, &items, 1);
        }
        Value::Hash(h) => {
            let items: Vec<Vec<u8>> = h
                .iter()
                .flat_map(|(f, v)| [f.to_vec(), v.to_vec()])
                .collect();
            batched(buf, b"HSET", key, &items, 2);
        }
        Value::ZSet(z) => {
            let mut items = Vec::with_capacity(z.len() * 2);
            z.visit(0, false, |member, score| {
                items.push(crate::protocol::reply::format_double(score).into_bytes());
                items.push(member.to_vec());
                true
            });
            batched(buf, b"ZADD", key, &items, 2);
        }
        Value::Stream(s) => stream_commands(buf, key, s),
    }
}

fn stream_commands(buf: &mut Vec<u8>, key: &[u8], s: &Stream) {
    let log = &s.log;
    let mut any = false;
    for e in log.range(StreamId::MIN, StreamId::MAX) {
        let eid = id(e.id);
        let mut argv: Vec<&[u8]> = vec![b"XADD", key, &eid];
        for (f, v) in e.pairs() {
            argv.push(f);
            argv.push(v);
        }
        encode(buf, &argv);
        any = true;
    }
    if !any {
        // An empty stream still exists: made with one entry trimmed away at once (0-0
        // is no id XADD takes; XSETID below puts the real last id back).
        let last = id(log.last_id.max(StreamId::new(0, 1)));
        encode(
            buf,
            &[b"XADD".as_slice(), key, b"MAXLEN", b"0", &last, b"x", b"y"],
        );
    }
    let (last, added, maxdel) = (
        id(log.last_id),
        log.entries_added.to_string(),
        id(log.max_deleted),
    );
    encode(
        buf,
        &[
            b"XSETID".as_slice(),
            key,
            &last,
            b"ENTRIESADDED",
            added.as_bytes(),
            b"MAXDELETEDID",
            &maxdel,
        ],
    );
    for (name, g) in &s.groups {
        let (glast, read) = (id(g.last_id), g.entries_read.to_string());
        encode(
            buf,
            &[
                b"XGROUP".as_slice(),
                b"CREATE",
                key,
                name,
                &glast,
                b"ENTRIESREAD",
                read.as_bytes(),
            ],
        );
        for c in g.consumers() {
            encode(
                buf,
                &[b"XGROUP".as_slice(), b"CREATECONSUMER", key, name, &c.name],
            );
            for pid in &c.pel {
                let Some(nack) = g.pel.get(pid) else { continue };
                let (p, t, n) = (
                    id(*pid),
                    nack.delivery_time.to_string(),
                    nack.delivery_count.to_string(),
                );
                encode(
                    buf,
                    &[
                        b"XCLAIM".as_slice(),
                        key,
                        name,
                        &c.name,
                        b"0",
                        &p,
                        b"TIME",
                        t.as_bytes(),
                        b"RETRYCOUNT",
                        n.as_bytes(),
                        b"JUSTID",
                        b"FORCE",
                    ],
                );
            }
        }
    }
}
