//! Other SPANK plugins' options (pyxis `--container-image`, an Apptainer plugin's
//! image) that a core job's satellites carry, so that workers on grown nodes run as the
//! core's do: which are carried, how they are checked, and how they travel in the tag.
//!
//! sbatch hands a SPANK option to the job as `_SLURM_SPANK_OPTION_<plugin>_<option>=VALUE`
//! in its `spank_job_env` (Slurm's `_option_setenv`, src/common/plugstack.c in 22.05,
//! spank.c from 23.02; every character of the names other than a letter or digit
//! becomes `_`). job_submit/bftrainer copies the allowed ones of a core job into its tag
//! (the admin comment, which only it and privileged uids write): `bftrainer:v1
//! spank:NAME=VALUE,... MIN:MAX,...,role=core`. bftrainerd gives each satellite the same
//! entries, in its `spank_job_env` (the prolog's and epilog's SPANK context) and in its
//! environment, as sbatch would (the batch step's remote context, and under
//! `SLURM_SPANK_<entry>` the srun inside it).
//!
//! Everything here comes from the user: names and values are checked and capped, and
//! only the options of plugins the admin names in `[policy] satellite_spank_options`
//! are carried, never bftrainer's own.

use std::fmt;

use crate::spec::TAG_PREFIX;

/// Slurm's prefix of a SPANK option in a job's environment (`SPANK_OPTION_ENV_PREFIX`).
pub const OPTION_PREFIX: &str = "_SLURM_SPANK_OPTION_";
/// What sbatch puts before each `spank_job_env` entry in the job's environment; srun
/// reads an option from there (`spank_process_env_options`).
pub const ENV_COPY_PREFIX: &str = "SLURM_SPANK_";
/// Start of the carried options in a core tag, right after [`TAG_PREFIX`].
pub const TAG_KEY: &str = "spank:";
/// Most options a job may carry.
pub const MAX_OPTIONS: usize = 16;
/// Longest option name (plugin and option, without [`OPTION_PREFIX`]).
pub const MAX_NAME_LEN: usize = 128;
/// Longest value of one option, in bytes.
pub const MAX_VALUE_LEN: usize = 1024;
/// Longest carried segment of a tag, encoded.
pub const MAX_ENCODED_LEN: usize = 4096;
/// bftrainer's own SPANK plugin: its options are never carried (the daemon writes the
/// satellite's own request).
const OURS: &str = "bftrainer";

/// One carried option: `name` is `<plugin>_<option>` in Slurm's canonical form (without
/// [`OPTION_PREFIX`]); `value` as sbatch set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    pub name: String,
    pub value: String,
}

impl Carried {
    /// The variable's full name, `_SLURM_SPANK_OPTION_<name>`.
    pub fn var(&self) -> String {
        format!("{OPTION_PREFIX}{}", self.name)
    }
}

/// Why an option is not carried, or a tag's options are unreadable. Each says what was
/// wrong and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CarryError {
    #[error("SPANK option {shown}: its name is not a plugin's option name (letters, digits and '_', at most {MAX_NAME_LEN})", shown = show(name))]
    BadName { name: String },
    #[error("SPANK option {name}: its value is {len} bytes long; at most {MAX_VALUE_LEN} bytes are carried to satellites")]
    TooLong { name: String, len: usize },
    #[error("SPANK option {name}: its value holds a control character or invalid UTF-8 (byte {offset}); satellites carry printable values only")]
    BadValue { name: String, offset: usize },
    #[error("SPANK option {name} is given twice in the job's SPANK environment; give it once")]
    Twice { name: String },
    #[error("the job has {0} SPANK options of plugins whose options satellites carry; at most {MAX_OPTIONS} are carried")]
    TooMany(usize),
    #[error(
        "the job's SPANK options take {0} bytes in its tag; at most {MAX_ENCODED_LEN} are carried"
    )]
    TooBig(usize),
    #[error("the carried SPANK options in the tag are malformed: {0}")]
    Malformed(String),
}

/// Shows at most 60 characters of a name, control bytes escaped.
fn show(s: &str) -> String {
    let t: String = s.chars().take(60).flat_map(char::escape_default).collect();
    if s.chars().count() > 60 {
        format!("'{t}...'")
    } else {
        format!("'{t}'")
    }
}

/// One entry of `[policy] satellite_spank_options`: a plugin (all its options) or one
/// option of it, as the admin wrote it (`pyxis`, `pyxis:container-image`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// Canonical plugin name (Slurm's: non-alphanumerics as `_`).
    plugin: String,
    /// Canonical option name; `None`: every option of the plugin.
    option: Option<String>,
}

fn canonical(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn word_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

impl Allowed {
    /// Parses one entry; the message says what is allowed.
    pub fn parse(entry: &str) -> Result<Allowed, String> {
        let (plugin, option) = match entry.split_once(':') {
            Some((p, o)) => (p, Some(o)),
            None => (entry, None),
        };
        if !word_ok(plugin) || option.is_some_and(|o| !word_ok(o)) {
            return Err(format!(
                "'{}' is not a SPANK plugin name or PLUGIN:OPTION; expected e.g. \"pyxis\" or \"pyxis:container-image\" (letters, digits, '_', '-', '.')",
                entry.escape_default()
            ));
        }
        let plugin = canonical(plugin);
        if plugin.starts_with(OURS) {
            return Err(format!(
                "'{entry}' names bftrainer's own plugin; its options are never carried (bftrainerd writes each satellite's request)"
            ));
        }
        Ok(Allowed {
            plugin,
            option: option.map(canonical),
        })
    }

    fn covers(&self, name: &str) -> bool {
        let Some(rest) = name
            .strip_prefix(self.plugin.as_str())
            .and_then(|r| r.strip_prefix('_'))
        else {
            return false;
        };
        match &self.option {
            None => !rest.is_empty(),
            Some(o) => rest == o,
        }
    }
}

/// Parses `[policy] satellite_spank_options`.
pub fn parse_allowed(entries: &[String]) -> Result<Vec<Allowed>, String> {
    entries.iter().map(|e| Allowed::parse(e)).collect()
}

fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.starts_with(&format!("{OURS}_"))
}

fn check_value(name: &str, value: &[u8]) -> Result<String, CarryError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(CarryError::TooLong {
            name: name.into(),
            len: value.len(),
        });
    }
    let bad = |offset| CarryError::BadValue {
        name: name.into(),
        offset,
    };
    let s = std::str::from_utf8(value).map_err(|e| bad(e.valid_up_to()))?;
    if let Some((i, _)) = s.char_indices().find(|(_, c)| c.is_control()) {
        return Err(bad(i));
    }
    Ok(s.to_string())
}

/// The options a core job's satellites carry, from its `spank_job_env` (`NAME=VALUE`
/// entries): those of allowed plugins, checked. Other entries (other plugins' options,
/// plugins' job-control variables, bftrainer's own) are left alone. An allowed option
/// that is malformed, too long or given twice is an error: the job would run on its
/// satellites without it.
pub fn collect(spank_env: &[&[u8]], allowed: &[Allowed]) -> Result<Vec<Carried>, CarryError> {
    if allowed.is_empty() {
        return Ok(Vec::new());
    }
    let mut out: Vec<Carried> = Vec::new();
    for entry in spank_env {
        let Some(rest) = entry.strip_prefix(OPTION_PREFIX.as_bytes()) else {
            continue;
        };
        let (name, value) = match rest.iter().position(|&b| b == b'=') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &b""[..]),
        };
        let name = String::from_utf8_lossy(name);
        if name.starts_with(&format!("{OURS}_")) || !allowed.iter().any(|a| a.covers(&name)) {
            continue;
        }
        if !name_ok(&name) {
            return Err(CarryError::BadName { name: name.into() });
        }
        push_checked(&mut out, &name, value)?;
    }
    let len = encode(&out).len();
    if len > MAX_ENCODED_LEN {
        return Err(CarryError::TooBig(len));
    }
    Ok(out)
}

/// Bytes a value keeps as they are in the tag; any other is written `%XX`.
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/' | b'+' | b'@')
}

struct Encoded<'a>(&'a [Carried]);

impl fmt::Display for Encoded<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}=", c.name)?;
            for &b in c.value.as_bytes() {
                if plain(b) {
                    write!(f, "{}", b as char)?;
                } else {
                    write!(f, "%{b:02X}")?;
                }
            }
        }
        Ok(())
    }
}

/// The carried options as they stand in a tag (without [`TAG_KEY`]).
pub fn encode(carried: &[Carried]) -> String {
    Encoded(carried).to_string()
}

/// A core tag ([`crate::spec::ElasticSpec::to_tag`]) with `carried` written into it;
/// the tag itself when there are none.
pub fn with_carried(tag: &str, carried: &[Carried]) -> String {
    match tag.strip_prefix(TAG_PREFIX) {
        Some(rest) if !carried.is_empty() => {
            format!("{TAG_PREFIX}{TAG_KEY}{} {rest}", encode(carried))
        }
        _ => tag.to_string(),
    }
}

/// Splits the carried segment off a tag: `(the tag without it, the segment)`. Any text
/// that is not a tag with one comes back whole.
pub fn split(comment: &str) -> (std::borrow::Cow<'_, str>, Option<&str>) {
    if let Some(rest) = comment
        .strip_prefix(TAG_PREFIX)
        .and_then(|r| r.strip_prefix(TAG_KEY))
    {
        if let Some((seg, spec)) = rest.split_once(' ') {
            return (format!("{TAG_PREFIX}{spec}").into(), Some(seg));
        }
    }
    (comment.into(), None)
}

fn unhex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes a carried segment ([`encode`]'s form) and checks each option again: a tag can
/// be written by hand by a privileged user.
pub fn decode(seg: &str) -> Result<Vec<Carried>, CarryError> {
    if seg.len() > MAX_ENCODED_LEN {
        return Err(CarryError::TooBig(seg.len()));
    }
    let mut out: Vec<Carried> = Vec::new();
    for item in seg.split(',') {
        let (name, enc) = item.split_once('=').ok_or_else(|| {
            CarryError::Malformed(format!("'{}' is not NAME=VALUE", item.escape_default()))
        })?;
        if !name_ok(name) {
            return Err(CarryError::BadName { name: name.into() });
        }
        let mut value = Vec::with_capacity(enc.len());
        let b = enc.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                let (Some(h), Some(l)) = (
                    b.get(i + 1).copied().and_then(unhex),
                    b.get(i + 2).copied().and_then(unhex),
                ) else {
                    return Err(CarryError::Malformed(format!(
                        "{name}: a '%' not followed by two hex digits"
                    )));
                };
                value.push(h << 4 | l);
                i += 3;
            } else if plain(b[i]) {
                value.push(b[i]);
                i += 1;
            } else {
                return Err(CarryError::Malformed(format!(
                    "{name}: byte 0x{:02x} must be written %XX",
                    b[i]
                )));
            }
        }
        push_checked(&mut out, name, &value)?;
    }
    Ok(out)
}

/// The options a core job's tag carries (none when it carries none).
pub fn from_tag(admin_comment: &str) -> Result<Vec<Carried>, CarryError> {
    match split(admin_comment).1 {
        Some(seg) => decode(seg),
        None => Ok(Vec::new()),
    }
}

/// `NAME=VALUE` entries of a job's environment or SPANK environment.
pub type Entries = Vec<(String, String)>;

/// What a satellite gets, as sbatch would have set it for the same options: its
/// `spank_job_env` entries, and the entries of its environment.
pub fn satellite_entries(carried: &[Carried]) -> (Entries, Entries) {
    let spank: Entries = carried.iter().map(|c| (c.var(), c.value.clone())).collect();
    let mut env = spank.clone();
    env.extend(
        carried
            .iter()
            .map(|c| (format!("{ENV_COPY_PREFIX}{}", c.var()), c.value.clone())),
    );
    (spank, env)
}

/// Checks `value`, refuses a second option of the same `name` and more than
/// [`MAX_OPTIONS`], and appends it to `out`.
fn push_checked(out: &mut Vec<Carried>, name: &str, value: &[u8]) -> Result<(), CarryError> {
    let value = check_value(name, value)?;
    if out.iter().any(|c| c.name == name) {
        return Err(CarryError::Twice { name: name.into() });
    }
    out.push(Carried {
        name: name.into(),
        value,
    });
    if out.len() > MAX_OPTIONS {
        return Err(CarryError::TooMany(out.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{self, ElasticSpec};

    fn allow(e: &[&str]) -> Vec<Allowed> {
        parse_allowed(&e.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn c(name: &str, value: &str) -> Carried {
        Carried {
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn carries_only_allowed_plugins_never_ours_nor_job_control_variables() {
        let env: Vec<&[u8]> = vec![
            b"BFTRAINER_ELASTIC=2:4",
            b"_SLURM_SPANK_OPTION_bftrainer_elastic=2:4",
            b"_SLURM_SPANK_OPTION_pyxis_container_image=nvcr.io#nvidia/pytorch:24.01-py3",
            b"_SLURM_SPANK_OPTION_pyxis_container_mounts=/data:/data,/scratch:/s",
            b"_SLURM_SPANK_OPTION_x11_x11=batch",
            b"PYXIS_SOMETHING=1",
            b"_SLURM_SPANK_OPTION_singularity_exec_image=/img/a b.sif",
        ];
        let got = collect(&env, &allow(&["pyxis", "singularity-exec:image"])).unwrap();
        assert_eq!(
            got,
            vec![
                c("pyxis_container_image", "nvcr.io#nvidia/pytorch:24.01-py3"),
                c("pyxis_container_mounts", "/data:/data,/scratch:/s"),
                c("singularity_exec_image", "/img/a b.sif"),
            ]
        );
        // One option of a plugin only.
        let got = collect(&env, &allow(&["pyxis:container-image"])).unwrap();
        assert_eq!(got.len(), 1);
        // Nothing allowed: nothing carried, whatever the job has.
        assert!(collect(&env, &[]).unwrap().is_empty());
        // Our own plugin cannot be allowed.
        assert!(Allowed::parse("bftrainer")
            .unwrap_err()
            .contains("own plugin"));
        assert!(Allowed::parse("bftrainer:elastic").is_err());
        for bad in ["", "py xis", "pyxis:", ":x", "a=b", "pyxis:image,x"] {
            assert!(Allowed::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_hostile_values_with_a_reason() {
        let a = allow(&["pyxis"]);
        let long = format!(
            "_SLURM_SPANK_OPTION_pyxis_image={}",
            "a".repeat(MAX_VALUE_LEN + 1)
        );
        let e = collect(&[long.as_bytes()], &a).unwrap_err();
        assert!(
            e.to_string().contains("1025 bytes long; at most 1024"),
            "{e}"
        );
        let e = collect(&[b"_SLURM_SPANK_OPTION_pyxis_image=a\nb"], &a).unwrap_err();
        assert!(e.to_string().contains("control character"), "{e}");
        let e = collect(&[b"_SLURM_SPANK_OPTION_pyxis_image=\xff"], &a).unwrap_err();
        assert!(matches!(e, CarryError::BadValue { .. }), "{e}");
        let e = collect(&[b"_SLURM_SPANK_OPTION_pyxis_im-age=x"], &a).unwrap_err();
        assert!(e.to_string().contains("not a plugin's option name"), "{e}");
        let e = collect(
            &[
                b"_SLURM_SPANK_OPTION_pyxis_image=a",
                b"_SLURM_SPANK_OPTION_pyxis_image=b",
            ],
            &a,
        )
        .unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
        let many: Vec<String> = (0..=MAX_OPTIONS)
            .map(|i| format!("_SLURM_SPANK_OPTION_pyxis_o{i}=v"))
            .collect();
        let many: Vec<&[u8]> = many.iter().map(|s| s.as_bytes()).collect();
        assert_eq!(collect(&many, &a).unwrap_err(), CarryError::TooMany(17));
        let big: Vec<String> = (0..8)
            .map(|i| format!("_SLURM_SPANK_OPTION_pyxis_o{i}={}", "%".repeat(300)))
            .collect();
        let big: Vec<&[u8]> = big.iter().map(|s| s.as_bytes()).collect();
        assert!(matches!(
            collect(&big, &a).unwrap_err(),
            CarryError::TooBig(_)
        ));
        // A flag option (no value) travels as sbatch sent it.
        assert_eq!(
            collect(&[b"_SLURM_SPANK_OPTION_pyxis_container_mount_home"], &a).unwrap(),
            vec![c("pyxis_container_mount_home", "")]
        );
    }

    #[test]
    fn the_tag_keeps_working_with_carried_options_and_round_trips_them() {
        let s = ElasticSpec {
            min: 2,
            max: Some(4),
            ..Default::default()
        };
        let carried = vec![
            c("pyxis_container_image", "nvcr.io#nvidia/pytorch:24.01-py3"),
            c("pyxis_container_mounts", "/a b:/c,/d:/e=%x"),
            c("pyxis_container_mount_home", ""),
        ];
        let tag = with_carried(&s.to_tag(), &carried);
        assert!(
            tag.starts_with("bftrainer:v1 spank:pyxis_container_image=nvcr.io%23"),
            "{tag}"
        );
        assert!(!tag[TAG_PREFIX.len()..].contains(|c: char| c.is_whitespace() && c != ' '));
        assert_eq!(tag.matches(' ').count(), 2, "{tag}");
        assert_eq!(from_tag(&tag).unwrap(), carried);
        // The rest of the tag's machinery sees the spec, holds and decided batches.
        assert_eq!(spec::parse_tag(&tag), Some(Ok(s.clone())));
        let held = format!("{tag}{}", spec::ADMIN_HOLD);
        assert_eq!(spec::parse_tag(&held), Some(Ok(s.clone())));
        assert_eq!(spec::split_admin_hold(&held), (tag.as_str(), true));
        let with_batch = spec::with_batch_now(&held, Some(64)).unwrap();
        assert_eq!(spec::batch_now(&with_batch), Some(64));
        assert_eq!(from_tag(&with_batch).unwrap(), carried);
        assert_eq!(spec::parse_tag(&with_batch), Some(Ok(s.clone())));
        // No options: the tag as it was.
        assert_eq!(with_carried(&s.to_tag(), &[]), s.to_tag());
        assert!(from_tag(&s.to_tag()).unwrap().is_empty());
        // The satellite's entries, as sbatch sets them.
        let (spank, env) = satellite_entries(&carried[..1]);
        assert_eq!(
            spank,
            vec![(
                "_SLURM_SPANK_OPTION_pyxis_container_image".into(),
                "nvcr.io#nvidia/pytorch:24.01-py3".into()
            )]
        );
        assert_eq!(env.len(), 2);
        assert_eq!(
            env[1].0,
            "SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_container_image"
        );
    }

    #[test]
    fn a_hand_written_segment_is_checked_again() {
        for (seg, why) in [
            ("pyxis_image", "not NAME=VALUE"),
            ("pyxis_image=a%2", "two hex digits"),
            ("pyxis_image=a%0A", "control character"),
            ("pyxis_image=a#b", "must be written %XX"),
            ("bftrainer_elastic=9:9", "not a plugin's option name"),
            ("pyxis_image=a,pyxis_image=b", "given twice"),
            ("PATH=/bin", ""),
        ] {
            let tag = format!("bftrainer:v1 spank:{seg} 2:4,role=core");
            match from_tag(&tag) {
                Err(e) => assert!(e.to_string().contains(why), "{seg}: {e}"),
                // An upper-case name is a plugin's option name too; only the prefixed
                // variable is set, never PATH itself.
                Ok(v) => assert_eq!(v[0].var(), "_SLURM_SPANK_OPTION_PATH", "{seg}"),
            }
        }
        // Not a tag, or a tag without options: nothing.
        assert!(from_tag("spank:pyxis_image=a 2:4").unwrap().is_empty());
        assert!(from_tag("bftrainer:v1 2:4,role=core").unwrap().is_empty());
    }
}
