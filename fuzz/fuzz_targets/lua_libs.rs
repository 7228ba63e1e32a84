//! The Lua libraries scripts reach with untrusted data: cjson.decode, cmsgpack.unpack and
//! struct.unpack (with a format string from the input) inside the real sandbox. Errors
//! are fine; a crash, a hang or memory growth is not.
#![no_main]
use bytes::Bytes;
use kite::scripting::vm::with_vm;
use libfuzzer_sys::fuzz_target;

const SCRIPT: &[u8] = b"pcall(cjson.decode, ARGV[1])\n\
    pcall(cmsgpack.unpack, ARGV[1])\n\
    pcall(struct.unpack, ARGV[2], ARGV[1])\n\
    pcall(struct.pack, ARGV[2], 1, 2, 3)\n\
    pcall(cjson.encode, cmsgpack.unpack(ARGV[1]))\n\
    return 1";

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |&b| (b as usize) % 16).min(data.len());
    let format = Bytes::copy_from_slice(&data[..split]);
    let value = Bytes::copy_from_slice(&data[split..]);
    with_vm(|vm| {
        let f = vm.compile("fuzz", SCRIPT).expect("the fuzz script compiles");
        vm.set_keys_argv(&[], &[value, format]).expect("arguments");
        let _ = vm.run_script(&f);
    });
    kite::scripting::vm::collect_if_large();
});
