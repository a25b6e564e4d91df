//! Shared by the cluster tests, the throughput benchmark and spank_bftrainer's ELF test:
//! finds the two freshly built plugin .so files (checked against their sources), stages
//! them under the names Slurm looks for, and reads `scontrol show job`.
//!
//! The plugins are cdylibs, so cargo does not link them into tests; they must be built.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// target/<profile>/ of this test or bench binary (it lives in target/<profile>/deps/).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.ancestors()
        .skip_while(|p| p.file_name() != Some(std::ffi::OsStr::new("deps")))
        .nth(1)
        .expect("test binary under target/<profile>/deps")
        .to_path_buf()
}

fn newest_source(dir: &Path, newest: &mut SystemTime) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            newest_source(&p, newest);
        } else if p.extension().is_some_and(|x| x == "rs") {
            if let Ok(m) = e.metadata().and_then(|m| m.modified()) {
                *newest = (*newest).max(m);
            }
        }
    }
}

/// The two plugins as cargo builds them (`lib<name>.so` in target/<profile>/), the name
/// Slurm looks for, and what each is built from beside plugin/common and the grammar.
const PLUGINS: [(&str, &str, &[&str]); 2] = [
    (
        "libjob_submit_bftrainer.so",
        "job_submit_bftrainer.so",
        &["plugin/job_submit/src"],
    ),
    (
        "libspank_bftrainer.so",
        "spank_bftrainer.so",
        &[
            "plugin/spank/src",
            "plugin/spank/build.rs",
            "plugin/spank/lazy-imports.txt",
        ],
    ),
];

/// target/<profile>/`built` (one of the two plugins), checked to be newer than what it
/// is built from. Panics with the command to run when it is missing or stale.
pub fn built_plugin(built: &str) -> PathBuf {
    let (_, _, own) = PLUGINS
        .iter()
        .find(|(b, _, _)| *b == built)
        .unwrap_or_else(|| panic!("{built} is not one of the plugins"));
    let from = profile_dir();
    let release = from.file_name().is_some_and(|n| n != "debug");
    let build = format!(
        "cargo build{} -p job_submit_bftrainer -p spank_bftrainer",
        if release { " --release" } else { "" }
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut newest = SystemTime::UNIX_EPOCH;
    let common = [
        "plugin/common/src",
        "plugin/common/build.rs",
        "bftrainer/core/src/spec.rs",
        "bftrainer/core/src/config.rs",
    ];
    for d in common.iter().chain(own.iter()) {
        let p = root.join(d);
        if p.is_file() {
            if let Ok(m) = p.metadata().and_then(|m| m.modified()) {
                newest = newest.max(m);
            }
        }
        newest_source(&p, &mut newest);
    }
    let src = from.join(built);
    let modified = std::fs::metadata(&src)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing; build the plugins first: {build}",
                src.display()
            )
        });
    assert!(
        modified >= newest,
        "{} is older than its sources; rebuild the plugins: {build}",
        src.display()
    );
    src
}

/// Copies libjob_submit_bftrainer.so and libspank_bftrainer.so of this build profile into
/// `into` as job_submit_bftrainer.so and spank_bftrainer.so (see `built_plugin`).
pub fn stage_plugins(into: &Path) -> PathBuf {
    std::fs::create_dir_all(into).unwrap();
    for (built, name, _) in PLUGINS {
        std::fs::copy(built_plugin(built), into.join(name)).unwrap();
    }
    into.to_path_buf()
}

/// `scontrol show job -o ID` as key -> value. Values with spaces are not used by the
/// tests, so splitting on whitespace is enough.
pub fn job_fields(oneliner: &str) -> BTreeMap<String, String> {
    oneliner
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
