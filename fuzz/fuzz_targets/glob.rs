//! Glob matching on an arbitrary pattern and subject (split at the first NUL): it must end
//! within libFuzzer's time limit whatever the pattern (CVE-2022-36021's class of bug).
#![no_main]
use kite::commands::util::glob_match;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (pattern, subject) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"[..]),
    };
    let _ = glob_match(pattern, subject, false);
    let _ = glob_match(pattern, subject, true);
});
