//! Links the SPANK plugin for lazy binding (`-z lazy`) instead of rustc's default
//! `-z now`, because sbatch loads it for every job, elastic or not.
//!
//! With `-z now` the dynamic loader binds every import when sbatch dlopens the plugin;
//! with `-z lazy` the PLT imports are bound on their first call, which in sbatch most
//! never get. (Imports that std's precompiled code reaches through the GOT are bound
//! at dlopen either way.) Slurm dlopens plugins with RTLD_LAZY, and Slurm's own
//! binaries and plugins are linked lazily too, so this adds no writable-GOT exposure
//! the host lacks. Measured in docs/benchmarks.md ("Plugins: submission throughput").

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    if target.contains("-linux-") {
        // After rustc's own `-z now` on the link line, so this one wins.
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,lazy");
    }
}
