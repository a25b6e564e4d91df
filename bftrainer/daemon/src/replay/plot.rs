//! SVG plots of a replay (plotters, SVG backend only): idle vs harvested nodes, node
//! count per job, cumulative samples, all against hours since the window's start.

use bftrainer_core::sim::Outcome;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Most points drawn per series; longer series keep every k-th point (and the last).
const MAX_POINTS: usize = 4000;

fn thin<T: Copy>(v: &[T]) -> Vec<T> {
    if v.len() <= MAX_POINTS {
        return v.to_vec();
    }
    let k = v.len().div_ceil(MAX_POINTS);
    let mut out: Vec<T> = v.iter().step_by(k).copied().collect();
    out.push(*v.last().expect("non-empty"));
    out
}

/// A step function (value holds until the next point) as line points.
fn steps(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, &(x, y)) in points.iter().enumerate() {
        if i > 0 {
            out.push((x, points[i - 1].1));
        }
        out.push((x, y));
    }
    out
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plotting failed: {e}")
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The frame all three plots share: white canvas, caption, hours on x, `y_desc` on y.
fn frame<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    caption: &str,
    x_max: f64,
    y_max: f64,
    y_desc: &str,
) -> anyhow::Result<Chart<'a, 'b>> {
    root.fill(&WHITE).map_err(err)?;
    let mut c = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(err)?;
    c.configure_mesh()
        .x_desc("hours since start")
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    Ok(c)
}

/// Writes the three plots into `dir`; returns their paths.
pub fn write_all(dir: &Path, out: &Outcome, t0: f64) -> anyhow::Result<Vec<PathBuf>> {
    let h = |t: f64| (t - t0) / 3600.0;
    let x_max = out
        .steps
        .last()
        .map_or(1.0, |s| h(s.t))
        .max(out.report.hours)
        .max(1e-3);
    let mut files = Vec::new();

    let idle: Vec<(f64, f64)> = thin(
        &out.steps
            .iter()
            .map(|s| (h(s.t), f64::from(s.idle_nodes)))
            .collect::<Vec<_>>(),
    );
    let harv: Vec<(f64, f64)> = thin(
        &out.steps
            .iter()
            .map(|s| (h(s.t), f64::from(s.harvested_nodes)))
            .collect::<Vec<_>>(),
    );
    let y_max = idle.iter().map(|p| p.1).fold(1.0, f64::max) * 1.05;
    let p = dir.join("idle_vs_harvested.svg");
    {
        let root = SVGBackend::new(&p, (1100, 500)).into_drawing_area();
        let mut c = frame(&root, "Idle and harvested nodes", x_max, y_max, "nodes")?;
        c.draw_series(LineSeries::new(steps(&idle), BLUE.stroke_width(1)))
            .map_err(err)?
            .label("idle (main scheduler)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        c.draw_series(LineSeries::new(steps(&harv), RED.stroke_width(1)))
            .map_err(err)?
            .label("harvested by elastic jobs")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        c.configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    files.push(p);

    let p = dir.join("nodes_per_job.svg");
    {
        let n_jobs = out.sizes.iter().map(|s| s.job + 1).max().unwrap_or(0) as usize;
        let mut per_job: Vec<Vec<(f64, f64)>> = vec![Vec::new(); n_jobs];
        for s in &out.sizes {
            per_job[s.job as usize].push((h(s.t), f64::from(s.nodes)));
        }
        let y_max = out.sizes.iter().map(|s| s.nodes).max().unwrap_or(1).max(1) as f64 * 1.05;
        let root = SVGBackend::new(&p, (1100, 500)).into_drawing_area();
        let caption = format!("Nodes per elastic job ({n_jobs} jobs)");
        let mut c = frame(&root, &caption, x_max, y_max, "nodes")?;
        for (j, pts) in per_job.iter().enumerate() {
            if pts.is_empty() {
                continue;
            }
            let color = Palette99::pick(j).to_rgba();
            c.draw_series(LineSeries::new(steps(&thin(pts)), color.stroke_width(1)))
                .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    files.push(p);

    let p = dir.join("cumulative_samples.svg");
    {
        let pts: Vec<(f64, f64)> = thin(
            &out.steps
                .iter()
                .map(|s| (h(s.t), s.samples.max(0.0) / 1e9))
                .collect::<Vec<_>>(),
        );
        let y_max = pts.iter().map(|p| p.1).fold(1e-9, f64::max) * 1.05;
        let root = SVGBackend::new(&p, (1100, 500)).into_drawing_area();
        let mut c = frame(
            &root,
            "Cumulative samples processed",
            x_max,
            y_max,
            "samples (billions)",
        )?;
        c.draw_series(LineSeries::new(pts, GREEN.stroke_width(2)))
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    files.push(p);
    Ok(files)
}
