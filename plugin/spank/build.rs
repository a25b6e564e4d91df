//! Links the SPANK plugin for lazy binding (`-z lazy`) instead of rustc's default
//! `-z now`, because sbatch loads it for every job, elastic or not.
//!
//! With `-z now` the dynamic loader resolves every imported function when sbatch
//! dlopens the plugin, including the many libc functions std only needs to print a
//! panic; lazily bound ones are resolved on their first call, which in sbatch's hot
//! path most never get. Slurm itself dlopens plugins with RTLD_LAZY, and its own
//! plugins and libslurmfull are linked lazily as well. Measured in docs/benchmarks.md
//! ("Plugins: submission throughput").

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    if target.contains("-linux-") {
        // After rustc's own `-z now` on the link line, so this one wins.
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,lazy");
    }
}
