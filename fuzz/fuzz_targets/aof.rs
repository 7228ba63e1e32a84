//! The AOF's command reader and its manifest parser on arbitrary bytes.
#![no_main]
use kite::persist::aof::manifest::Manifest;
use kite::persist::aof::replay::next_command;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = std::io::BufReader::new(data);
    let mut offset = 0u64;
    for _ in 0..100_000 {
        match next_command(&mut r, &mut offset) {
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    let _ = Manifest::parse(&String::from_utf8_lossy(data));
});
