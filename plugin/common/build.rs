//! Links GCC's unwinder statically (libgcc_eh.a) into whatever uses this crate, so the
//! plugins keep `panic = "unwind"` without a DT_NEEDED on libgcc_s.so.1.
//!
//! sbatch does not otherwise load libgcc_s, and loading it costs ~0.1 ms per command
//! (docs/benchmarks.md). This crate's archive comes before std's `-lgcc_s` on the link
//! line, so the `_Unwind_*` references of the plugin code are satisfied from libgcc_eh
//! first; with rustc's `--as-needed`, libgcc_s is then dropped.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let cfg = |key: &str| std::env::var(format!("CARGO_CFG_TARGET_{key}")).unwrap_or_default();
    if cfg("OS") != "linux" || cfg("ENV") != "gnu" {
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let found = Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    match found {
        Some(p) if p.is_absolute() && p.is_file() => {
            let dir = p.parent().expect("an absolute file path has a parent");
            println!("cargo:rustc-link-search=native={}", dir.display());
            println!("cargo:rustc-link-lib=static=gcc_eh");
        }
        // Still correct without it, only slower to load: libgcc_s provides the unwinder.
        _ => println!("cargo:warning=libgcc_eh.a not found via `{cc} -print-file-name`; the plugins will need libgcc_s.so.1"),
    }
}
