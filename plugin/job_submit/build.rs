//! Gives this crate slurm-sys's `slurm_ge_*` cfgs (from DEP_SLURM_*, which slurm-sys's
//! build script derives from the installed headers), so the exported hooks match the
//! release being built for: job_modify's signature and slurmctld's job record changed.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_SLURM_CFGS");
    println!("cargo:rerun-if-env-changed=DEP_SLURM_ALL_CFGS");
    let list = |key: &str| {
        std::env::var(key)
            .unwrap_or_default()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect::<Vec<_>>()
    };
    for name in list("DEP_SLURM_ALL_CFGS") {
        println!("cargo::rustc-check-cfg=cfg({name})");
    }
    for name in list("DEP_SLURM_CFGS") {
        println!("cargo:rustc-cfg={name}");
    }
}
