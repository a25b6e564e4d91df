//! Link settings that make loading the SPANK plugin cheap: sbatch loads it for every job,
//! elastic or not (docs/benchmarks.md, "Plugins: submission throughput").
//!
//! 1. `-z lazy` instead of rustc's default `-z now`: PLT imports are bound on their
//!    first call, which in sbatch most never get. Slurm dlopens plugins with RTLD_LAZY,
//!    and Slurm's own binaries and plugins are linked lazily too, so this adds no
//!    writable-GOT exposure the host lacks.
//! 2. Lazy imports (x86_64 Linux): rustc calls other libraries through the GOT, not the
//!    PLT, and std comes precompiled that way, so each libc function std can reach would
//!    still be looked up at dlopen. For every name in `lazy-imports.txt` the link gets
//!    `--wrap=NAME`, which points all references at a local stub `__wrap_NAME`, and the
//!    stub (generated here as assembly, included by src/lazy_imports.rs) is one
//!    `jmp __real_NAME@PLT`, which `--wrap` resolves to NAME itself through the PLT: a
//!    lazily bound import. Cost per call after the first: one more jump (the GOT slot
//!    of the call site now holds the stub, which jumps on through the PLT).
//!    tests/lazy_imports.rs checks the built .so: no strong import bound at load, and
//!    every listed name a function import. Only list functions that std references
//!    strongly: a stub behind a weak reference would always pass std's null check.

use std::fmt::Write as _;
use std::path::PathBuf;

const LIST: &str = "lazy-imports.txt";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={LIST}");
    println!("cargo::rustc-check-cfg=cfg(bft_lazy_imports)");
    let cfg = |key: &str| std::env::var(format!("CARGO_CFG_TARGET_{key}")).unwrap_or_default();
    if cfg("OS") != "linux" {
        return;
    }
    // After rustc's own `-z now` on the link line, so this one wins.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,lazy");
    if cfg("ARCH") != "x86_64" || cfg("ENV") != "gnu" {
        return; // Only costs load time elsewhere; the stubs are x86_64 assembly.
    }
    let list = std::fs::read_to_string(LIST).unwrap_or_else(|e| panic!("reading {LIST}: {e}"));
    let mut asm = String::from(".text\n");
    for name in names(&list) {
        assert!(
            !name.starts_with(|c: char| c.is_ascii_digit())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "{LIST}: `{name}` is not a C identifier"
        );
        // Called through the PLT by the TLS code itself; a stub would recurse into it.
        assert!(
            name != "__tls_get_addr",
            "{LIST}: `{name}` cannot be wrapped"
        );
        println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap={name}");
        let w = format!("__wrap_{name}");
        writeln!(
            asm,
            ".globl {w}\n.hidden {w}\n.type {w},@function\n.p2align 4\n{w}:\n    jmp __real_{name}@PLT\n.size {w}, .-{w}"
        )
        .unwrap();
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("lazy_imports.s"), asm).expect("writing lazy_imports.s");
    println!("cargo:rustc-cfg=bft_lazy_imports");
}

/// The names in the list: one per line, `#` starts a comment.
fn names(list: &str) -> impl Iterator<Item = &str> {
    list.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
}
