//! The RDB file reader on arbitrary bytes, with and without the checksum check: every
//! record or a clean error, never a panic or an allocation the input did not pay for.
#![no_main]
use kite::persist::rdb::read::FileReader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for verify in [false, true] {
        if let Ok(mut r) = FileReader::open(std::io::Cursor::new(data), verify) {
            for _ in 0..100_000 {
                match r.next() {
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
        }
    }
});
