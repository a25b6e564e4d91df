//! Seeded generator of realistic allocation instances for tests and benchmarks: the seven
//! ImageNet models measured on Summit (BFTrainer's public data), mid-run states.

use super::{BatchCurve, Curve, Instance, JobInput};

/// (name, scale-up s, scale-down s, samples/s at 1, 2, 4, ..., 64 nodes), from
/// data/bftrainer-summit/jobs-imagenet-imgps-1001.csv.
#[rustfmt::skip]
pub const MODELS: [(&str, f64, f64, [f64; 7]); 7] = [
    ("AlexNet",    17.788043, 11.273140, [7115.3, 13071.7, 21066.1, 40484.9, 74002.9, 130762.0, 202135.4]),
    ("vgg16",      17.533261, 11.295502, [1193.3,  2389.2,  4691.7,  9257.9, 18348.9,  36208.5,  70151.7]),
    ("resnet18",   18.722106, 11.030597, [5218.8, 10582.5, 20436.0, 39584.0, 78023.8, 144762.5, 262723.0]),
    ("DenseNet",   18.374654, 11.388841, [ 989.9,  1952.5,  3849.8,  7608.1, 14993.2,  28812.2,  57773.9]),
    ("mnasnet1",   17.005513, 11.538967, [3245.7,  6001.9, 11489.3, 23075.6, 43899.7,  83474.2, 160493.6]),
    ("shufflenet", 18.743675, 12.579700, [2831.0,  5259.0,  9988.0, 20379.2, 38895.3,  74125.1, 145081.5]),
    ("mobilenet",  18.642014, 12.549978, [3039.9,  5893.0, 11386.0, 22024.8, 42488.4,  82268.3, 155213.8]),
];

/// splitmix64: tiny, seeded, good enough to draw instances.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// What to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    pub n_nodes: u32,
    pub n_jobs: usize,
    pub seed: u64,
    /// Share of nodes with a predicted reclaim time (drawn in [0, 3 Tfwd)).
    pub reclaim_share: f64,
    /// Share of jobs that give per-batch-size curves instead of one curve.
    pub batch_share: f64,
    /// Event-driven state (the default): the jobs hold the optimum of the previous
    /// decision, then one event batch happened (2% of nodes reclaimed, 2% newly idle,
    /// maybe one job replaced). Otherwise a cold state: random current allocations.
    pub warm: bool,
    /// GPUs per node: above 1, the instance's units are GPU slots, `gpus_per_node` per
    /// host (`Instance::host_of`), and each job's curve, minimum and maximum are its
    /// node ones times that ([`slot_job`]). The event batch then happens per GPU: 2% of
    /// the GPUs are taken by regular jobs one by one (shared nodes), 2% come back as
    /// whole idle hosts.
    pub gpus_per_node: u32,
}

impl GenParams {
    pub fn new(n_nodes: u32, n_jobs: usize, seed: u64) -> Self {
        GenParams {
            n_nodes,
            n_jobs,
            seed,
            reclaim_share: 0.0,
            batch_share: 0.0,
            warm: true,
            gpus_per_node: 1,
        }
    }
}

/// The model's curve extended past 64 nodes up to `max` with 85% efficiency per
/// doubling (the measured curves flatten about so between 32 and 64).
fn model_curve(m: usize, max: u32, jitter: f64) -> Curve {
    let ys = MODELS[m].3;
    let mut pts: Vec<(u32, f64)> = Vec::new();
    let mut n = 1u32;
    let mut y = 0.0;
    for &v in &ys {
        if n > max {
            break;
        }
        y = v * jitter;
        pts.push((n, y));
        n *= 2;
    }
    while n <= max {
        y *= 2.0 * 0.85;
        pts.push((n, y));
        n *= 2;
    }
    if pts.last().map_or(0, |p| p.0) < max {
        let (x0, y0) = *pts.last().unwrap();
        pts.push((max, y0 * (1.0 + 0.85 * f64::from(max - x0) / f64::from(x0))));
    }
    Curve::new(pts)
}

/// A decision instance; see [`GenParams::warm`]. max_nodes from 8 up to the machine size.
pub fn generate(p: &GenParams) -> Instance {
    if p.gpus_per_node > 1 {
        return generate_slots(p);
    }
    let inst = generate_cold(p);
    if !p.warm {
        return inst;
    }
    let mut rng = Rng::new(p.seed ^ 0x5EED);
    let mut inst = inst;
    // One event batch: some nodes taken back by the main scheduler, some newly idle.
    let n = inst.n_nodes;
    let (_, next) = settle_and_take(&mut inst, &mut rng);
    let fresh = (n / 50).max(1);
    inst.n_nodes = next + fresh;
    if !inst.reclaim_in_s.is_empty() {
        for _ in 0..fresh {
            let r = rng.chance(p.reclaim_share).then(|| rng.unit() * 30.0);
            inst.reclaim_in_s.push(r);
        }
    }
    // Sometimes a job finished and a queued one arrives.
    if !inst.jobs.is_empty() && rng.chance(0.5) {
        let k = rng.below(inst.jobs.len() as u64) as usize;
        let mut q = p.clone();
        q.n_jobs = 1;
        q.seed = p.seed.wrapping_add(0xA11C);
        q.warm = false;
        let mut newcomer = generate_cold(&q).jobs.remove(0);
        newcomer.id = format!("{}-next", inst.jobs[k].id);
        newcomer.current.clear();
        inst.jobs[k] = newcomer;
    }
    inst
}

/// The event-driven instances' first half: each job given its optimal set, then 2% of
/// the units (at least one) taken by the main scheduler and dropped from the instance
/// (the jobs' sets and reclaim forecasts renumbered). Returns which old units went and
/// how many stay.
fn settle_and_take(inst: &mut Instance, rng: &mut Rng) -> (Vec<bool>, u32) {
    if let Ok(sol) = super::solve(inst, &super::Options::default()) {
        for (job, set) in inst.jobs.iter_mut().zip(sol.jobs) {
            job.current = set;
        }
    }
    let n = inst.n_nodes;
    let lost = (n / 50).max(1).min(n);
    let mut gone = vec![false; n as usize];
    for _ in 0..lost {
        gone[rng.below(u64::from(n)) as usize] = true;
    }
    let mut map = vec![u32::MAX; n as usize];
    let mut next = 0u32;
    for i in 0..n as usize {
        if !gone[i] {
            map[i] = next;
            next += 1;
        }
    }
    for job in &mut inst.jobs {
        job.current = job
            .current
            .iter()
            .filter(|&&i| !gone[i as usize])
            .map(|&i| map[i as usize])
            .collect();
    }
    if !inst.reclaim_in_s.is_empty() {
        inst.reclaim_in_s = (0..n as usize)
            .filter(|&i| !gone[i])
            .map(|i| inst.reclaim_in_s[i])
            .collect();
    }
    (gone, next)
}

fn generate_cold(p: &GenParams) -> Instance {
    let mut rng = Rng::new(p.seed);
    let n_nodes = p.n_nodes.max(1);
    let max_choices: Vec<u32> = [8u32, 16, 32, 64, 64, 64, 128, 256, 512, 1024, 4096]
        .into_iter()
        .map(|m| m.min(n_nodes))
        .collect();
    let mut jobs = Vec::with_capacity(p.n_jobs);
    for j in 0..p.n_jobs {
        let m = rng.below(MODELS.len() as u64) as usize;
        let max = if rng.chance(0.03) {
            n_nodes
        } else {
            max_choices[rng.below(max_choices.len() as u64) as usize]
        };
        let min = match rng.below(10) {
            0..=6 => 1,
            7 => 2,
            8 => 4,
            _ => 8,
        }
        .min(max);
        let jitter = 0.9 + 0.2 * rng.unit();
        let (_, up, down, _) = MODELS[m];
        let mut job = JobInput::new(
            &format!("J{j:05}-{}", MODELS[m].0),
            min,
            max,
            up * (0.9 + 0.2 * rng.unit()),
            down * (0.9 + 0.2 * rng.unit()),
            model_curve(m, max, jitter),
        );
        if rng.chance(p.batch_share) {
            // Larger batches scale better across nodes but cost per-sample efficiency on
            // few nodes: three allowed sizes whose curves cross.
            let base = job.curve.clone();
            job.curve = Curve::default();
            job.batch_curves = [(256u32, 1.0, 0.0), (512, 0.9, 0.08), (1024, 0.8, 0.16)]
                .into_iter()
                .map(|(b, scale, gain)| BatchCurve {
                    batch_size: b,
                    curve: Curve::new(
                        base.points
                            .iter()
                            .map(|&(x, y)| (x, y * scale * (1.0 + gain * f64::from(x).log2())))
                            .collect(),
                    ),
                })
                .collect();
            job.current_batch = Some(256);
        }
        job.remaining_work = Some(1e6 + rng.unit() * 1.3e8);
        jobs.push(job);
    }
    // Current allocation: ~85% of the nodes held, spread over ~80% of the jobs.
    let mut order: Vec<u32> = (0..n_nodes).collect();
    for i in (1..order.len()).rev() {
        let k = rng.below(i as u64 + 1) as usize;
        order.swap(i, k);
    }
    let mut next = 0usize;
    let held_target = (f64::from(n_nodes) * (0.7 + 0.25 * rng.unit())) as usize;
    for job in &mut jobs {
        if !rng.chance(0.8) || next >= held_target {
            continue;
        }
        let span = job.max_nodes - job.min_nodes + 1;
        let mut c = job.min_nodes + rng.below(u64::from(span)) as u32;
        if rng.chance(0.05) && job.min_nodes > 1 {
            c = job.min_nodes - 1; // cut below its minimum by a reclaim
        }
        let c = (c as usize).min(held_target - next);
        job.current = order[next..next + c].to_vec();
        job.current.sort_unstable();
        next += c;
    }
    let reclaim_in_s = if p.reclaim_share > 0.0 {
        (0..n_nodes)
            .map(|_| rng.chance(p.reclaim_share).then(|| rng.unit() * 30.0))
            .collect()
    } else {
        Vec::new()
    };
    Instance {
        t_fwd_s: 10.0,
        n_nodes,
        reclaim_in_s,
        host_of: Vec::new(),
        jobs,
    }
}

/// A job's curve in GPUs when its curve is in nodes of `k` GPUs: O_gpu(g) = O_node(g/k),
/// linear from 0 up to one node (the first point is at 1 GPU, as curves must start).
pub fn slot_curve(c: &Curve, k: u32) -> Curve {
    let mut pts = Vec::with_capacity(c.points.len() + 1);
    if let Some(&(1, y)) = c.points.first() {
        if k > 1 {
            pts.push((1, y / f64::from(k)));
        }
    }
    pts.extend(c.points.iter().map(|&(n, y)| (n.saturating_mul(k), y)));
    Curve::new(pts)
}

/// A job in GPU slots: curve, batch curves, minimum and maximum times `k`; each node it
/// holds becomes that node's `k` slots (node `i` is slots `i*k .. i*k+k`).
pub fn slot_job(job: &JobInput, k: u32) -> JobInput {
    let mut j = job.clone();
    j.min_nodes = job.min_nodes.saturating_mul(k);
    j.max_nodes = job.max_nodes.saturating_mul(k);
    j.curve = if job.curve.points.is_empty() {
        Curve::default()
    } else {
        slot_curve(&job.curve, k)
    };
    for b in &mut j.batch_curves {
        b.curve = slot_curve(&b.curve, k);
    }
    j.current = job
        .current
        .iter()
        .flat_map(|&i| (0..k).map(move |g| i * k + g))
        .collect();
    j
}

/// The whole-node instance of the same cluster in GPU slots: `k` slots per node, slots
/// of a node sharing its host and reclaim forecast.
pub fn to_slots(inst: &Instance, k: u32) -> Instance {
    let n = inst.n_nodes * k;
    Instance {
        t_fwd_s: inst.t_fwd_s,
        n_nodes: n,
        reclaim_in_s: inst
            .reclaim_in_s
            .iter()
            .flat_map(|&r| std::iter::repeat(r).take(k as usize))
            .collect(),
        host_of: (0..n).map(|u| u / k).collect(),
        jobs: inst.jobs.iter().map(|j| slot_job(j, k)).collect(),
    }
}

/// [`generate`] with GPU slots: the cold node instance in slots, then (event-driven)
/// its optimum as the current allocation and one event batch per GPU.
fn generate_slots(p: &GenParams) -> Instance {
    let k = p.gpus_per_node;
    let mut q = p.clone();
    q.gpus_per_node = 1;
    let mut inst = to_slots(&generate_cold(&q), k);
    if !p.warm {
        return inst;
    }
    let mut rng = Rng::new(p.seed ^ 0x5EED);
    // Regular jobs take 2% of the GPUs one by one: hosts left partly free.
    let n = inst.n_nodes;
    let (gone, next) = settle_and_take(&mut inst, &mut rng);
    inst.host_of = (0..n as usize)
        .filter(|&i| !gone[i])
        .map(|i| inst.host_of[i])
        .collect();
    // 2% come back as whole idle hosts.
    let hosts = n / k;
    let fresh = ((n / 50).max(1)).div_ceil(k);
    for h in 0..fresh {
        let r = (!inst.reclaim_in_s.is_empty())
            .then(|| rng.chance(p.reclaim_share).then(|| rng.unit() * 30.0));
        for _ in 0..k {
            inst.host_of.push(hosts + h);
            if let Some(r) = r {
                inst.reclaim_in_s.push(r);
            }
        }
    }
    inst.n_nodes = next + fresh * k;
    if !inst.jobs.is_empty() && rng.chance(0.5) {
        let j = rng.below(inst.jobs.len() as u64) as usize;
        let mut q = p.clone();
        q.n_jobs = 1;
        q.seed = p.seed.wrapping_add(0xA11C);
        q.warm = false;
        q.gpus_per_node = 1;
        let mut newcomer = slot_job(&generate_cold(&q).jobs.remove(0), k);
        newcomer.id = format!("{}-next", inst.jobs[j].id);
        newcomer.current.clear();
        inst.jobs[j] = newcomer;
    }
    inst
}
