//! Reading bftrainer.toml: one set of typed, range-checked key readers shared by the
//! job_submit plugin (`[policy]`) and bftrainerd (`[daemon]`, `[engine]`, `[runtime]`),
//! so every wrong key, type or value is reported the same way: the file, the table,
//! the key and what is allowed. Parsing only; callers read the file.

use std::ops::RangeInclusive;

/// Keys of `[policy]`, read by the job_submit plugin (all of them) and bftrainerd (the
/// partitions and `profile_dir`), in the order docs/admin.md explains them. Both refuse
/// any other key, so a typo (`satelite_partition`) is an error, not a silent default.
pub const POLICY_KEYS: [&str; 14] = [
    "partition",
    "satellite_partition",
    "allowed_partitions",
    "max_nodes",
    "allowed_users",
    "allowed_accounts",
    "daemon_user",
    "profile_dir",
    "exclusive",
    "hold",
    "plain_jobs",
    "satellite_spank_options",
    "satellite_qos",
    "core_qos",
];

/// Keys of `[gpu_lending]`: bftrainerd lends the free GPUs of the nodes of
/// `partitions` one at a time, as satellites in `satellite_partition`; the job_submit
/// plugin lets those satellites share their nodes (not `--exclusive`).
pub const GPU_LENDING_KEYS: [&str; 2] = ["partitions", "satellite_partition"];

/// Top-level tables of bftrainer.toml. Any other is most likely a typo: an error.
pub const TABLES: [&str; 6] = [
    "policy",
    "daemon",
    "engine",
    "metrics",
    "runtime",
    "gpu_lending",
];

/// `[gpu_lending]` as both readers take it: the partitions whose nodes' free GPUs are
/// lent (empty: off) and the GPU satellites' partition (`None` when off).
pub fn gpu_lending(
    doc: &toml::Table,
    file: &str,
) -> Result<(Vec<String>, Option<String>), ConfigError> {
    let g = Table::new(doc, "gpu_lending", file);
    g.check_keys(&GPU_LENDING_KEYS)?;
    let partitions = g.strings("partitions")?;
    let not_a_partition = |p: &str| {
        format!("'{p}' is not a partition name; expected letters, digits, '.', '_' or '-'")
    };
    if let Some(bad) = partitions.iter().find(|p| !partition_name_ok(p)) {
        return Err(g.err("partitions", not_a_partition(bad)));
    }
    let sat = g.opt_string("satellite_partition")?;
    match (&sat, partitions.is_empty()) {
        (Some(s), _) if !partition_name_ok(s) => {
            Err(g.err("satellite_partition", not_a_partition(s)))
        }
        (Some(s), false) if partitions.contains(s) => Err(g.err(
            "satellite_partition",
            format!("'{s}' is also in [gpu_lending] partitions; the GPU satellites need a partition of their own, a PriorityTier below the lending ones"),
        )),
        (None, false) => Err(g.err(
            "satellite_partition",
            "is missing; with [gpu_lending] partitions set, name the partition of the GPU satellites (e.g. \"shared-sat\": same nodes, a lower PriorityTier, PreemptMode=CANCEL)",
        )),
        _ => Ok((partitions.clone(), if partitions.is_empty() { None } else { sat })),
    }
}

/// A config problem, with everything the admin needs to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Parses the file's text and checks its top level: valid TOML, only known tables.
pub fn parse_doc(text: &str, file: &str) -> Result<toml::Table, ConfigError> {
    let doc: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        ConfigError(format!("{file}: not valid TOML: {}", e.message().trim()))
    })?;
    for (k, v) in &doc {
        if !TABLES.contains(&k.as_str()) {
            return Err(ConfigError(format!(
                "{file}: unknown table or key '{k}' at top level; allowed tables: [{}]",
                TABLES.join("], [")
            )));
        }
        if !v.is_table() {
            return Err(ConfigError(format!(
                "{file}: '{k}' must be a table ([{k}])"
            )));
        }
    }
    Ok(doc)
}

/// One table of the document (empty when absent), with readers for its keys.
#[derive(Debug)]
pub struct Table<'a> {
    file: &'a str,
    name: &'a str,
    t: &'a toml::Table,
}

static EMPTY: std::sync::OnceLock<toml::Table> = std::sync::OnceLock::new();

impl<'a> Table<'a> {
    pub fn new(doc: &'a toml::Table, name: &'a str, file: &'a str) -> Table<'a> {
        let t = doc
            .get(name)
            .and_then(|v| v.as_table())
            .unwrap_or_else(|| EMPTY.get_or_init(toml::Table::new));
        Table { file, name, t }
    }

    /// An error about `key`: "FILE: [TABLE] KEY: MSG".
    pub fn err(&self, key: &str, msg: impl std::fmt::Display) -> ConfigError {
        ConfigError(format!("{}: [{}] {key}: {msg}", self.file, self.name))
    }

    /// Refuses keys not in `allowed`.
    pub fn check_keys(&self, allowed: &[&str]) -> Result<(), ConfigError> {
        for k in self.t.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(self.err(
                    k,
                    format!("unknown key; allowed keys: {}", allowed.join(", ")),
                ));
            }
        }
        Ok(())
    }

    pub fn has(&self, key: &str) -> bool {
        self.t.contains_key(key)
    }

    pub fn string(&self, key: &str, default: &str) -> Result<String, ConfigError> {
        match self.t.get(key) {
            None => Ok(default.to_string()),
            Some(toml::Value::String(s)) => Ok(s.clone()),
            Some(v) => Err(self.err(key, format!("expected a string, found {}", v.type_str()))),
        }
    }

    pub fn opt_string(&self, key: &str) -> Result<Option<String>, ConfigError> {
        if self.has(key) {
            self.string(key, "").map(Some)
        } else {
            Ok(None)
        }
    }

    pub fn strings(&self, key: &str) -> Result<Vec<String>, ConfigError> {
        match self.t.get(key) {
            None => Ok(Vec::new()),
            Some(toml::Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        self.err(
                            key,
                            format!("expected a list of strings, found a {} in it", v.type_str()),
                        )
                    })
                })
                .collect(),
            Some(v) => Err(self.err(
                key,
                format!(
                    "expected a list of strings like [\"a\", \"b\"], found {}",
                    v.type_str()
                ),
            )),
        }
    }

    pub fn boolean(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.t.get(key) {
            None => Ok(default),
            Some(toml::Value::Boolean(b)) => Ok(*b),
            Some(v) => Err(self.err(
                key,
                format!("expected true or false, found {}", v.type_str()),
            )),
        }
    }

    /// A whole number in `range`; `None` when absent.
    pub fn uint(&self, key: &str, range: RangeInclusive<u64>) -> Result<Option<u64>, ConfigError> {
        let expected = format!(
            "expected a whole number from {} to {}",
            range.start(),
            range.end()
        );
        match self.t.get(key) {
            None => Ok(None),
            Some(toml::Value::Integer(n)) if *n >= 0 && range.contains(&(*n as u64)) => {
                Ok(Some(*n as u64))
            }
            Some(toml::Value::Integer(n)) => {
                Err(self.err(key, format!("{n} is out of range; {expected}")))
            }
            Some(v) => Err(self.err(key, format!("{expected}, found {}", v.type_str()))),
        }
    }

    /// A number of seconds (integer or float) in `range`.
    pub fn seconds(
        &self,
        key: &str,
        range: RangeInclusive<f64>,
        default: f64,
    ) -> Result<f64, ConfigError> {
        let expected = format!("expected seconds from {} to {}", range.start(), range.end());
        let v = match self.t.get(key) {
            None => return Ok(default),
            Some(toml::Value::Integer(n)) => *n as f64,
            Some(toml::Value::Float(f)) => *f,
            Some(v) => return Err(self.err(key, format!("{expected}, found {}", v.type_str()))),
        };
        if v.is_finite() && range.contains(&v) {
            Ok(v)
        } else {
            Err(self.err(key, format!("{v} is out of range; {expected}")))
        }
    }

    /// One of `allowed` (strings).
    pub fn choice(
        &self,
        key: &str,
        allowed: &[&str],
        default: &str,
    ) -> Result<String, ConfigError> {
        let v = self.string(key, default)?;
        if allowed.contains(&v.as_str()) {
            Ok(v)
        } else {
            Err(self.err(
                key,
                format!(
                    "'{v}' is not allowed; expected one of: {}",
                    allowed.join(", ")
                ),
            ))
        }
    }
}

/// `[runtime]` keys bft-run reads: the communication libraries' settings for every
/// elastic job's workers (bftrainerd checks them as well, and uses none).
pub const RUNTIME_NET_KEYS: [&str; 4] = [
    "nccl_socket_ifname",
    "gloo_socket_ifname",
    "nccl_ib_hca",
    "pg_timeout",
];

/// The site's defaults for the workers' NCCL and Gloo settings (`[runtime]`); a job's
/// own environment and bft-run's flags come first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeNet {
    pub nccl_socket_ifname: Option<String>,
    pub gloo_socket_ifname: Option<String>,
    pub nccl_ib_hca: Option<String>,
    /// Seconds (BFT_PG_TIMEOUT).
    pub pg_timeout: Option<f64>,
}

/// An interface or HCA list as NCCL and Gloo take it (`eth0`, `^docker,lo`, `=ib0`,
/// `mlx5_0:1,mlx5_1:1`): at most 256 letters, digits and `_.:,^=-`.
pub fn net_name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:,^=-".contains(&b))
}

/// The `[runtime]` network settings of a parsed bftrainer.toml, checked.
pub fn runtime_net(doc: &toml::Table, file: &str) -> Result<RuntimeNet, ConfigError> {
    let r = Table::new(doc, "runtime", file);
    let name = |k: &str| -> Result<Option<String>, ConfigError> {
        match r.opt_string(k)? {
            Some(v) if !net_name_ok(&v) => Err(r.err(
                k,
                format!(
                    "'{v}' is not an interface or HCA list; expected letters, digits and _.:,^=- (e.g. \"ib0\", \"^docker,lo\", \"mlx5_0:1\")"
                ),
            )),
            x => Ok(x),
        }
    };
    Ok(RuntimeNet {
        nccl_socket_ifname: name("nccl_socket_ifname")?,
        gloo_socket_ifname: name("gloo_socket_ifname")?,
        nccl_ib_hca: name("nccl_ib_hca")?,
        pg_timeout: if r.has("pg_timeout") {
            Some(r.seconds("pg_timeout", 1.0..=604_800.0, 1800.0)?)
        } else {
            None
        },
    })
}

/// [`runtime_net`] of a file's text (bft-run's reading of bftrainer.toml).
pub fn read_runtime_net(text: &str, file: &str) -> Result<RuntimeNet, ConfigError> {
    runtime_net(&parse_doc(text, file)?, file)
}

/// A Slurm partition name: letters, digits, '.', '_' or '-'.
pub fn partition_name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_network_settings_are_checked() {
        let n = read_runtime_net(
            "[runtime]\nnccl_socket_ifname = \"^docker,lo\"\nnccl_ib_hca = \"mlx5_0:1\"\npg_timeout = 90\n",
            "/c.toml",
        )
        .unwrap();
        assert_eq!(n.nccl_socket_ifname.as_deref(), Some("^docker,lo"));
        assert_eq!(n.gloo_socket_ifname, None);
        assert_eq!(n.nccl_ib_hca.as_deref(), Some("mlx5_0:1"));
        assert_eq!(n.pg_timeout, Some(90.0));
        assert_eq!(
            read_runtime_net("", "/c.toml").unwrap(),
            RuntimeNet::default()
        );
        for (text, want) in [
            (
                "[runtime]\ngloo_socket_ifname = \"eth0; id\"",
                "/c.toml: [runtime] gloo_socket_ifname: 'eth0; id' is not an interface",
            ),
            (
                "[runtime]\npg_timeout = 0",
                "/c.toml: [runtime] pg_timeout: 0 is out of range",
            ),
            (
                "[runtime]\nnccl_ib_hca = 3",
                "/c.toml: [runtime] nccl_ib_hca: expected a string",
            ),
        ] {
            let e = read_runtime_net(text, "/c.toml").unwrap_err().0;
            assert!(e.starts_with(want), "{text}: {e}");
        }
    }

    fn doc(text: &str) -> toml::Table {
        parse_doc(text, "/c.toml").unwrap()
    }

    #[test]
    fn readers_name_file_table_key_and_what_is_allowed() {
        let d = doc("[daemon]\npoll_interval = \"1s\"\nn = -3\nx = 1.5\nmode = \"fast\"\n");
        let t = Table::new(&d, "daemon", "/c.toml");
        assert_eq!(
            t.seconds("poll_interval", 0.1..=60.0, 1.0).unwrap_err().0,
            "/c.toml: [daemon] poll_interval: expected seconds from 0.1 to 60, found string"
        );
        assert_eq!(
            t.uint("n", 1..=10).unwrap_err().0,
            "/c.toml: [daemon] n: -3 is out of range; expected a whole number from 1 to 10"
        );
        assert_eq!(t.seconds("x", 0.0..=2.0, 0.0).unwrap(), 1.5);
        assert!(t
            .seconds("x", 2.0..=3.0, 0.0)
            .unwrap_err()
            .0
            .contains("1.5 is out of range"));
        assert_eq!(t.seconds("absent", 0.0..=1.0, 0.5).unwrap(), 0.5);
        assert!(t
            .choice("mode", &["slow", "safe"], "slow")
            .unwrap_err()
            .0
            .contains("'fast' is not allowed; expected one of: slow, safe"));
        assert!(t
            .check_keys(&["poll_interval"])
            .unwrap_err()
            .0
            .contains("[daemon] mode: unknown key; allowed keys: poll_interval"));
        let empty = Table::new(&d, "engine", "/c.toml");
        assert_eq!(empty.string("k", "v").unwrap(), "v");
        assert!(parse_doc("[nope]\n", "/c.toml")
            .unwrap_err()
            .0
            .contains("unknown table"));
        assert!(parse_doc("daemon = 1\n", "/c.toml")
            .unwrap_err()
            .0
            .contains("must be a table"));
    }
}
