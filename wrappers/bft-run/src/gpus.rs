//! The node's GPUs as bft-run sees them: Slurm's binding (CUDA_VISIBLE_DEVICES) first,
//! else NVML; `--probe-gpus` prints both. Also what the agents' job step must not
//! inherit, so that Slurm gives it every GPU the job holds on each node.

use std::sync::Once;

/// More devices than any node has (16 GPUs x 7 MIG slices is 112): a longer list is
/// not a device binding, and would start that many workers.
pub const MAX_DEVICES: usize = 128;

/// Where the list of GPUs came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// CUDA_VISIBLE_DEVICES, as Slurm (or the user) set it.
    Visible,
    /// NVML found these devices (CUDA_VISIBLE_DEVICES unset).
    Nvml,
    /// No GPUs: the reason, for the log.
    None(String),
}

/// The GPUs this node's workers share (each worker sees all of them and picks its own
/// by LOCAL_RANK, as under torchrun), and where the list came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpus {
    pub devices: Vec<String>,
    pub source: Source,
}

/// The node's GPUs: Slurm's binding first (in a step with GPUs Slurm sets
/// CUDA_VISIBLE_DEVICES to the allocated ones; NVML would count the whole node's); set
/// but empty or "NoDevFiles" means none. Else every device NVML finds; none when the
/// NVML library is missing or fails, which is said once per process on stderr.
pub fn node_gpus() -> NodeGpus {
    let g = from_env(
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
        nvml_count,
    );
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        if let Source::None(why) = &g.source {
            say!("bft-run: no GPUs on this node: {why}");
        }
    });
    g
}

/// [`node_gpus`] given CUDA_VISIBLE_DEVICES and a way to count NVML's devices.
pub fn from_env(visible: Option<&str>, nvml: impl FnOnce() -> Result<u32, String>) -> NodeGpus {
    match visible {
        Some(v) => {
            let devices = parse_visible_devices(v);
            let source = if devices.is_empty() {
                Source::None(format!("CUDA_VISIBLE_DEVICES is {v:?}"))
            } else {
                Source::Visible
            };
            NodeGpus { devices, source }
        }
        None => match nvml() {
            Ok(0) => NodeGpus {
                devices: Vec::new(),
                source: Source::None("NVML finds no device".into()),
            },
            Ok(n) => NodeGpus {
                devices: (0..n.min(MAX_DEVICES as u32))
                    .map(|i| i.to_string())
                    .collect(),
                source: Source::Nvml,
            },
            Err(why) => NodeGpus {
                devices: Vec::new(),
                source: Source::None(why),
            },
        },
    }
}

/// CUDA_VISIBLE_DEVICES as a list of devices: indices, UUIDs (GPU-..., MIG-...), each
/// once ("0,0" is one device; CUDA itself will not open a device twice). "NoDevFiles",
/// which Slurm sets in a step without GPUs, means none. At most [`MAX_DEVICES`].
pub fn parse_visible_devices(v: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for d in v.split(',').map(str::trim) {
        if d.is_empty() || d == "NoDevFiles" || out.iter().any(|o| o == d) {
            continue;
        }
        if out.len() == MAX_DEVICES {
            break;
        }
        out.push(d.to_string());
    }
    out
}

/// NVML's device count, or why there is none ("no GPUs here" in either case).
fn nvml_count() -> Result<u32, String> {
    let nvml = nvml_wrapper::Nvml::init().map_err(nvml_why)?;
    nvml.device_count()
        .map_err(|e| format!("NVML cannot count the devices: {e}"))
}

fn nvml_why(e: nvml_wrapper::error::NvmlError) -> String {
    use nvml_wrapper::error::NvmlError as E;
    match e {
        E::LibloadingError(e) => {
            format!("no NVML library (libnvidia-ml.so.1 could not be loaded: {e})")
        }
        E::DriverNotLoaded => "NVML: the NVIDIA driver is not loaded".into(),
        e => format!("NVML failed: {e}"),
    }
}

/// What `bft-run --probe-gpus` prints: what NVML finds (each device's index, name,
/// UUID and memory), CUDA_VISIBLE_DEVICES, and how many workers a node starts by
/// default. The second value: how many devices NVML found.
pub fn probe_report() -> (String, u32) {
    use std::fmt::Write;
    let mut s = String::new();
    let mut found = 0;
    match nvml_wrapper::Nvml::init() {
        Err(e) => {
            let _ = writeln!(s, "NVML: unavailable: {}", nvml_why(e));
        }
        Ok(nvml) => {
            let driver = nvml
                .sys_driver_version()
                .unwrap_or_else(|e| format!("? ({e})"));
            match nvml.device_count() {
                Err(e) => {
                    let _ = writeln!(s, "NVML: driver {driver}; cannot count the devices: {e}");
                }
                Ok(n) => {
                    found = n;
                    let _ = writeln!(s, "NVML: driver {driver}, {n} device(s)");
                    for i in 0..n {
                        match nvml.device_by_index(i) {
                            Ok(d) => {
                                let name = d.name().unwrap_or_else(|e| format!("? ({e})"));
                                let uuid = d.uuid().unwrap_or_else(|e| format!("? ({e})"));
                                let mem = d
                                    .memory_info()
                                    .map(|m| format!("{} MiB", m.total >> 20))
                                    .unwrap_or_else(|e| format!("? ({e})"));
                                let _ = writeln!(s, "  GPU {i}: {name}, {uuid}, {mem}");
                            }
                            Err(e) => {
                                let _ = writeln!(s, "  GPU {i}: cannot open it: {e}");
                            }
                        }
                    }
                }
            }
        }
    }
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let _ = writeln!(
        s,
        "CUDA_VISIBLE_DEVICES: {}",
        visible
            .as_deref()
            .map_or("unset".to_string(), |v| format!("{v:?}"))
    );
    let g = from_env(visible.as_deref(), nvml_count);
    let _ = match &g.source {
        Source::None(why) => writeln!(s, "workers per node by default: 1 (no GPUs: {why})"),
        Source::Visible => writeln!(
            s,
            "workers per node by default: {} (one per device of CUDA_VISIBLE_DEVICES: {})",
            g.devices.len(),
            g.devices.join(",")
        ),
        Source::Nvml => writeln!(
            s,
            "workers per node by default: {} (one per device NVML finds)",
            g.devices.len()
        ),
    };
    (s, found)
}

/// The GPUs the agents' job step asks for on each node: all the job holds on the
/// batch node (SLURM_GPUS_ON_NODE), so that the agents see what the batch script sees
/// and the coordinator counts. Without it, a step gets only the GPUs the job asked for
/// in so many words: none of those an exclusive node adds (the batch script sees 4, the
/// step 2 or none), and one per node for a job that asked `--gpus-per-task=1`
/// (measured on the test cluster with stand-in GPUs, Slurm 22.05). None when the job
/// holds no GPU or the value is not a count.
pub fn step_gpus(gpus_on_node: Option<&str>) -> Option<u32> {
    let v = gpus_on_node?.trim();
    if v.is_empty() || v.len() > 4 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_DEVICES as u32).contains(n))
}

/// Variables that the agents' job step does not inherit from the batch script's
/// environment (srun reads them as its options): each asks for fewer GPUs than the job
/// holds (`SLURM_STEP_GRES=none`: none at all), or binds the step's one task per node
/// to some of them. With the step's own `--gres` (above) Slurm 22.05 gives it every
/// GPU even with them set (tests/cluster_gpus.rs); they are removed all the same, so
/// that no release's srun combines them with the step's own options, and for a job
/// without SLURM_GPUS_ON_NODE.
pub const STEP_NARROWING_VARS: &[&str] = &[
    "SLURM_GPUS",
    "SLURM_GPUS_PER_NODE",
    "SLURM_GPUS_PER_SOCKET",
    "SLURM_GPUS_PER_TASK",
    "SLURM_GRES",
    "SLURM_STEP_GRES",
    "SLURM_TRES_PER_TASK",
    "SLURM_GPU_BIND",
    // From 24.11 sbatch also exports --gpu-bind as --tres-bind, which srun reads (on
    // 26.05 it bound the step's one task to one GPU: the agent saw 1 of 4).
    "SLURM_TRES_BIND",
    "SLURM_CPUS_PER_GPU",
    "SLURM_NTASKS_PER_GPU",
    "SLURM_MEM_PER_GPU",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_devices_lists() {
        assert_eq!(parse_visible_devices("0,1, 3"), vec!["0", "1", "3"]);
        assert_eq!(parse_visible_devices("GPU-a1b2"), vec!["GPU-a1b2"]);
        assert_eq!(parse_visible_devices("MIG-1,MIG-2"), vec!["MIG-1", "MIG-2"]);
        assert!(parse_visible_devices("").is_empty());
        assert!(parse_visible_devices("NoDevFiles").is_empty());
        assert_eq!(parse_visible_devices("0,0,1,0"), vec!["0", "1"]);
        let many: Vec<String> = (0..10_000).map(|i| i.to_string()).collect();
        assert_eq!(parse_visible_devices(&many.join(",")).len(), MAX_DEVICES);
    }

    #[test]
    fn the_agents_step_asks_for_the_gpus_the_job_holds_on_a_node() {
        assert_eq!(step_gpus(Some("4")), Some(4));
        assert_eq!(step_gpus(Some("128")), Some(128));
        for bad in ["", "0", "129", "-1", "4x", "1e3", "99999999999", " "] {
            assert_eq!(step_gpus(Some(bad)), None, "{bad:?}");
        }
        assert_eq!(step_gpus(None), None);
    }

    #[test]
    fn slurms_binding_comes_first_then_nvml() {
        let never =
            || -> Result<u32, String> { panic!("NVML asked although CUDA_VISIBLE_DEVICES is set") };
        let g = from_env(Some("2,3"), never);
        assert_eq!(
            (g.devices, g.source),
            (vec!["2".into(), "3".into()], Source::Visible)
        );
        let g = from_env(Some("NoDevFiles"), never);
        assert!(g.devices.is_empty());
        assert_eq!(
            g.source,
            Source::None("CUDA_VISIBLE_DEVICES is \"NoDevFiles\"".into())
        );
        let g = from_env(None, || Ok(4));
        assert_eq!((g.devices.len(), g.source), (4, Source::Nvml));
        let g = from_env(None, || Ok(0));
        assert!(g.devices.is_empty() && matches!(g.source, Source::None(_)));
        let g = from_env(None, || Err("no NVML library".into()));
        assert_eq!(g.source, Source::None("no NVML library".into()));
    }

    #[test]
    fn without_the_nvml_library_there_are_no_gpus_and_it_says_why() {
        // This machine has no NVIDIA driver; where it has one, NVML answers instead.
        if std::path::Path::new("/dev/nvidiactl").exists() {
            eprintln!("SKIPPED: this machine has an NVIDIA driver");
            return;
        }
        let g = from_env(None, nvml_count);
        assert!(g.devices.is_empty(), "{g:?}");
        let Source::None(why) = g.source else {
            panic!("{g:?}")
        };
        assert!(
            why.contains("NVML") || why.contains("libnvidia-ml"),
            "{why}"
        );
        let (report, found) = probe_report();
        assert_eq!(found, 0);
        assert!(report.starts_with("NVML: unavailable: "), "{report}");
    }
}
