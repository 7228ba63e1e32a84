//! RESTORE's payload decoder (a DUMP value, its RDB version and CRC64) on arbitrary
//! bytes, checked and unchecked.
#![no_main]
use kite::persist::rdb::read::read_payload;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = read_payload(data, true);
    let _ = read_payload(data, false);
});
