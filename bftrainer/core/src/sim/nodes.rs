//! What the replay's nodes offer and its jobs ask (`Event::NodeAttrs`, `Event::JobNeeds`):
//! node classes from a TOML file (hostlist or index range -> features, GPUs, memory),
//! and the parsers of the job file's request columns. Every value is checked.

use crate::constraint::Constraint;
use crate::hostlist::Hostlist;
use crate::placement::{Gpus, NodeAttrs};

/// The replay's nodes by class: what each class offers and each node's class, in the
/// trace's node order (the engine's node ids).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeTable {
    /// Each class's name and attributes.
    pub classes: Vec<(String, NodeAttrs)>,
    /// Per node, its index in `classes`.
    pub class_of: Vec<u32>,
}

impl NodeTable {
    /// The attributes of node `n`.
    pub fn attrs(&self, n: usize) -> &NodeAttrs {
        &self.classes[self.class_of[n] as usize].1
    }

    /// One class per distinct attributes, named by what they offer, from per-node
    /// attributes (a node list read from slurmctld).
    pub fn from_attrs(attrs: Vec<NodeAttrs>) -> NodeTable {
        let mut classes: Vec<(String, NodeAttrs)> = Vec::new();
        let mut class_of = Vec::with_capacity(attrs.len());
        for a in attrs {
            let k = match classes.iter().position(|(_, c)| *c == a) {
                Some(k) => k,
                None => {
                    classes.push((describe(&a), a));
                    classes.len() - 1
                }
            };
            class_of.push(k as u32);
        }
        NodeTable { classes, class_of }
    }
}

/// `gpu:a100:4, features a100,ib, 512000 MB`, or `no GPUs, no features`.
pub fn describe(a: &NodeAttrs) -> String {
    let mut parts = Vec::new();
    if a.gpus.is_empty() {
        parts.push("no GPUs".to_string());
    }
    for g in &a.gpus {
        parts.push(match &g.typ {
            Some(t) => format!("gpu:{t}:{}", g.count),
            None => format!("gpu:{}", g.count),
        });
    }
    if a.features.is_empty() {
        parts.push("no features".into());
    } else {
        parts.push(format!("features {}", a.features.join(",")));
    }
    if a.mem_mb > 0 {
        parts.push(format!("{} MB", a.mem_mb));
    }
    parts.join(", ")
}

/// Keys of a `[[class]]` table.
pub const CLASS_KEYS: [&str; 6] = ["name", "nodes", "index", "features", "gres", "mem"];

/// The name of the class of nodes that no `[[class]]` names.
pub const UNLISTED: &str = "unlisted";

/// One `[[class]]` of a node-class file.
#[derive(Debug, Clone)]
pub struct NodeClass {
    pub name: String,
    pub select: Select,
    pub attrs: NodeAttrs,
}

/// Which nodes a class is: a Slurm hostlist of names, or 0-based indices in the
/// trace's node order.
#[derive(Debug, Clone)]
pub enum Select {
    Names(Hostlist),
    Index(Vec<(u64, u64)>),
}

impl Select {
    fn contains(&self, name: &str, i: usize) -> bool {
        match self {
            Select::Names(h) => h.contains(name),
            Select::Index(r) => r.iter().any(|&(a, b)| (a..=b).contains(&(i as u64))),
        }
    }
}

/// Largest memory a node may state: 1 EB in MB (beyond any machine; stops overflow).
pub const MAX_MEM_MB: u64 = 1 << 40;
/// Most GPUs a node or a job's node may state.
pub const MAX_GPUS: u32 = 1 << 16;

/// Reads a node-class file:
///
/// ```toml
/// [[class]]
/// name = "a100"                 # optional; default class-N
/// nodes = "a[01-36]n[01-18]"    # a Slurm hostlist of trace node names, or
/// # index = "0-647"             # 0-based node indices in trace order
/// features = ["gpu", "a100"]    # optional
/// gres = "gpu:a100:4"           # optional, Slurm's Gres= syntax
/// mem = "512G"                  # optional, RealMemory: MB, or with K/M/G/T
/// ```
///
/// Errors name the file, the class and the key, and what is allowed.
pub fn parse_classes(text: &str, file: &str) -> Result<Vec<NodeClass>, String> {
    let doc: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("{file}: not valid TOML: {}", e.message().trim()))?;
    let mut out = Vec::new();
    for (k, v) in &doc {
        if k != "class" {
            return Err(format!(
                "{file}: {k}: unknown key; the file holds [[class]] tables only"
            ));
        }
        let Some(list) = v.as_array() else {
            return Err(format!(
                "{file}: class: expected [[class]] tables, found {}",
                v.type_str()
            ));
        };
        for (i, c) in list.iter().enumerate() {
            let Some(t) = c.as_table() else {
                return Err(format!(
                    "{file}: class {}: expected a table, found {}",
                    i + 1,
                    c.type_str()
                ));
            };
            out.push(parse_class(t, i, file)?);
        }
    }
    if out.is_empty() {
        return Err(format!("{file}: no [[class]] table"));
    }
    for (i, a) in out.iter().enumerate() {
        if a.name == UNLISTED || out[..i].iter().any(|b| b.name == a.name) {
            return Err(format!(
                "{file}: class name '{}' is used twice (or is the reserved '{UNLISTED}')",
                a.name
            ));
        }
    }
    Ok(out)
}

fn parse_class(t: &toml::Table, i: usize, file: &str) -> Result<NodeClass, String> {
    let label = match t.get("name").and_then(|v| v.as_str()) {
        Some(n) => format!("class '{n}'"),
        None => format!("class {}", i + 1),
    };
    let err = |k: &str, m: String| format!("{file}: {label}: {k}: {m}");
    let string = |k: &str, v: &toml::Value| {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| err(k, format!("expected a string, found {}", v.type_str())))
    };
    let mut name = format!("class-{}", i + 1);
    let mut select = None;
    let mut attrs = NodeAttrs::default();
    for (k, v) in t {
        match k.as_str() {
            "name" => {
                name = string(k, v)?;
                check_name(&name).map_err(|m| err(k, m))?;
            }
            "nodes" | "index" => {
                if select.is_some() {
                    return Err(err(k, "give either nodes or index, not both".into()));
                }
                let s = string(k, v)?;
                select = Some(if k == "nodes" {
                    Select::Names(Hostlist::parse(&s).map_err(|e| err(k, e.0))?)
                } else {
                    Select::Index(parse_index(&s).map_err(|m| err(k, m))?)
                });
            }
            "features" => {
                let Some(list) = v.as_array() else {
                    return Err(err(
                        k,
                        format!("expected a list of strings, found {}", v.type_str()),
                    ));
                };
                for f in list {
                    let f = f.as_str().ok_or_else(|| {
                        err(
                            k,
                            format!("expected a list of strings, found {}", f.type_str()),
                        )
                    })?;
                    check_name(f).map_err(|m| err(k, m))?;
                    if !attrs.features.iter().any(|x| x == f) {
                        attrs.features.push(f.to_string());
                    }
                }
            }
            "gres" => attrs.gpus = parse_gres(&string(k, v)?).map_err(|m| err(k, m))?,
            "mem" => {
                attrs.mem_mb = match v {
                    toml::Value::Integer(n) => mem_mb(&n.to_string()).map_err(|m| err(k, m))?,
                    _ => mem_mb(&string(k, v)?).map_err(|m| err(k, m))?,
                }
            }
            _ => {
                return Err(err(
                    k,
                    format!("unknown key; allowed keys: {}", CLASS_KEYS.join(", ")),
                ))
            }
        }
    }
    let select = select.ok_or_else(|| {
        format!(
            "{file}: {label}: give the nodes it holds: nodes = \"HOSTLIST\" or index = \"RANGES\""
        )
    })?;
    Ok(NodeClass {
        name,
        select,
        attrs,
    })
}

/// A feature, GPU type or class name: letters, digits, `_`, `-`, `.`, at most 64 (the
/// characters Slurm's constraint grammar does not use).
pub fn check_name(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 64 {
        return Err(format!("'{s}': a name must have 1 to 64 characters"));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "'{s}': {c:?} is not allowed in a name; allowed: letters, digits, '_', '-', '.'"
        ));
    }
    Ok(())
}

/// `0-647,1000`: 0-based node indices.
fn parse_index(s: &str) -> Result<Vec<(u64, u64)>, String> {
    let mut out = Vec::new();
    for item in s.split(',') {
        let item = item.trim();
        let (a, b) = item.split_once('-').unwrap_or((item, item));
        let num = |t: &str| {
            t.trim().parse::<u64>().map_err(|_| {
                format!("'{item}' is not an index or a range N-M of indices (0-based, >= 0)")
            })
        };
        let (a, b) = (num(a)?, num(b)?);
        if a > b {
            return Err(format!("range '{item}' runs backwards"));
        }
        out.push((a, b));
    }
    Ok(out)
}

/// Slurm's memory syntax: a number of MB, or with a suffix K, M, G or T (powers of
/// 1024). Above 0 and at most [`MAX_MEM_MB`].
pub fn mem_mb(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 0u64),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 1),
        Some(b'g' | b'G') => (&t[..t.len() - 1], 1024),
        Some(b't' | b'T') => (&t[..t.len() - 1], 1024 * 1024),
        _ => (t, 1),
    };
    let bad = || {
        format!(
            "'{s}' is not a memory size; expected a whole number > 0 of MB, or with a suffix K, M, G or T (e.g. 512G)"
        )
    };
    if num.is_empty() || !num.bytes().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    let v: u64 = num.parse().map_err(|_| bad())?;
    let mb = if mult == 0 {
        v.div_ceil(1024)
    } else {
        v.saturating_mul(mult)
    };
    if v == 0 {
        return Err(bad());
    }
    if mb > MAX_MEM_MB {
        return Err(format!("'{s}' is more than {MAX_MEM_MB} MB"));
    }
    Ok(mb)
}

/// A count of GPUs: 1 to [`MAX_GPUS`].
pub fn gpu_count(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_GPUS).contains(&n) => Ok(n),
        _ => Err(format!(
            "'{s}' is not a GPU count; expected a whole number from 1 to {MAX_GPUS}"
        )),
    }
}

/// A node's `Gres=` as slurm.conf writes it: `gpu:4`, `gpu:a100:4`, several
/// comma-separated (`gpu:a100:2,gpu:v100:2`); a `(S:0-1)` socket binding is ignored,
/// GRES other than `gpu` are ignored (the replay models GPUs only).
pub fn parse_gres(s: &str) -> Result<Vec<Gpus>, String> {
    let mut out: Vec<Gpus> = Vec::new();
    for e in s.split(',') {
        let e = e.trim();
        let e = e.split_once('(').map_or(e, |(a, _)| a);
        if e.is_empty() {
            return Err(format!("'{s}': an empty GRES entry"));
        }
        let f: Vec<&str> = e.split(':').collect();
        check_name(f[0]).map_err(|m| format!("'{s}': {m}"))?;
        if f[0] != "gpu" {
            continue;
        }
        let g = match f[1..] {
            [] => Gpus {
                typ: None,
                count: 1,
            },
            [c] if c.bytes().all(|b| b.is_ascii_digit()) => Gpus {
                typ: None,
                count: gpu_count(c).map_err(|m| format!("'{s}': {m}"))?,
            },
            [t] => {
                check_name(t).map_err(|m| format!("'{s}': {m}"))?;
                Gpus {
                    typ: Some(t.into()),
                    count: 1,
                }
            }
            [t, c] => {
                check_name(t).map_err(|m| format!("'{s}': {m}"))?;
                Gpus {
                    typ: Some(t.into()),
                    count: gpu_count(c).map_err(|m| format!("'{s}': {m}"))?,
                }
            }
            _ => {
                return Err(format!(
                    "'{e}' is not a GPU GRES; expected gpu, gpu:COUNT or gpu:TYPE:COUNT"
                ))
            }
        };
        match out.iter_mut().find(|x| x.typ == g.typ) {
            Some(x) => x.count = x.count.saturating_add(g.count).min(MAX_GPUS),
            None => out.push(g),
        }
    }
    Ok(out)
}

/// A `--constraint` expression as the job file gives it: it must parse (bftrainerd
/// takes an unreadable one as no restriction, for Slurm to decide; a replay has no
/// Slurm to decide, so it refuses it).
pub fn check_constraint(s: &str) -> Result<(), String> {
    Constraint::parse(s).map(|_| ()).map_err(|e| e.0)
}

/// Each node's class: the class whose nodes name it, or the implicit class
/// [`UNLISTED`] (no features, no GPUs, memory unknown: as a Slurm node declared with
/// none). A node two classes name is refused; a class naming no node of the trace is
/// returned as a warning.
pub fn resolve(
    classes: &[NodeClass],
    names: &[String],
    file: &str,
) -> Result<(NodeTable, Vec<String>), String> {
    let mut table = NodeTable {
        classes: classes
            .iter()
            .map(|c| (c.name.clone(), c.attrs.clone()))
            .collect(),
        class_of: Vec::with_capacity(names.len()),
    };
    let mut used = vec![0usize; classes.len()];
    let mut unlisted = None;
    for (i, name) in names.iter().enumerate() {
        let mut found: Option<usize> = None;
        for (k, c) in classes.iter().enumerate() {
            if c.select.contains(name, i) {
                if let Some(f) = found {
                    return Err(format!(
                        "{file}: node {name} (index {i}) is in class '{}' and in class '{}'; a node must be in one class",
                        classes[f].name, c.name
                    ));
                }
                found = Some(k);
            }
        }
        let k = match found {
            Some(k) => {
                used[k] += 1;
                k
            }
            None => *unlisted.get_or_insert_with(|| {
                table
                    .classes
                    .push((UNLISTED.to_string(), NodeAttrs::default()));
                table.classes.len() - 1
            }),
        };
        table.class_of.push(k as u32);
    }
    let warnings = classes
        .iter()
        .zip(&used)
        .filter(|(_, &n)| n == 0)
        .map(|(c, _)| format!("{file}: class '{}' names no node of the trace", c.name))
        .collect();
    Ok((table, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIXED: &str = r#"
[[class]]
name = "a100"
nodes = "g[01-02]"
features = ["gpu", "a100"]
gres = "gpu:a100:4"
mem = "512G"
[[class]]
name = "v100"
index = "2-3"
gres = "gpu:v100:6(S:0-1)"
mem = 262144
"#;

    #[test]
    fn classes_resolve_by_name_and_index() {
        let c = parse_classes(MIXED, "m.toml").unwrap();
        let names: Vec<String> = ["g01", "g02", "v1", "v2", "c1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (t, w) = resolve(&c, &names, "m.toml").unwrap();
        assert!(w.is_empty());
        assert_eq!(t.class_of, vec![0, 0, 1, 1, 2]);
        assert_eq!(t.attrs(0).gpus_of(Some("a100")), 4);
        assert_eq!(t.attrs(0).mem_mb, 512 * 1024);
        assert_eq!(t.attrs(0).features, vec!["gpu", "a100"]);
        assert_eq!(t.attrs(2).gpus_of(Some("v100")), 6);
        assert_eq!(t.attrs(2).mem_mb, 262_144);
        assert_eq!(t.classes[2].0, UNLISTED);
        assert_eq!(*t.attrs(4), NodeAttrs::default());
        // A class naming nothing is a warning.
        let (_, w) = resolve(&c, &names[..2], "m.toml").unwrap();
        assert_eq!(w, vec!["m.toml: class 'v100' names no node of the trace"]);
    }

    #[test]
    fn bad_files_name_the_class_and_key() {
        let e = |s: &str| parse_classes(s, "m.toml").unwrap_err();
        let cls = |body: &str| format!("[[class]]\nname = \"x\"\n{body}\n");
        assert!(e("[[class]]\nname = \"x\"\n").contains("give the nodes it holds"));
        assert!(e(&cls("nodes = \"a\"\nindex = \"1\"")).contains("not both"));
        assert!(e(&cls("nodes = \"a[1-\"")).contains("class 'x': nodes: hostlist"));
        assert!(e(&cls("index = \"-1\"")).contains("0-based, >= 0"));
        assert!(e(&cls("index = \"5-2\"")).contains("runs backwards"));
        assert!(e(&cls("nodes = \"a\"\nmem = -5")).contains("not a memory size"));
        assert!(e(&cls("nodes = \"a\"\nmem = \"0\"")).contains("not a memory size"));
        assert!(e(&cls("nodes = \"a\"\nmem = \"12Q\"")).contains("not a memory size"));
        assert!(e(&cls("nodes = \"a\"\nmem = \"99999999999T\"")).contains("more than"));
        assert!(e(&cls("nodes = \"a\"\ngres = \"gpu:a100:-4\"")).contains("not a GPU count"));
        assert!(e(&cls("nodes = \"a\"\ngres = \"gpu:a100:0\"")).contains("not a GPU count"));
        assert!(e(&cls("nodes = \"a\"\ngres = \"gpu:a:b:c\"")).contains("not a GPU GRES"));
        assert!(e(&cls("nodes = \"a\"\nfeatures = [\"a&b\"]")).contains("'&' is not allowed"));
        assert!(e(&cls("nodes = \"a\"\nfeatures = \"a\"")).contains("expected a list"));
        assert!(e(&cls("nodes = \"a\"\ngpus = 4")).contains("unknown key; allowed keys: name"));
        assert!(e("nodes = \"a\"").contains("[[class]] tables only"));
        assert!(e("").contains("no [[class]]"));
        assert!(e("[[class]").contains("not valid TOML"));
        assert!(
            e("[[class]]\nname=\"a\"\nnodes=\"x\"\n[[class]]\nname=\"a\"\nnodes=\"y\"")
                .contains("used twice")
        );
        // Overlap is refused at resolution, naming the node.
        let c = parse_classes("[[class]]\nnodes=\"n[1-2]\"\n[[class]]\nindex=\"1\"", "m").unwrap();
        let names = vec!["n1".to_string(), "n2".to_string()];
        let e = resolve(&c, &names, "m").unwrap_err();
        assert!(
            e.contains("node n2 (index 1) is in class 'class-1' and in class 'class-2'"),
            "{e}"
        );
    }

    #[test]
    fn gres_and_memory_syntax() {
        assert_eq!(
            parse_gres("gpu:a100:2,gpu:v100:2,nvme:1,gpu:a100:1").unwrap(),
            vec![
                Gpus {
                    typ: Some("a100".into()),
                    count: 3
                },
                Gpus {
                    typ: Some("v100".into()),
                    count: 2
                }
            ]
        );
        assert_eq!(parse_gres("gpu").unwrap()[0].count, 1);
        assert_eq!(
            parse_gres("gpu:8").unwrap()[0],
            Gpus {
                typ: None,
                count: 8
            }
        );
        assert_eq!(mem_mb("2048").unwrap(), 2048);
        assert_eq!(mem_mb("2g").unwrap(), 2048);
        assert_eq!(mem_mb("1T").unwrap(), 1 << 20);
        assert_eq!(mem_mb("1500K").unwrap(), 2);
        assert!(mem_mb("-1").is_err() && mem_mb("1.5G").is_err() && mem_mb("").is_err());
    }
}
