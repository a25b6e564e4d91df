//! Elastic job files in the format of BFTrainer's replayer (`jobs-*.csv`): one job per
//! row with its node range, rescale costs, work and throughput/objective curves, and
//! optionally what it asks of each node (columns after the ten of BFTrainer's format).

use super::Lines;
use crate::alloc::Curve;
use crate::error::Result;
use crate::placement::{Gpus, Needs};
use crate::sim::nodes::{check_constraint, check_name, gpu_count, mem_mb};
use crate::timefmt::parse_time;
use std::io::BufRead;

pub const JOBS_HEADER: &str = "id,submit,min_nodes,max_nodes,scale_up_s,scale_down_s,total_samples,curve_nodes,curve_samples_per_s,curve_objective";

/// Optional columns after [`JOBS_HEADER`]'s, in any order: what a job asks of each of
/// its nodes, as bftrainerd reads it from Slurm (`--gpus-per-node`, its GPU type,
/// `--constraint`, `--mem`). An empty cell asks nothing.
pub const NEEDS_COLUMNS: [&str; 4] = ["gpus_per_node", "gpu_type", "constraint", "mem_per_node"];

/// One elastic training job of a job file.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    pub name: String,
    /// Unix seconds.
    pub submit: i64,
    pub min_nodes: u32,
    pub max_nodes: u32,
    pub scale_up_s: f64,
    pub scale_down_s: f64,
    /// The job is done after this many samples.
    pub total_samples: f64,
    /// Samples per second against node count.
    pub rate: Curve,
    /// What the allocator maximises (samples/s or speed-up).
    pub objective: Curve,
    /// The owner (per-user caps) and admission priority, as `ElasticSpec`'s; job files
    /// have no columns for them (no owner, priority 0: admission in submit order).
    pub user: Option<u32>,
    pub priority: u32,
    /// What the job asks of each node (the optional columns); empty: any node.
    pub needs: Needs,
}

/// Parses a job file; rows are returned sorted by submit time (stable, so file order
/// breaks ties, as the original replayer admits in submit order).
pub fn parse_jobs<R: BufRead>(reader: R, what: &str) -> Result<Vec<JobRecord>> {
    let mut lines = Lines::new(reader, what);
    if !lines.advance()? {
        return Err(lines.err(format!("empty input: expected header {JOBS_HEADER:?}")));
    }
    let header = lines.buf.trim().to_string();
    let extra = match header.strip_prefix(JOBS_HEADER) {
        Some("") => "",
        Some(rest) if rest.starts_with(',') => &rest[1..],
        _ => {
            return Err(lines.err(format!(
            "expected header {JOBS_HEADER:?} (optionally followed by columns of {}), found {:?}",
            NEEDS_COLUMNS.join(", "),
            lines.buf
        )))
        }
    };
    // Per optional column, which of NEEDS_COLUMNS it is.
    let mut cols: Vec<usize> = Vec::new();
    for c in extra.split(',').filter(|_| !extra.is_empty()) {
        let c = c.trim();
        let Some(k) = NEEDS_COLUMNS.iter().position(|&n| n == c) else {
            return Err(lines.err(format!(
                "unknown column {c:?}; the columns after {JOBS_HEADER:?} may be: {}",
                NEEDS_COLUMNS.join(", ")
            )));
        };
        if cols.contains(&k) {
            return Err(lines.err(format!("column {c:?} appears twice")));
        }
        cols.push(k);
    }
    let width = 10 + cols.len();
    let mut out = Vec::new();
    let mut names = std::collections::HashSet::new();
    while lines.advance()? {
        let line = lines.buf.as_str();
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != width {
            let hint = if cols.contains(&2) && f.len() > width {
                " (a constraint's AND is '&' in a job file: ',' separates the fields)"
            } else {
                ""
            };
            return Err(lines.err(format!(
                "expected {width} comma-separated fields ({header}), found {}{hint}",
                f.len()
            )));
        }
        let rec = (|| -> std::result::Result<JobRecord, String> {
            let int = |i: usize, name: &str| {
                f[i].parse::<u32>()
                    .map_err(|_| format!("{name} must be a non-negative integer, found {:?}", f[i]))
            };
            let num = |i: usize, name: &str| match f[i].parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
                _ => Err(format!(
                    "{name} must be a finite number >= 0, found {:?}",
                    f[i]
                )),
            };
            if f[0].is_empty() {
                return Err("empty job id".into());
            }
            let submit = parse_time(f[1])?;
            let (min_nodes, max_nodes) = (int(2, "min_nodes")?, int(3, "max_nodes")?);
            if min_nodes == 0 || max_nodes < min_nodes {
                return Err(format!(
                    "need 1 <= min_nodes <= max_nodes, found {min_nodes}..{max_nodes}"
                ));
            }
            let total_samples = num(6, "total_samples")?;
            if total_samples <= 0.0 {
                return Err("total_samples must be > 0".into());
            }
            let nodes: Vec<u32> = f[7]
                .split_whitespace()
                .map(|s| {
                    s.parse::<u32>()
                        .map_err(|_| format!("curve_nodes: {s:?} is not a node count"))
                })
                .collect::<Result<_, _>>()?;
            let rate = curve(&nodes, f[8], "curve_samples_per_s")?;
            let objective = curve(&nodes, f[9], "curve_objective")?;
            Ok(JobRecord {
                name: f[0].to_string(),
                submit,
                min_nodes,
                max_nodes,
                scale_up_s: num(4, "scale_up_s")?,
                scale_down_s: num(5, "scale_down_s")?,
                total_samples,
                rate,
                objective,
                user: None,
                priority: 0,
                needs: needs(&cols, &f[10..])?,
            })
        })()
        .map_err(|m| lines.err(m))?;
        if !names.insert(rec.name.clone()) {
            return Err(lines.err(format!("duplicate job id {}", rec.name)));
        }
        out.push(rec);
    }
    out.sort_by_key(|j| j.submit);
    Ok(out)
}

/// A row's request columns (`cols[i]` names `cells[i]`).
fn needs(cols: &[usize], cells: &[&str]) -> std::result::Result<Needs, String> {
    let mut n = Needs::default();
    let (mut count, mut typ) = (None, None);
    for (&k, &v) in cols.iter().zip(cells) {
        if v.is_empty() {
            continue;
        }
        let col = NEEDS_COLUMNS[k];
        match k {
            0 => count = Some(gpu_count(v).map_err(|m| format!("{col}: {m}"))?),
            1 => {
                check_name(v).map_err(|m| format!("{col}: {m}"))?;
                typ = Some(v.to_string());
            }
            2 => {
                check_constraint(v).map_err(|m| format!("{col}: {m}"))?;
                n.constraint = Some(v.to_string());
            }
            _ => n.mem_mb = Some(mem_mb(v).map_err(|m| format!("{col}: {m}"))?),
        }
    }
    n.gpus = match (count, typ) {
        (Some(count), typ) => Some(Gpus { typ, count }),
        (None, Some(t)) => {
            return Err(format!(
                "gpu_type: {t} given without gpus_per_node (how many {t} GPUs per node?)"
            ))
        }
        (None, None) => None,
    };
    Ok(n)
}

/// Builds a curve from the node list and a value list; a leading (0, 0) point is
/// dropped because O(0) = 0 by definition.
fn curve(nodes: &[u32], values: &str, col: &str) -> std::result::Result<Curve, String> {
    let vals: Vec<f64> = values
        .split_whitespace()
        .map(|s| match s.parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
            _ => Err(format!("{col}: {s:?} is not a finite number >= 0")),
        })
        .collect::<Result<_, _>>()?;
    if vals.len() != nodes.len() {
        return Err(format!(
            "{col} has {} values but curve_nodes has {}",
            vals.len(),
            nodes.len()
        ));
    }
    let mut points = Vec::with_capacity(nodes.len());
    for (i, (&n, &v)) in nodes.iter().zip(&vals).enumerate() {
        if i > 0 && n <= nodes[i - 1] {
            return Err(format!(
                "curve_nodes must be strictly increasing, found {} then {n}",
                nodes[i - 1]
            ));
        }
        if n == 0 {
            if v != 0.0 {
                return Err(format!("{col}: the value at 0 nodes must be 0, found {v}"));
            }
            continue;
        }
        points.push((n, v));
    }
    match points.first() {
        Some((1, _)) => Ok(Curve { points }),
        Some((n, _)) => Err(format!(
            "curve_nodes must include 1 node (the first point is {n})"
        )),
        None => Err("curve_nodes has no point above 0 nodes".into()),
    }
}

/// Value of a piecewise-linear curve at `n` nodes: 0 at 0, linear between points,
/// constant past the last point.
pub fn curve_at(c: &Curve, n: u32) -> f64 {
    if n == 0 {
        return 0.0;
    }
    let p = &c.points;
    match p.binary_search_by_key(&n, |&(k, _)| k) {
        Ok(i) => p[i].1,
        Err(0) => p[0].1 * f64::from(n) / f64::from(p[0].0),
        Err(i) if i == p.len() => p[i - 1].1,
        Err(i) => {
            let ((n0, v0), (n1, v1)) = (p[i - 1], p[i]);
            v0 + (v1 - v0) * f64::from(n - n0) / f64::from(n1 - n0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(rest: &str) -> String {
        format!("{JOBS_HEADER}\n{rest}\n")
    }

    #[test]
    fn parses_and_interpolates() {
        let j = parse_jobs(
            row("J1,2021-02-10T20:21:15,1,64,18,12,1000,0 1 2 4,0 10 15 40,0 1 1.5 4").as_bytes(),
            "j",
        )
        .unwrap();
        assert_eq!(j.len(), 1);
        let c = &j[0].rate;
        assert_eq!(c.points, vec![(1, 10.0), (2, 15.0), (4, 40.0)]);
        assert_eq!(curve_at(c, 0), 0.0);
        assert_eq!(curve_at(c, 3), 27.5);
        assert_eq!(curve_at(c, 64), 40.0);
        assert_eq!(j[0].objective.points[2], (4, 4.0));
    }

    #[test]
    fn rejects_bad_rows() {
        let e = |r: &str| {
            parse_jobs(row(r).as_bytes(), "j.csv")
                .unwrap_err()
                .to_string()
        };
        assert!(e("J1,2021-02-10T20:21:15,0,64,18,12,1000,0 1,0 1,0 1")
            .starts_with("j.csv:2: need 1 <= min_nodes"));
        assert!(e("J1,2021-02-10T20:21:15,1,64,18,12,1000,0 1 2,0 1,0 1 2")
            .contains("curve_samples_per_s has 2 values"));
        assert!(
            e("J1,2021-02-10T20:21:15,1,64,18,12,1000,0 2 1,0 1 2,0 1 2")
                .contains("strictly increasing")
        );
        assert!(e("J1,yesterday,1,64,18,12,1000,0 1,0 1,0 1").contains("bad timestamp"));
        assert!(
            e("J1,2021-02-10T20:21:15,1,64,18,12").contains("expected 10 comma-separated fields")
        );
    }

    #[test]
    fn request_columns() {
        let h = format!("{JOBS_HEADER},gpus_per_node,gpu_type,constraint,mem_per_node");
        let rows = |r: &str| format!("{h}\n{r}\n");
        let base = "2021-02-10T20:21:15,1,4,18,12,1000,0 1,0 1,0 1";
        let j = parse_jobs(
            rows(&format!(
                "G,{base},4,a100,ib&(rack1|rack2),512G\nC,{base},,,,\nM,{base},2,,,64000"
            ))
            .as_bytes(),
            "j",
        )
        .unwrap();
        assert_eq!(
            j[0].needs,
            Needs {
                constraint: Some("ib&(rack1|rack2)".into()),
                gpus: Some(Gpus {
                    typ: Some("a100".into()),
                    count: 4
                }),
                mem_mb: Some(512 * 1024),
            }
        );
        assert!(j[1].needs.is_empty());
        assert_eq!(
            j[2].needs.gpus,
            Some(Gpus {
                typ: None,
                count: 2
            })
        );
        assert_eq!(j[2].needs.mem_mb, Some(64000));
        // Any subset of the columns, in any order.
        let j = parse_jobs(
            format!("{JOBS_HEADER},mem_per_node,gpus_per_node\nX,{base},1G,8\n").as_bytes(),
            "j",
        )
        .unwrap();
        assert_eq!(j[0].needs.mem_mb, Some(1024));
        assert_eq!(j[0].needs.gpus.as_ref().unwrap().count, 8);
        // The plain format still reads, and asks nothing.
        let j = parse_jobs(row(&format!("P,{base}")).as_bytes(), "j").unwrap();
        assert!(j[0].needs.is_empty());
    }

    #[test]
    fn bad_request_columns_are_named() {
        let h = format!("{JOBS_HEADER},gpus_per_node,gpu_type,constraint,mem_per_node");
        let base = "2021-02-10T20:21:15,1,4,18,12,1000,0 1,0 1,0 1";
        let e = |r: &str| {
            parse_jobs(format!("{h}\nJ,{base},{r}\n").as_bytes(), "j.csv")
                .unwrap_err()
                .to_string()
        };
        assert!(e("-2,a100,,").contains("j.csv:2: gpus_per_node: '-2' is not a GPU count"));
        assert!(e("0,,,").contains("gpus_per_node: '0' is not a GPU count"));
        assert!(e("1.5,,,").contains("is not a GPU count"));
        assert!(e(",a100,,").contains("gpu_type: a100 given without gpus_per_node"));
        assert!(e("1,a 100,,").contains("gpu_type: 'a 100': ' ' is not allowed"));
        assert!(
            e("1,,a&&b,").contains("constraint: constraint 'a&&b'"),
            "{}",
            e("1,,a&&b,")
        );
        assert!(e("1,,(ib,").contains("constraint: constraint '(ib'"));
        assert!(e("1,,,-5G").contains("mem_per_node: '-5G' is not a memory size"));
        assert!(e("1,,,lots").contains("mem_per_node: 'lots' is not a memory size"));
        // A ',' inside a constraint splits the row: the error says to use '&'.
        assert!(e("1,,a,b,1G").contains("a constraint's AND is '&'"));
        let he = |hdr: &str| {
            parse_jobs(format!("{hdr}\n").as_bytes(), "j.csv")
                .unwrap_err()
                .to_string()
        };
        assert!(he(&format!("{JOBS_HEADER},gpus"))
            .contains("unknown column \"gpus\"; the columns after"));
        assert!(he(&format!("{JOBS_HEADER},gpu_type,gpu_type")).contains("appears twice"));
        assert!(he(&format!("{JOBS_HEADER}x")).contains("expected header"));
    }
}
