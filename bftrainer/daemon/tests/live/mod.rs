//! Shared by the live daemon tests and the live benchmark: a directory other users can
//! enter (bftuser's jobs load the SPANK plugin and run the join script from it), the
//! staged plugins, a join script, and a bftrainer.toml for the test cluster's
//! partitions (`elastic`, `elastic-sat`).

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// A satellite's join command for tests and benchmarks (bft-run is another issue):
/// logs where it runs and stays up until signalled; `BAD_NODE` makes it fail at once
/// on that node.
pub const JOIN: &str = r#"#!/bin/sh
echo "joined parent $1 on $SLURMD_NODENAME at $(date +%s.%N)"
if [ -n "$BAD_NODE" ] && [ "$SLURMD_NODENAME" = "$BAD_NODE" ]; then echo "broken node" >&2; exit 3; fi
exec sleep 3600
"#;

pub struct Setup {
    pub tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub plugins: PathBuf,
    pub state: PathBuf,
    pub conf: PathBuf,
}

/// Writes everything a live cluster with bftrainerd needs under a new /tmp directory.
/// `policy_extra` and `daemon_extra` are lines added to `[policy]` and `[daemon]`;
/// satellites fail on `bad_node` (empty: none).
pub fn setup(prefix: &str, policy_extra: &str, daemon_extra: &str, bad_node: &str) -> Setup {
    let tmp = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    let dir = tmp.path().to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plugins = super::support::stage_plugins(&dir.join("plugins"));
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let join = dir.join("join.sh");
    std::fs::write(&join, JOIN).unwrap();
    std::fs::set_permissions(&join, std::fs::Permissions::from_mode(0o755)).unwrap();
    let conf = dir.join("bftrainer.toml");
    std::fs::write(
        &conf,
        format!(
            "[policy]\npartition = \"elastic\"\nsatellite_partition = \"elastic-sat\"\n\
             daemon_user = \"root\"\nmax_nodes = 4\n{policy_extra}\n\
             [daemon]\nstate_dir = \"{}\"\npoll_interval = 0.5\nshrink_grace = 3\n\
             grow_timeout = 20\nnode_backoff = 120\n{daemon_extra}\n\
             [engine]\nt_fwd = 600\n\
             [runtime]\njoin_command = \"env BAD_NODE={bad_node} {} {{parent}}\"\n\
             satellite_output = \"/dev/null\"\n",
            state.display(),
            join.display()
        ),
    )
    .unwrap();
    Setup {
        tmp,
        dir,
        plugins,
        state,
        conf,
    }
}

/// `--name value` from the command line, else `default`.
pub fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
