//! `bftrainer replay --compare A.toml B.toml` (or repeated `--objective`/`--t-fwd`): the
//! input loaded once, one simulation per policy, one table with a column per policy.

use super::batch::{BatchChoice, BatchOptions};
use super::output::thousands;
use super::{load, sim_config, Options};
use anyhow::{bail, Context};
use bftrainer_core::alloc::Objective;
use bftrainer_core::sim::cpus::CpuPolicy;
use bftrainer_core::sim::{self, CoreLoss, DaemonRules, Objective as CurveChoice, Report, Steps};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Keys of a policy file: the replay's policy options.
pub const KEYS: [&str; 11] = [
    "name",
    "objective",
    "t_fwd",
    "max_jobs",
    "grace",
    "curve",
    "steps",
    "release_before",
    "reclaim_hold",
    "start_latency",
    "core_loss",
];

/// One column of the comparison: the policy options of a replay.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub name: String,
    pub objective: String,
    pub t_fwd: f64,
    pub max_jobs: usize,
    pub grace: f64,
    pub curve: CurveChoice,
    pub steps: Steps,
    /// bftrainerd's rules (`release_before`, `reclaim_hold`, `start_latency`,
    /// `core_loss`).
    pub rules: DaemonRules,
    /// How the run treats the global batch (`--batch-range`: fixed or joint).
    pub batch: BatchChoice,
    /// How shared hosts' CPUs are split (`--cpu-alloc`), when modelled.
    pub cpu: Option<CpuPolicy>,
}

impl Policy {
    /// The policy the command line gives.
    pub fn of(o: &Options, name: &str) -> Policy {
        Policy {
            name: name.to_string(),
            objective: o.objective.clone(),
            t_fwd: o.t_fwd,
            max_jobs: o.max_jobs,
            grace: o.grace,
            curve: o.curve,
            steps: o.steps,
            rules: o.rules,
            batch: BatchChoice::Plain,
            cpu: o.cpu_alloc.map(|c| c.policy),
        }
    }

    /// `o` under this policy.
    fn apply(&self, o: &Options) -> Options {
        Options {
            objective: self.objective.clone(),
            t_fwd: self.t_fwd,
            max_jobs: self.max_jobs,
            grace: self.grace,
            curve: self.curve,
            steps: self.steps,
            rules: self.rules,
            cpu_alloc: o.cpu_alloc.map(|c| super::CpuAlloc {
                policy: self.cpu.unwrap_or(c.policy),
                ..c
            }),
            policies: Vec::new(),
            ..o.clone()
        }
    }
}

/// Reads a policy file: keys of `KEYS` at top level; a key left out takes the command
/// line's value (`base`); `name` defaults to the file's stem.
pub fn parse_policy(text: &str, file: &str, base: &Options) -> anyhow::Result<Policy> {
    let doc: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        anyhow::anyhow!("{file}: not valid TOML: {}", e.message().trim())
    })?;
    let stem = Path::new(file)
        .file_stem()
        .map_or(file.to_string(), |s| s.to_string_lossy().into_owned());
    let mut p = Policy::of(base, &stem);
    let err = |k: &str, m: String| anyhow::anyhow!("{file}: {k}: {m}");
    let string = |k: &str, v: &toml::Value| {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| err(k, format!("expected a string, found {}", v.type_str())))
    };
    // One of the named values, or an error listing them.
    fn choice<T: Copy>(s: &str, named: &[(&str, T)]) -> Result<T, String> {
        named
            .iter()
            .find(|(n, _)| *n == s)
            .map(|&(_, t)| t)
            .ok_or_else(|| {
                let names: Vec<&str> = named.iter().map(|(n, _)| *n).collect();
                format!(
                    "'{s}' is not allowed; expected one of: {}",
                    names.join(", ")
                )
            })
    }
    let seconds = |k: &str, v: &toml::Value, min_excl: bool| {
        let x = match v {
            toml::Value::Integer(n) => *n as f64,
            toml::Value::Float(f) => *f,
            _ => return Err(err(k, format!("expected seconds, found {}", v.type_str()))),
        };
        let ok = x.is_finite() && if min_excl { x > 0.0 } else { x >= 0.0 };
        if ok {
            Ok(x)
        } else {
            Err(err(
                k,
                format!(
                    "{x} is out of range; expected seconds {}",
                    if min_excl { "> 0" } else { ">= 0" }
                ),
            ))
        }
    };
    for (k, v) in &doc {
        match k.as_str() {
            "name" => {
                p.name = string(k, v)?;
                if p.name.trim().is_empty() {
                    return Err(err(k, "must not be empty".into()));
                }
            }
            "objective" => {
                let s = string(k, v)?;
                s.parse::<Objective>().map_err(|e| err(k, e.to_string()))?;
                p.objective = s;
            }
            "t_fwd" => p.t_fwd = seconds(k, v, true)?,
            "grace" => p.grace = seconds(k, v, false)?,
            "max_jobs" => match v {
                toml::Value::Integer(n) if *n >= 1 => p.max_jobs = *n as usize,
                _ => return Err(err(k, format!("expected a whole number >= 1, found {v}"))),
            },
            "curve" => {
                let named = [
                    ("objective", CurveChoice::File),
                    ("samples", CurveChoice::Samples),
                ];
                p.curve = choice(&string(k, v)?, &named).map_err(|m| err(k, m))?;
            }
            "steps" => {
                let named = [("exact", Steps::Exact), ("trace", Steps::Trace)];
                p.steps = choice(&string(k, v)?, &named).map_err(|m| err(k, m))?;
            }
            "release_before" => p.rules.release_before_s = seconds(k, v, false)?,
            "reclaim_hold" => p.rules.reclaim_hold_s = seconds(k, v, false)?,
            "start_latency" => p.rules.start_latency_s = seconds(k, v, false)?,
            "core_loss" => {
                let named = [("job", CoreLoss::Job), ("node", CoreLoss::Node)];
                p.rules.core_loss = choice(&string(k, v)?, &named).map_err(|m| err(k, m))?;
            }
            _ => {
                return Err(err(
                    k,
                    format!("unknown key; allowed keys: {}", KEYS.join(", ")),
                ))
            }
        }
    }
    Ok(p)
}

/// The policies of `--compare FILE...`, each file read and checked.
pub fn policy_files(files: &[std::path::PathBuf], base: &Options) -> anyhow::Result<Vec<Policy>> {
    let mut out: Vec<Policy> = Vec::new();
    for f in files {
        let name = f.display().to_string();
        let text = std::fs::read_to_string(f).with_context(|| format!("cannot read {name}"))?;
        let p = parse_policy(&text, &name, base)?;
        if let Some(q) = out.iter().find(|q| q.name == p.name) {
            bail!(
                "{name}: name '{}' is already the name of another policy ({}); give each file its own name",
                p.name,
                q.name
            );
        }
        out.push(p);
    }
    Ok(out)
}

/// Repeated `--objective` and `--t-fwd`: every combination (objectives outer), named
/// by what varies.
pub fn product(
    objectives: &[String],
    t_fwds: &[f64],
    base: &Options,
) -> anyhow::Result<Vec<Policy>> {
    let mut out = Vec::new();
    for ob in objectives {
        ob.parse::<Objective>()
            .map_err(|e| anyhow::anyhow!("--objective: {e}"))?;
        for &t in t_fwds {
            let name = match (objectives.len() > 1, t_fwds.len() > 1) {
                (true, true) => format!("{ob}, t-fwd {t}"),
                (true, false) => ob.clone(),
                _ => format!("t-fwd {t}"),
            };
            if out.iter().any(|p: &Policy| p.name == name) {
                bail!("--objective/--t-fwd: {name} is given twice");
            }
            out.push(Policy {
                objective: ob.clone(),
                t_fwd: t,
                ..Policy::of(base, &name)
            });
        }
    }
    Ok(out)
}

/// Each policy (or the command line's, when there is none) once per variant: `vary`
/// gives the variant's name ("fixed batch 256") and applies it to a copy. A named
/// policy's name becomes "NAME, VARIANT"; the command line's is the variant's name.
fn variants<V>(
    policies: Vec<Policy>,
    base: &Options,
    each: &[V],
    vary: impl Fn(&V, &mut Policy) -> String,
) -> Vec<Policy> {
    let named = !policies.is_empty();
    let policies = if named {
        policies
    } else {
        vec![Policy::of(base, "")]
    };
    let mut out = Vec::new();
    for p in policies {
        for v in each {
            let mut q = p.clone();
            let what = vary(v, &mut q);
            q.name = if named {
                format!("{}, {what}", p.name)
            } else {
                what
            };
            out.push(q);
        }
    }
    out
}

/// `--batch-range`: each policy (or the command line's, when there is none) run twice,
/// with every job at the fixed batch and with nodes and batch chosen together.
pub fn batch_pair(policies: Vec<Policy>, base: &Options) -> anyhow::Result<Vec<Policy>> {
    let Some(b) = &base.batch else {
        return Ok(policies);
    };
    b.validate()?;
    let each = [
        (BatchChoice::Fixed, format!("fixed batch {}", b.fixed)),
        (
            BatchChoice::Joint,
            format!("joint batch {}:{}", b.range.0, b.range.1),
        ),
    ];
    Ok(variants(policies, base, &each, |(choice, what), p| {
        p.batch = *choice;
        what.clone()
    }))
}

/// Each policy (or the command line's, when none) once per CPU allocation of
/// `--cpu-alloc` given several (`proportional,sensitivity`): the pair to compare.
pub fn cpu_pair(
    policies: Vec<Policy>,
    base: &Options,
    cpu: &[CpuPolicy],
) -> anyhow::Result<Vec<Policy>> {
    if cpu.len() < 2 {
        return Ok(policies);
    }
    Ok(variants(policies, base, cpu, |&c, p| {
        p.cpu = Some(c);
        format!("CPUs {}", cpu_name(Some(c)))
    }))
}

fn cpu_name(c: Option<CpuPolicy>) -> &'static str {
    match c {
        None => "-",
        Some(CpuPolicy::Proportional) => "proportional",
        Some(CpuPolicy::Sensitivity) => "sensitivity",
    }
}

/// Runs every policy on the same input and prints one table (or a JSON list).
pub fn run_compare(o: &Options) -> anyhow::Result<()> {
    for (set, what) in [
        (o.csv.is_some(), "--csv"),
        (o.sizes_csv.is_some(), "--sizes-csv"),
        (o.plots.is_some(), "--plots"),
        (o.write_journal.is_some(), "--write-journal"),
        (o.actions_csv.is_some(), "--actions-csv"),
    ] {
        if set {
            bail!("{what} writes one replay's output: run the policy alone for it, not in a comparison");
        }
    }
    let (loaded, runs, load_s) = replay_all(o)?;
    if o.json {
        let list: Vec<serde_json::Value> = runs
            .iter()
            .map(|(p, r, sim_s)| {
                let mut v = serde_json::json!({
                    "policy": p.name,
                    "trace": loaded.trace_name,
                    "jobs_file": loaded.jobs_name,
                    "settings": { "max_jobs": p.max_jobs, "t_fwd_s": p.t_fwd, "steps": p.steps, "grace_s": p.grace, "objective": p.objective, "curve": p.curve, "seed": o.seed, "daemon_rules": p.rules, "batch": batch_json(o, p.batch) },
                    "scheduler": loaded.sched,
                    "report": r,
                    "wall_s": { "load": load_s, "simulate": sim_s },
                });
                // Only where set: comparisons without it print what they always did.
                if let Some(c) = &p.cpu {
                    v["settings"]["cpu_alloc"] = serde_json::json!(c);
                }
                v
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    print_compare(
        &mut std::io::stdout().lock(),
        &loaded,
        &runs,
        load_s,
        o.batch.as_ref(),
    )?;
    Ok(())
}

/// The batch settings of a run, for the JSON (absent without `--batch-range`).
fn batch_json(o: &Options, choice: BatchChoice) -> serde_json::Value {
    match (&o.batch, choice) {
        (_, BatchChoice::Plain) | (None, _) => serde_json::Value::Null,
        (Some(b), _) => serde_json::json!({
            "choice": choice,
            "base_batch": b.model.base_batch,
            "noise_scale": b.model.noise_scale,
            "fixed": b.fixed,
            "range": [b.range.0, b.range.1],
        }),
    }
}

/// One run of a comparison: the policy, its report, its replay's wall time.
type Run = (Policy, Report, f64);

/// Loads the input once and replays it under each policy, in order.
fn replay_all(o: &Options) -> anyhow::Result<(super::Loaded, Vec<Run>, f64)> {
    let t_load = Instant::now();
    let mut loaded = load(o)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let file_jobs = loaded.jobs.clone();
    let mut runs: Vec<Run> = Vec::new();
    for p in &o.policies {
        if let Some(b) = &o.batch {
            loaded.jobs = b.jobs(&file_jobs, p.batch)?;
        }
        let po = p.apply(o);
        let objective: Objective = po
            .objective
            .parse()
            .with_context(|| format!("policy {}", p.name))?;
        let cfg = sim::SimConfig {
            record: false,
            journal: false,
            ..sim_config(&po, objective)
        };
        let origin = Instant::now();
        let out = super::simulate_loaded(
            &loaded,
            &cfg,
            objective,
            &mut |_| {},
            &mut sim::Collect::default(),
        )
        .with_context(|| format!("policy {}", p.name))?;
        runs.push((p.clone(), out.report, origin.elapsed().as_secs_f64()));
    }
    Ok((loaded, runs, load_s))
}

fn dur(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s < 3600.0 => format!("{:.1} min", s / 60.0),
        Some(s) => format!("{:.2} h", s / 3600.0),
    }
}

/// The comparison table: what the runs share, then one column per policy.
fn print_compare(
    w: &mut impl Write,
    l: &super::Loaded,
    runs: &[Run],
    load_s: f64,
    batch: Option<&BatchOptions>,
) -> std::io::Result<()> {
    let Some(r0) = runs.first().map(|r| &r.1) else {
        return Ok(());
    };
    let pct = |a: f64, b: f64| if b > 0.0 { 100.0 * a / b } else { 0.0 };
    writeln!(
        w,
        "BFTrainer replay: {} policies on the same input",
        runs.len()
    )?;
    writeln!(w, "  trace            {}", l.trace_name)?;
    writeln!(
        w,
        "  window           {} .. {} ({:.1} h)",
        r0.start, r0.end, r0.hours
    )?;
    writeln!(w, "  nodes            {}", r0.nodes)?;
    writeln!(
        w,
        "  elastic jobs     {} ({} in file)",
        l.jobs_name, r0.jobs_in_file
    )?;
    writeln!(
        w,
        "  idle node-hours  {}  (mean {:.1} idle nodes)",
        thousands(r0.idle_node_h, 1),
        r0.mean_idle_nodes
    )?;
    writeln!(w)?;
    type Row = (
        &'static str,
        fn(&Policy, &Report, f64, &dyn Fn(f64, f64) -> f64) -> String,
    );
    let rows: [Row; 22] = [
        ("objective", |p, _, _, _| p.objective.clone()),
        ("cpu allocation", |p, _, _, _| cpu_name(p.cpu).into()),
        ("t-fwd", |p, _, _, _| format!("{} s", p.t_fwd)),
        ("max-jobs", |p, _, _, _| p.max_jobs.to_string()),
        ("grace", |p, _, _, _| format!("{} s", p.grace)),
        ("curve / steps", |p, _, _, _| {
            format!(
                "{} / {}",
                match p.curve {
                    CurveChoice::File => "objective",
                    CurveChoice::Samples => "samples",
                },
                match p.steps {
                    Steps::Exact => "exact",
                    Steps::Trace => "trace",
                }
            )
        }),
        ("release-before / hold", |p, _, _, _| {
            format!(
                "{} s / {} s",
                p.rules.release_before_s, p.rules.reclaim_hold_s
            )
        }),
        ("start-latency / core-loss", |p, _, _, _| {
            format!(
                "{} s / {}",
                p.rules.start_latency_s,
                match p.rules.core_loss {
                    CoreLoss::Job => "job",
                    CoreLoss::Node => "node",
                }
            )
        }),
        ("harvested node-hours", |_, r, _, _| {
            thousands(r.harvested_node_h, 1)
        }),
        ("harvested % of idle", |_, r, _, _| {
            format!("{:.1}%", 100.0 * r.harvest_share)
        }),
        ("grace node-hours", |_, r, _, _| {
            thousands(r.grace_node_h, 1)
        }),
        ("samples processed", |_, r, _, _| {
            format!("{:.4e}", r.samples)
        }),
        ("efficiency", |_, r, _, _| {
            format!("{:.1}%", 100.0 * r.efficiency)
        }),
        ("rescale loss", |_, r, _, pct| {
            format!("{:.2}%", pct(r.rescale_loss_samples, r.samples_dedicated))
        }),
        ("preemption loss", |_, r, _, pct| {
            format!(
                "{:.2}%",
                pct(r.preemption_loss_samples, r.samples_dedicated)
            )
        }),
        ("admits / grows", |_, r, _, _| {
            format!("{} / {}", r.actions.admits, r.actions.grows)
        }),
        ("shrinks / requeues", |_, r, _, _| {
            format!("{} / {}", r.actions.shrinks, r.actions.requeues)
        }),
        ("nodes preempted", |_, r, _, _| {
            r.preempted_nodes.to_string()
        }),
        ("core-loss requeues / released", |_, r, _, _| {
            format!("{} / {}", r.core_loss_requeues, r.released_nodes)
        }),
        ("jobs completed", |_, r, _, _| {
            format!("{} of {}", r.jobs_completed, r.jobs_submitted)
        }),
        ("JCT mean / p50", |_, r, _, _| {
            format!("{} / {}", dur(r.jct_mean_s), dur(r.jct_p50_s))
        }),
        ("JCT p95", |_, r, _, _| dur(r.jct_p95_s)),
    ];
    let mut cells: Vec<Vec<String>> = vec![runs.iter().map(|r| r.0.name.clone()).collect()];
    for (_, f) in &rows {
        cells.push(runs.iter().map(|(p, r, s)| f(p, r, *s, &pct)).collect());
    }
    cells.push(runs.iter().map(|r| format!("{:.2} s", r.2)).collect());
    let labels: Vec<&str> = std::iter::once("policy")
        .chain(rows.iter().map(|r| r.0))
        .chain(std::iter::once("replay wall time"))
        .collect();
    let lw = labels.iter().map(|l| l.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..runs.len())
        .map(|c| {
            cells
                .iter()
                .map(|row| row[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (label, row) in labels.iter().zip(&cells) {
        let mut line = format!("  {label:<lw$}");
        for (c, v) in row.iter().enumerate() {
            line.push_str(&format!("  {v:>w$}", w = widths[c]));
        }
        writeln!(w, "{}", line.trim_end())?;
    }
    if let Some(b) = batch {
        print_batch_gain(w, runs, b)?;
    }
    writeln!(w, "  (input loaded once in {load_s:.2} s)")?;
    Ok(())
}

/// The gain of each joint run over the fixed run before it (`batch_pair` orders them).
fn print_batch_gain(w: &mut impl Write, runs: &[Run], b: &BatchOptions) -> std::io::Result<()> {
    let pairs: Vec<(&Run, &Run)> = runs
        .windows(2)
        .filter(|p| p[0].0.batch == BatchChoice::Fixed && p[1].0.batch == BatchChoice::Joint)
        .map(|p| (&p[0], &p[1]))
        .collect();
    writeln!(w)?;
    writeln!(
        w,
        "  batch model      Saxena et al. 2020 (alloc/efficiency.rs), curves measured at batch {}",
        b.model.base_batch
    )?;
    writeln!(
        w,
        "  sample value     {}",
        match b.model.noise_scale {
            None => "every batch of the range as efficient (Saxena)".to_string(),
            Some(n) => format!("gradient noise scale {n} (McCandlish et al. 2018)"),
        }
    )?;
    writeln!(
        w,
        "  (samples are goodput: base-batch samples, throughput x statistical efficiency)"
    )?;
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.3}", a / b)
        } else {
            "-".into()
        }
    };
    let opt = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => ratio(a, b),
        _ => "-".into(),
    };
    type Gain = (
        &'static str,
        fn(
            &Report,
            &Report,
            &dyn Fn(f64, f64) -> String,
            &dyn Fn(Option<f64>, Option<f64>) -> String,
        ) -> String,
    );
    let rows: [Gain; 6] = [
        ("samples processed", |j, f, r, _| r(j.samples, f.samples)),
        ("samples per harvested node-hour", |j, f, r, _| {
            r(
                j.samples / j.harvested_node_h.max(f64::MIN_POSITIVE),
                f.samples / f.harvested_node_h.max(f64::MIN_POSITIVE),
            )
        }),
        ("harvested node-hours", |j, f, r, _| {
            r(j.harvested_node_h, f.harvested_node_h)
        }),
        ("jobs completed", |j, f, r, _| {
            r(j.jobs_completed as f64, f.jobs_completed as f64)
        }),
        ("JCT mean / p50", |j, f, _, o| {
            format!(
                "{} / {}",
                o(j.jct_mean_s, f.jct_mean_s),
                o(j.jct_p50_s, f.jct_p50_s)
            )
        }),
        ("JCT p95", |j, f, _, o| o(j.jct_p95_s, f.jct_p95_s)),
    ];
    let label = "joint / fixed";
    let lw = rows
        .iter()
        .map(|r| r.0.len())
        .max()
        .unwrap_or(0)
        .max(label.len());
    let head: Vec<String> = pairs.iter().map(|(_, j)| j.0.name.clone()).collect();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(_, f)| {
            pairs
                .iter()
                .map(|(a, j)| f(&j.1, &a.1, &ratio, &opt))
                .collect()
        })
        .collect();
    let widths: Vec<usize> = (0..pairs.len())
        .map(|c| {
            cells
                .iter()
                .map(|r| r[c].len())
                .chain(std::iter::once(head[c].len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |label: &str, row: &[String]| {
        let mut s = format!("  {label:<lw$}");
        for (c, v) in row.iter().enumerate() {
            s.push_str(&format!("  {v:>w$}", w = widths[c]));
        }
        s.trim_end().to_string()
    };
    writeln!(w)?;
    writeln!(w, "{}", line(label, &head))?;
    for ((name, _), row) in rows.iter().zip(&cells) {
        writeln!(w, "{}", line(name, row))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::alloc_options;
    use crate::replay::replay_tests::opts;
    use bftrainer_core::engine::Exact;
    use bftrainer_core::sim::Hooks;

    #[test]
    fn policy_file_keys_defaults_and_errors() {
        let base = opts();
        let p = parse_policy(
            "name = \"patient\"\nt_fwd = 600\nobjective = \"efficiency\"\ngrace = 30.5\nmax_jobs = 4\ncurve = \"samples\"\nsteps = \"trace\"\n",
            "/x/b.toml",
            &base,
        )
        .unwrap();
        assert_eq!(
            p,
            Policy {
                name: "patient".into(),
                objective: "efficiency".into(),
                t_fwd: 600.0,
                max_jobs: 4,
                grace: 30.5,
                curve: CurveChoice::Samples,
                steps: Steps::Trace,
                rules: DaemonRules::DAEMON,
                batch: BatchChoice::Plain,
                cpu: None,
            }
        );
        // bftrainerd's rules, one key each; the others keep the command line's.
        let r = parse_policy(
            "release_before = 0
start_latency = 2.5
core_loss = \"node\"\n",
            "/x/r.toml",
            &base,
        )
        .unwrap();
        assert_eq!(
            r.rules,
            DaemonRules {
                release_before_s: 0.0,
                start_latency_s: 2.5,
                core_loss: CoreLoss::Node,
                ..DaemonRules::DAEMON
            }
        );
        // Keys left out take the command line's values; the name, the file's stem.
        let q = parse_policy("t_fwd = 60.0\n", "/x/a.toml", &base).unwrap();
        assert_eq!(
            q,
            Policy {
                name: "a".into(),
                t_fwd: 60.0,
                ..Policy::of(&base, "a")
            }
        );
        let e = |text: &str| {
            parse_policy(text, "pol/b.toml", &base)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            e("tfwd = 10\n"),
            "pol/b.toml: tfwd: unknown key; allowed keys: name, objective, t_fwd, max_jobs, grace, curve, steps, release_before, reclaim_hold, start_latency, core_loss"
        );
        assert_eq!(
            e("t_fwd = 0\n"),
            "pol/b.toml: t_fwd: 0 is out of range; expected seconds > 0"
        );
        assert_eq!(
            e("t_fwd = \"10\"\n"),
            "pol/b.toml: t_fwd: expected seconds, found string"
        );
        assert!(e("objective = \"fast\"\n")
            .starts_with("pol/b.toml: objective: unknown objective \"fast\"; allowed: bftrainer,"));
        assert_eq!(
            e("max_jobs = 0\n"),
            "pol/b.toml: max_jobs: expected a whole number >= 1, found 0"
        );
        assert_eq!(
            e("steps = \"fast\"\n"),
            "pol/b.toml: steps: 'fast' is not allowed; expected one of: exact, trace"
        );
        assert_eq!(
            e("core_loss = \"all\"\n"),
            "pol/b.toml: core_loss: 'all' is not allowed; expected one of: job, node"
        );
        assert_eq!(
            e("reclaim_hold = -1\n"),
            "pol/b.toml: reclaim_hold: -1 is out of range; expected seconds >= 0"
        );
        assert!(e("t_fwd = \n").starts_with("pol/b.toml: not valid TOML: "));
        assert_eq!(e("name = \"\"\n"), "pol/b.toml: name: must not be empty");
    }

    #[test]
    fn product_names_what_varies() {
        let base = opts();
        let names = |ob: &[&str], t: &[f64]| {
            let ob: Vec<String> = ob.iter().map(|s| s.to_string()).collect();
            product(&ob, t, &base)
                .map(|v| v.into_iter().map(|p| p.name).collect::<Vec<_>>())
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            names(&["bftrainer"], &[10.0, 600.0]).unwrap(),
            ["t-fwd 10", "t-fwd 600"]
        );
        assert_eq!(
            names(&["bftrainer", "fairness"], &[10.0]).unwrap(),
            ["bftrainer", "fairness"]
        );
        assert_eq!(
            names(&["bftrainer", "fairness"], &[10.0, 60.0]).unwrap(),
            [
                "bftrainer, t-fwd 10",
                "bftrainer, t-fwd 60",
                "fairness, t-fwd 10",
                "fairness, t-fwd 60"
            ]
        );
        assert!(names(&["bftrainer", "fast"], &[10.0])
            .unwrap_err()
            .starts_with("--objective: unknown objective \"fast\""));
        assert_eq!(
            names(&["bftrainer"], &[10.0, 10.0]).unwrap_err(),
            "--objective/--t-fwd: t-fwd 10 is given twice"
        );
    }

    /// Decision times are wall-clock: everything else must match.
    fn without_timing(mut r: Report) -> Report {
        r.decision_total_s = 0.0;
        r.decision_mean_ms = 0.0;
        r.decision_p99_ms = 0.0;
        r.decision_max_ms = 0.0;
        r
    }

    /// Two policies in one comparison give the figures of two single replays (through
    /// `run`'s own path, with recording on), and the table has a column for each.
    #[test]
    fn comparison_equals_single_runs() {
        let base = Options {
            hours: Some(3.0),
            ..opts()
        };
        let a = Policy::of(&base, "quick");
        let b = Policy {
            t_fwd: 600.0,
            objective: "efficiency".into(),
            ..Policy::of(&base, "patient")
        };
        let o = Options {
            policies: vec![a.clone(), b.clone()],
            ..base.clone()
        };
        let (loaded, runs, _) = replay_all(&o).unwrap();
        assert_eq!(runs.len(), 2);
        for (p, (q, r, _)) in [&a, &b].into_iter().zip(&runs) {
            assert_eq!(p, q);
            let single = p.apply(&base);
            let objective: Objective = single.objective.parse().unwrap();
            let l = load(&single).unwrap();
            let cfg = sim::SimConfig {
                record: true,
                ..sim_config(&single, objective)
            };
            let (mut c, mut pr) = (|| 0.0, |_f: f64| {});
            let out = sim::simulate_events(
                &mut *l.events().unwrap(),
                &l.jobs,
                Exact {
                    opts: alloc_options(objective),
                },
                &cfg,
                &mut Hooks {
                    clock: &mut c,
                    progress: &mut pr,
                },
            )
            .unwrap();
            assert_eq!(without_timing(out.report), without_timing(r.clone()));
        }
        assert_ne!(runs[0].1.harvested_node_h, runs[1].1.harvested_node_h);
        let mut text = Vec::new();
        print_compare(&mut text, &loaded, &runs, 0.1, None).unwrap();
        let text = String::from_utf8(text).unwrap();
        let policy = text
            .lines()
            .find(|l| l.trim_start().starts_with("policy"))
            .unwrap();
        assert!(
            policy.contains("quick") && policy.contains("patient"),
            "{text}"
        );
        let harvested = text
            .lines()
            .find(|l| l.trim_start().starts_with("harvested node-hours"))
            .unwrap();
        for (_, r, _) in &runs {
            assert!(
                harvested.contains(&thousands(r.harvested_node_h, 1)),
                "{text}"
            );
        }
        assert!(text.contains("t-fwd ") && text.contains("600 s"), "{text}");
    }

    /// `--batch-range`: the fixed run at the base batch is the plain replay, figure for
    /// figure; the joint run trains more on the sample (its curves are never below), and
    /// the table prints the ratios.
    #[test]
    fn batch_comparison_fixed_is_the_plain_replay_and_joint_trains_more() {
        use bftrainer_core::alloc::EfficiencyModel;
        let base = Options {
            hours: Some(3.0),
            ..opts()
        };
        let plain = {
            let o = Options {
                policies: vec![Policy::of(&base, "plain")],
                ..base.clone()
            };
            replay_all(&o).unwrap().1.remove(0).1
        };
        for noise in [None, Some(4096.0)] {
            let o = Options {
                batch: Some(BatchOptions {
                    model: EfficiencyModel {
                        base_batch: 256,
                        noise_scale: noise,
                    },
                    range: (256, 8192),
                    fixed: 256,
                }),
                ..base.clone()
            };
            let o = Options {
                policies: batch_pair(Vec::new(), &o).unwrap(),
                ..o
            };
            let names: Vec<&str> = o.policies.iter().map(|p| p.name.as_str()).collect();
            assert_eq!(names, ["fixed batch 256", "joint batch 256:8192"]);
            let (loaded, runs, _) = replay_all(&o).unwrap();
            // The same decisions; the figures to rounding (the curve is evaluated at
            // every node count, the file's interpolated between its points).
            let (f, j) = (&runs[0].1, &runs[1].1);
            assert_eq!(f.actions, plain.actions);
            assert_eq!(f.jobs_completed, plain.jobs_completed);
            for (a, b) in [
                (f.samples, plain.samples),
                (f.harvested_node_h, plain.harvested_node_h),
                (f.jct_mean_s.unwrap(), plain.jct_mean_s.unwrap()),
            ] {
                assert!((a - b).abs() <= 1e-9 * b, "{a} vs {b}");
            }
            assert!(
                j.samples > 1.02 * f.samples,
                "{noise:?}: {} vs {}",
                j.samples,
                f.samples
            );
            assert!(j.jobs_completed >= f.jobs_completed, "{noise:?}");
            let mut text = Vec::new();
            print_compare(&mut text, &loaded, &runs, 0.1, o.batch.as_ref()).unwrap();
            let text = String::from_utf8(text).unwrap();
            let line = text
                .lines()
                .skip_while(|l| !l.trim_start().starts_with("joint / fixed"))
                .find(|l| l.trim_start().starts_with("samples processed"))
                .unwrap_or_else(|| panic!("{text}"));
            assert!(
                line.ends_with(&format!("{:.3}", j.samples / f.samples)),
                "{text}"
            );
        }
        // Named policies are each paired.
        let o = Options {
            batch: Some(BatchOptions {
                model: EfficiencyModel::new(256),
                range: (128, 1024),
                fixed: 512,
            }),
            ..base.clone()
        };
        let two = vec![Policy::of(&o, "a"), Policy::of(&o, "b")];
        let names: Vec<String> = batch_pair(two, &o)
            .unwrap()
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(
            names,
            [
                "a, fixed batch 512",
                "a, joint batch 128:1024",
                "b, fixed batch 512",
                "b, joint batch 128:1024"
            ]
        );
    }

    #[test]
    fn comparison_refuses_single_run_outputs() {
        let o = Options {
            hours: Some(1.0),
            csv: Some("/tmp/x.csv".into()),
            policies: vec![Policy::of(&opts(), "a")],
            ..opts()
        };
        let e = run_compare(&o).unwrap_err().to_string();
        assert!(e.starts_with("--csv writes one replay's output"), "{e}");
    }
}
