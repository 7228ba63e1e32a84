//! Compiles the C helpers: long double arithmetic for INCRBYFLOAT (csrc/longdouble.c).

fn main() {
    println!("cargo:rerun-if-changed=csrc/longdouble.c");
    cc::Build::new()
        .file("csrc/longdouble.c")
        .opt_level(2)
        .warnings(true)
        .compile("kite_longdouble");
}
