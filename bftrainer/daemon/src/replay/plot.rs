//! Plots of a replay (plotters; SVG, PNG or both): idle vs harvested nodes, nodes per
//! job as a stacked area, cumulative samples, and the idle fragments by duration.

use anyhow::Context;
use bftrainer_core::sim::stack::{Stack, StackBuilder};
use bftrainer_core::sim::{Report, SizeRecord, StepRecord};
use bftrainer_core::trace::fragments::{FragmentCounter, Fragments};
use bftrainer_core::trace::{Head, NodeChange};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Most points drawn per line series; longer series keep every k-th point (and the last).
const MAX_POINTS: usize = 4000;
/// Most time intervals of the stacked area; longer replays are averaged into buckets.
pub const MAX_INTERVALS: usize = 1000;
const SIZE: (u32, u32) = (1100, 500);

/// Which files `--plots` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Svg,
    Png,
    Both,
}

impl Format {
    fn extensions(self) -> &'static [&'static str] {
        match self {
            Format::Svg => &["svg"],
            Format::Png => &["png"],
            Format::Both => &["svg", "png"],
        }
    }
}

impl std::str::FromStr for Format {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "svg" => Ok(Format::Svg),
            "png" => Ok(Format::Png),
            "both" => Ok(Format::Both),
            _ => anyhow::bail!(
                "--plot-format: '{s}' is not a plot format; expected svg, png or both"
            ),
        }
    }
}

/// Where a TrueType font for the plots' text is looked for, after `BFTRAINER_PLOT_FONT`.
const FONTS: [&str; 6] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];

/// Registers the plots' font once (plotters lays out text with it, in SVG as in PNG).
pub(super) fn font() -> anyhow::Result<()> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let env = std::env::var_os("BFTRAINER_PLOT_FONT").map(PathBuf::from);
        let candidates: Vec<PathBuf> = match &env {
            Some(p) => vec![p.clone()],
            None => FONTS.iter().map(PathBuf::from).collect(),
        };
        for p in &candidates {
            let Ok(bytes) = std::fs::read(p) else {
                continue;
            };
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            return plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("{}: not a TrueType/OpenType font", p.display()));
        }
        Err(match env {
            Some(p) => format!("BFTRAINER_PLOT_FONT={}: cannot read the font", p.display()),
            None => format!(
                "the plots need a TrueType font for their text and none was found ({}); \
                 install fonts-dejavu-core (Debian, Ubuntu) or dejavu-sans-fonts (RHEL), \
                 or set BFTRAINER_PLOT_FONT=/path/to/font.ttf",
                FONTS.join(", ")
            ),
        })
    })
    .clone()
    .map_err(|m| anyhow::anyhow!(m))
}

/// Every k-th of a series and its last point, at most `MAX_POINTS + 1`, kept as the
/// series comes: k doubles (and every other point kept goes) whenever more are kept.
struct Thin<T> {
    k: usize,
    n: usize,
    kept: Vec<T>,
    last: Option<T>,
}

impl<T: Copy> Thin<T> {
    fn new() -> Self {
        Self {
            k: 1,
            n: 0,
            kept: Vec::new(),
            last: None,
        }
    }

    fn push(&mut self, x: T) {
        if self.n % self.k == 0 {
            self.kept.push(x);
            if self.kept.len() > MAX_POINTS {
                self.kept = self.kept.iter().step_by(2).copied().collect();
                self.k *= 2;
            }
        }
        self.n += 1;
        self.last = Some(x);
    }

    fn finish(mut self) -> Vec<T> {
        if let Some(x) = self.last.filter(|_| (self.n - 1) % self.k != 0) {
            self.kept.push(x);
        }
        self.kept
    }
}

/// One step as the line plots show it.
#[derive(Clone, Copy)]
struct Point {
    t: f64,
    idle: u32,
    harvested: u32,
    samples: f64,
}

/// What the plots need of a replay, gathered as its records come, in memory bounded by
/// the plots' resolution (not by the replay's length): the step series thinned, the
/// stacked nodes per job bucketed, the idle fragments counted by length as the replay
/// takes the trace's changes.
pub struct PlotData {
    t0: f64,
    hours: f64,
    points: Thin<Point>,
    stack: StackBuilder,
    fragments: Option<FragmentCounter>,
}

impl PlotData {
    /// The plots of a replay of the window `[start, end]` (Unix seconds).
    pub fn new(start: i64, end: i64) -> Self {
        Self {
            t0: start as f64,
            hours: (end - start) as f64 / 3600.0,
            points: Thin::new(),
            stack: StackBuilder::new(end as f64, MAX_INTERVALS),
            fragments: None,
        }
    }

    pub fn trace_head(&mut self, head: Head<'_>) {
        self.fragments = Some(FragmentCounter::new(head));
    }

    pub fn change(&mut self, c: &NodeChange) {
        if let Some(f) = &mut self.fragments {
            f.change(c);
        }
    }

    pub fn step(&mut self, s: &StepRecord) {
        self.points.push(Point {
            t: s.t,
            idle: s.idle_nodes,
            harvested: s.harvested_nodes,
            samples: s.samples,
        });
        self.stack.step(s.t, s.harvested_nodes);
    }

    pub fn size(&mut self, s: &SizeRecord) {
        self.stack.size(s);
    }
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

type Chart<'a, DB> = ChartContext<
    'a,
    DB,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The frame the time plots share: white canvas, caption, hours on x, `y_desc` on y.
fn frame<'a, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    caption: &str,
    x_max: f64,
    y_max: f64,
    y_desc: &str,
) -> anyhow::Result<Chart<'a, DB>>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let mut c = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(err)?;
    let whole = |v: &f64| {
        if y_max >= 20.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    };
    c.configure_mesh()
        .x_desc("hours since start")
        .y_desc(y_desc)
        .y_label_formatter(&whole)
        .draw()
        .map_err(err)?;
    Ok(c)
}

/// One figure, drawable on any plotters backend.
trait Figure {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static;
}

/// Writes `fig` as `dir/stem.svg` and/or `dir/stem.png`.
fn emit(
    dir: &Path,
    stem: &str,
    format: Format,
    fig: &impl Figure,
    files: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    for ext in format.extensions() {
        let p = dir.join(format!("{stem}.{ext}"));
        if *ext == "svg" {
            let root = SVGBackend::new(&p, SIZE).into_drawing_area();
            fig.draw(&root)?;
            root.present().map_err(err)?;
        } else {
            let root = BitMapBackend::new(&p, SIZE).into_drawing_area();
            fig.draw(&root)?;
            root.present()
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", p.display()))?;
        }
        files.push(p);
    }
    Ok(())
}

struct IdleHarvested {
    idle: Vec<(f64, f64)>,
    harv: Vec<(f64, f64)>,
    x_max: f64,
}

impl Figure for IdleHarvested {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let y_max = self.idle.iter().map(|p| p.1).fold(1.0, f64::max) * 1.05;
        let mut c = frame(root, "Idle and harvested nodes", self.x_max, y_max, "nodes")?;
        c.draw_series(LineSeries::new(steps(&self.idle), BLUE.stroke_width(1)))
            .map_err(err)?
            .label("idle (main scheduler)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        c.draw_series(LineSeries::new(steps(&self.harv), RED.stroke_width(1)))
            .map_err(err)?
            .label("harvested by elastic jobs")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()
            .map_err(err)?;
        Ok(())
    }
}

/// Twelve distinct colours (Tableau's 10 and two more); neighbouring bands are
/// consecutive jobs, so they always differ.
const PALETTE: [(u8, u8, u8); 12] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
    (174, 199, 232),
    (255, 187, 120),
];

struct NodesPerJob {
    stack: Stack,
    t0: f64,
    x_max: f64,
}

impl Figure for NodesPerJob {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let s = &self.stack;
        let h = |t: f64| (t - self.t0) / 3600.0;
        let y_max = s
            .top
            .iter()
            .chain(&s.harvested)
            .copied()
            .fold(1.0, f64::max)
            * 1.05;
        let mut caption = format!(
            "Nodes per elastic job: {} jobs, one band each, stacked in submit order",
            s.bands.len()
        );
        if s.averaged {
            let w = (s.edges[s.edges.len() - 1] - s.edges[0]) / (s.edges.len() - 1) as f64;
            caption.push_str(&format!(
                " (mean over {} buckets)",
                if w < 120.0 {
                    format!("{w:.0} s")
                } else {
                    format!("{:.1} min", w / 60.0)
                }
            ));
        }
        let mut c = frame(root, &caption, self.x_max, y_max, "nodes")?;
        for b in &s.bands {
            let (r, g, bl) = PALETTE[b.job as usize % PALETTE.len()];
            let fill = RGBColor(r, g, bl).filled();
            // One polygon per run of consecutive intervals: the top edge left to right,
            // then the bottom edge back.
            let mut i = 0;
            while i < b.cells.len() {
                let mut k = i + 1;
                while k < b.cells.len() && b.cells[k].0 == b.cells[k - 1].0 + 1 {
                    k += 1;
                }
                let run = &b.cells[i..k];
                let mut pts = Vec::with_capacity(run.len() * 4);
                for &(o, _, top) in run {
                    pts.push((h(s.edges[o as usize]), top));
                    pts.push((h(s.edges[o as usize + 1]), top));
                }
                for &(o, bottom, _) in run.iter().rev() {
                    pts.push((h(s.edges[o as usize + 1]), bottom));
                    pts.push((h(s.edges[o as usize]), bottom));
                }
                c.draw_series(std::iter::once(Polygon::new(pts, fill)))
                    .map_err(err)?;
                i = k;
            }
        }
        let line: Vec<(f64, f64)> = s
            .harvested
            .iter()
            .enumerate()
            .flat_map(|(o, &v)| [(h(s.edges[o]), v), (h(s.edges[o + 1]), v)])
            .collect();
        c.draw_series(LineSeries::new(line, BLACK.stroke_width(1)))
            .map_err(err)?
            .label("harvested nodes (the bands' top)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()
            .map_err(err)?;
        Ok(())
    }
}

struct Samples {
    pts: Vec<(f64, f64)>,
    x_max: f64,
}

impl Figure for Samples {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let y_max = self.pts.iter().map(|p| p.1).fold(1e-9, f64::max) * 1.05;
        let mut c = frame(
            root,
            "Cumulative samples processed",
            self.x_max,
            y_max,
            "samples (billions)",
        )?;
        c.draw_series(LineSeries::new(self.pts.clone(), GREEN.stroke_width(2)))
            .map_err(err)?;
        Ok(())
    }
}

/// A whole number with thousands separators.
fn sep(v: f64) -> String {
    let s = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v <= -0.5 {
        out.insert(0, '-');
    }
    out
}

/// Minutes as "7.5 min" or "2.3 h".
fn minutes(s: f64) -> String {
    if s < 3600.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

struct FragmentHistogram {
    f: Fragments,
    hours: f64,
}

impl Figure for FragmentHistogram {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let f = &self.f;
        let n = f.buckets.len() as u32;
        let y_max = f.buckets.iter().map(|b| b.node_min).fold(1.0, f64::max) * 1.2;
        root.fill(&WHITE).map_err(err)?;
        let caption = format!(
            "Idle fragments by duration: {} fragments, {} node-hours over {:.1} h",
            sep(f.fragments as f64),
            sep(f.node_min / 60.0),
            self.hours
        );
        let mut c = ChartBuilder::on(root)
            .caption(caption, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d((0u32..n - 1).into_segmented(), 0f64..y_max)
            .map_err(err)?;
        let label = |v: &SegmentValue<u32>| match v {
            SegmentValue::CenterOf(i) => f
                .buckets
                .get(*i as usize)
                .map_or(String::new(), |b| b.label.to_string()),
            _ => String::new(),
        };
        c.configure_mesh()
            .disable_x_mesh()
            .x_labels(n as usize)
            .x_label_formatter(&label)
            .x_desc("length of the idle fragment (a node idle without a break)")
            .y_desc("node-minutes")
            .y_label_formatter(&|v| sep(*v))
            .draw()
            .map_err(err)?;
        c.draw_series(f.buckets.iter().enumerate().map(|(i, b)| {
            let i = i as u32;
            let mut r = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), b.node_min),
                ],
                RGBColor(31, 119, 180).filled(),
            );
            r.set_margin(0, 0, 8, 8);
            r
        }))
        .map_err(err)?;
        let total = f.node_min.max(1e-9);
        let centred = ("sans-serif", 13).into_font().color(&BLACK).pos(
            plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Center,
                plotters::style::text_anchor::VPos::Bottom,
            ),
        );
        c.draw_series(f.buckets.iter().enumerate().map(|(i, b)| {
            EmptyElement::at((SegmentValue::CenterOf(i as u32), b.node_min))
                + Text::new(
                    format!("{:.1}%", 100.0 * b.node_min / total),
                    (0, -20),
                    centred.clone(),
                )
                + Text::new(
                    format!("{} frag.", sep(b.fragments as f64)),
                    (0, -5),
                    centred.clone(),
                )
        }))
        .map_err(err)?;
        let note = format!(
            "median length {} (by count), {} (by node-minutes); fragments cut by the window: {} at its start, {} at its end, counted by their part inside it",
            f.median_s.map_or("-".into(), minutes),
            f.weighted_median_s.map_or("-".into(), minutes),
            f.clipped_at_start,
            f.clipped_at_end
        );
        root.draw(&Text::new(
            note,
            (100, 50),
            ("sans-serif", 13).into_font().color(&BLACK.mix(0.8)),
        ))
        .map_err(err)?;
        Ok(())
    }
}

/// Writes the four plots into `dir` in `format`; returns their paths.
pub fn write_all(
    dir: &Path,
    data: PlotData,
    report: &Report,
    format: Format,
) -> anyhow::Result<Vec<PathBuf>> {
    font()?;
    let t0 = data.t0;
    let h = |t: f64| (t - t0) / 3600.0;
    let points = data.points.finish();
    let x_max = points
        .last()
        .map_or(1.0, |p| h(p.t))
        .max(report.hours)
        .max(1e-3);
    let mut files = Vec::new();
    let series = |f: &dyn Fn(&Point) -> f64| -> Vec<(f64, f64)> {
        points.iter().map(|p| (h(p.t), f(p))).collect()
    };
    let fig = IdleHarvested {
        idle: series(&|p| f64::from(p.idle)),
        harv: series(&|p| f64::from(p.harvested)),
        x_max,
    };
    emit(dir, "idle_vs_harvested", format, &fig, &mut files)?;
    let fig = NodesPerJob {
        stack: data.stack.finish(),
        t0,
        x_max,
    };
    emit(dir, "nodes_per_job", format, &fig, &mut files)?;
    let fig = Samples {
        pts: series(&|p| p.samples.max(0.0) / 1e9),
        x_max,
    };
    emit(dir, "cumulative_samples", format, &fig, &mut files)?;
    let f = data
        .fragments
        .context("the replay handed the plots no trace")?
        .finish();
    let fig = FragmentHistogram {
        f,
        hours: data.hours,
    };
    emit(dir, "idle_fragments", format, &fig, &mut files)?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::replay_tests::opts;
    use crate::replay::{alloc_options, load, run, sim_config, Options};
    use bftrainer_core::alloc::Objective;
    use bftrainer_core::engine::Exact;
    use bftrainer_core::sim::stack::stack;
    use bftrainer_core::sim::Outcome;
    use bftrainer_core::sim::{simulate, Hooks};

    fn replay(o: &Options) -> (bftrainer_core::trace::NodeTrace, Outcome) {
        let l = load(o).unwrap();
        let cfg = bftrainer_core::sim::SimConfig {
            record: true,
            ..sim_config(o, Objective::Bftrainer)
        };
        let (mut c, mut p) = (|| 0.0, |_f: f64| {});
        let out = simulate(
            &l.trace().unwrap(),
            &l.jobs,
            Exact {
                opts: alloc_options(Objective::Bftrainer),
            },
            &cfg,
            &mut Hooks {
                clock: &mut c,
                progress: &mut p,
            },
        )
        .unwrap();
        (l.trace().unwrap(), out)
    }

    /// On a real replay (6 h of the sample, dozens of jobs): the stacked bands' top is
    /// the harvested node count at every step; averaged into buckets, it is the
    /// time-weighted mean of the harvested series over each bucket, computed here
    /// independently from the steps; with a grace time the bands also hold the nodes
    /// kept in grace, so the top is at least the harvested count.
    #[test]
    fn stacked_top_is_harvested_on_the_sample() {
        let (tr, out) = replay(&Options {
            hours: Some(6.0),
            ..opts()
        });
        let end = tr.end as f64;
        let s = stack(&out.sizes, &out.steps, end, usize::MAX);
        assert!(!s.averaged);
        assert!(s.bands.len() >= 20, "{} jobs", s.bands.len());
        let mut k = 0;
        for (i, st) in out.steps.iter().enumerate() {
            let next = out.steps.get(i + 1).map_or(end, |n| n.t);
            if next <= st.t {
                continue;
            }
            assert_eq!(s.edges[k], st.t);
            assert_eq!(s.top[k], f64::from(st.harvested_nodes), "at {}", st.t);
            k += 1;
        }
        assert_eq!(k, s.top.len());
        let n = 50;
        let a = stack(&out.sizes, &out.steps, end, n);
        assert!(a.averaged && a.top.len() == n);
        for o in 0..n {
            let (lo, hi) = (a.edges[o], a.edges[o + 1]);
            let mut area = 0.0;
            for (i, st) in out.steps.iter().enumerate() {
                let next = out.steps.get(i + 1).map_or(end, |x| x.t);
                let w = next.min(hi) - st.t.max(lo);
                if w > 0.0 {
                    area += w * f64::from(st.harvested_nodes);
                }
            }
            let mean = area / (hi - lo);
            assert!(
                (a.top[o] - mean).abs() < 1e-9 * mean.max(1.0),
                "bucket {o}: {} vs {mean}",
                a.top[o]
            );
            // Bands are stacked without gaps or overlaps.
            let mut cells: Vec<(f64, f64)> = a
                .bands
                .iter()
                .flat_map(|b| {
                    b.cells
                        .iter()
                        .filter(|c| c.0 as usize == o)
                        .map(|c| (c.1, c.2))
                })
                .collect();
            cells.sort_by(|x, y| x.0.total_cmp(&y.0));
            let mut y = 0.0;
            for (b, t) in cells {
                assert!((b - y).abs() < 1e-9 && t > b);
                y = t;
            }
            assert!((y - a.top[o]).abs() < 1e-9 * y.max(1.0));
        }
        let (_, g) = replay(&Options {
            hours: Some(6.0),
            grace: 120.0,
            ..opts()
        });
        let sg = stack(&g.sizes, &g.steps, end, usize::MAX);
        assert!(sg.top.iter().zip(&sg.harvested).all(|(t, h)| t >= h));
        assert!(sg.top.iter().zip(&sg.harvested).any(|(t, h)| t > h));
    }

    #[test]
    fn png_and_svg_are_written() {
        let dir = std::env::temp_dir().join(format!("bft-plots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        run(&Options {
            hours: Some(2.0),
            plots: Some(dir.clone()),
            plot_format: Format::Both,
            ..opts()
        })
        .unwrap();
        for stem in [
            "idle_vs_harvested",
            "nodes_per_job",
            "cumulative_samples",
            "idle_fragments",
        ] {
            let png = std::fs::read(dir.join(format!("{stem}.png"))).unwrap();
            assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{stem}.png");
            assert!(png.len() > 10_000, "{stem}.png: {} bytes", png.len());
            let svg = std::fs::read_to_string(dir.join(format!("{stem}.svg"))).unwrap();
            assert!(svg.starts_with("<svg"), "{stem}.svg");
        }
        let svg = std::fs::read_to_string(dir.join("nodes_per_job.svg")).unwrap();
        assert!(svg.contains("<polygon") && svg.contains("one band each"));
        let svg = std::fs::read_to_string(dir.join("idle_fragments.svg")).unwrap();
        assert!(svg.contains("10-30 min") && svg.contains("<rect"));
        std::fs::remove_dir_all(&dir).unwrap();
        // PNG alone writes no SVG.
        let dir = std::env::temp_dir().join(format!("bft-plots-png-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        run(&Options {
            hours: Some(1.0),
            plots: Some(dir.clone()),
            plot_format: Format::Png,
            ..opts()
        })
        .unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "cumulative_samples.png",
                "idle_fragments.png",
                "idle_vs_harvested.png",
                "nodes_per_job.png"
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn thousands() {
        assert_eq!(sep(2_345_678.4), "2,345,678");
        assert_eq!(sep(999.0), "999");
        assert_eq!(sep(0.0), "0");
    }

    #[test]
    fn plot_formats_parse_and_bad_ones_are_named() {
        assert_eq!("svg".parse::<Format>().unwrap(), Format::Svg);
        assert_eq!(
            "both".parse::<Format>().unwrap().extensions(),
            ["svg", "png"]
        );
        let e = "gif".parse::<Format>().unwrap_err().to_string();
        assert_eq!(
            e,
            "--plot-format: 'gif' is not a plot format; expected svg, png or both"
        );
    }
}
