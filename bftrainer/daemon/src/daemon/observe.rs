//! Observe: what Slurm shows, turned into engine events. Nodes are classed (open,
//! claimed by a regular job, planned for one, lost); elastic core jobs are adopted,
//! followed through start, preemption and end, and checked against what the lent
//! nodes can serve; progress comes from the runtime's Comment.
//!
//! Nodes are looked up by slot (`slots`: names interned once per node table), so a
//! cycle hashes no node name; tags are parsed once per job and comment (`TagMemo`).

use super::slots::Marks;
use super::*;
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

/// What a waiting job asks of a node: its constraint, memory per node, tag (its
/// minimum) and GPUs per node, the key of one unservability check per cycle (borrowed
/// from the job's copy: nothing is copied per waiting job).
type Request<'a> = (
    Option<&'a str>,
    Option<u64>,
    Option<&'a str>,
    Option<&'a str>,
);

/// What a tagged job's admin comment says.
#[derive(Debug, Clone, Copy)]
enum Tag {
    Core,
    /// `as_written`: its tag and name are exactly those bftrainerd gives a satellite of
    /// `parent`.
    Satellite {
        parent: u32,
        as_written: bool,
    },
    Malformed,
    /// Looks like a tag but lacks the exact prefix: not ours, not refused.
    Other,
}

/// A tagged job's admin comment and name, and what they say, kept while the job is in
/// the snapshot: parsed again only when either changes.
#[derive(Debug)]
pub(super) struct TagMemo {
    comment: String,
    name: String,
    tag: Tag,
    /// The cycle that last saw it.
    seen: u64,
}

fn tag_of(cache: &mut FxHashMap<u32, TagMemo>, j: &Job, seen: u64) -> Tag {
    let comment = j.admin_comment.as_deref().unwrap_or("");
    if let Some(m) = cache.get_mut(&j.job_id) {
        if m.comment == comment && m.name == j.name {
            m.seen = seen;
            return m.tag;
        }
    }
    let tag = match spec::parse_tag(comment) {
        Some(Ok(s)) if s.role == Role::Core => Tag::Core,
        Some(Ok(s)) if s.role == Role::Satellite => {
            let parent = s.parent.unwrap_or(0);
            Tag::Satellite {
                parent,
                as_written: comment == satellite_tag(parent) && j.name == satellite_name(parent),
            }
        }
        Some(_) => Tag::Malformed,
        None => Tag::Other,
    };
    cache.insert(
        j.job_id,
        TagMemo {
            comment: comment.to_string(),
            name: j.name.clone(),
            tag,
            seen,
        },
    );
    tag
}

/// The parent that `spec::parse_tag` reads from a job's tag (`None`: no tag that
/// parses), taken from the memo of `tag_of` while the job's comment and name are those
/// it parsed (reconcile asks this of every satellite, every cycle).
pub(super) fn tag_parent(cache: &FxHashMap<u32, TagMemo>, j: &Job) -> Option<u32> {
    let comment = j.admin_comment.as_deref().unwrap_or("");
    if let Some(m) = cache.get(&j.job_id) {
        if m.comment == comment && m.name == j.name {
            match m.tag {
                Tag::Satellite { parent, .. } => return Some(parent),
                Tag::Other => return None,
                // A core's or malformed tag may still name a parent: parsed below.
                Tag::Core | Tag::Malformed => {}
            }
        }
    }
    match j.admin_comment.as_deref().and_then(spec::parse_tag) {
        Some(Ok(s)) => Some(s.parent.unwrap_or(0)),
        _ => None,
    }
}

/// What observing a satellite reads of its job (copied out of the snapshot, so that
/// the daemon can act while reading it).
pub(super) struct SatJob {
    pub job_id: u32,
    pub user_id: u32,
    pub state: bftrainer_slurm::JobState,
    pub preempt_time: Option<i64>,
    pub start_time: Option<i64>,
    pub end_time: Option<i64>,
    /// Why it pends (only read while it does).
    pub reason: Option<String>,
    /// Its node (`nodes`, else `req_nodes`; empty when neither).
    pub node: String,
}

impl SatJob {
    fn of(j: &Job) -> SatJob {
        SatJob {
            job_id: j.job_id,
            user_id: j.user_id,
            state: j.state,
            preempt_time: j.preempt_time,
            start_time: j.start_time,
            end_time: j.end_time,
            reason: if j.state.base() == JobBase::Pending {
                j.reason.clone()
            } else {
                None
            },
            node: sat_node(j).to_string(),
        }
    }
}

/// Makes `copies[k]` a copy of `j` (or pushes one at the end): a copy kept from the
/// cycle before is compared with the snapshot's record and copied again only if it
/// differs. Most records do not change between polls, and a comparison allocates
/// nothing where a copy of a `Job` allocates a string per field set.
pub(super) fn keep_copy(copies: &mut Vec<Job>, k: usize, j: &Job) {
    match copies.get_mut(k) {
        Some(c) => {
            if c != j {
                c.clone_from(j);
            }
        }
        None => copies.push(j.clone()),
    }
}

/// Slurm job ids wrap (at MaxJobId, back to FirstJobId): ids this far apart are taken
/// for the two sides of a wrap, the smaller one the newer.
const ID_WRAP_GAP: u32 = 1 << 25;

/// Whether `a` was submitted after `b`: by submit time, then (within one second) by id
/// across a wrap of the ids.
pub(super) fn is_newer(a: &Job, b: &Job) -> bool {
    let (ta, tb) = (a.submit_time.unwrap_or(0), b.submit_time.unwrap_or(0));
    if ta != tb {
        return ta > tb;
    }
    if a.job_id.abs_diff(b.job_id) >= ID_WRAP_GAP {
        a.job_id < b.job_id
    } else {
        a.job_id > b.job_id
    }
}

/// A satellite's node as the snapshot shows it: where it runs, else where it is pinned.
pub(super) fn sat_node(j: &Job) -> &str {
    j.nodes
        .as_deref()
        .or(j.req_nodes.as_deref())
        .unwrap_or_default()
}

/// What one pass over the job table found (`scan_jobs`). Nodes are slots.
struct Scan {
    /// The core jobs (copied: observing one may act on it).
    jobs: Vec<Job>,
    /// Core jobs by Slurm id: index in `jobs`.
    cores_seen: FxHashMap<u32, usize>,
    /// Satellites bftrainerd wrote: (index in the snapshot's job table, parent).
    sats: Vec<(usize, u32)>,
    /// Satellites their owner changed since: (job id, parent), to cancel.
    modified_sats: Vec<(u32, u32)>,
    /// Nodes regular jobs hold, or that are being taken by preemption.
    foreign_busy: Marks,
    /// Earliest planned start of a pending regular job per node.
    forecast: Vec<Option<f64>>,
    /// Nodes bftrainerd's jobs hold.
    our_nodes: Marks,
    /// Partitions where regular jobs wait.
    pending_parts: FxHashSet<String>,
    /// Each pending regular job's planned nodes, whole.
    plans: Vec<Arc<[u32]>>,
    /// A tagged job runs while Slurm preempts it.
    tagged_preempted: bool,
    /// Cores bftrainerd manages (or its journal knows) that are now outside the
    /// elastic partitions (`[policy] partition` changed, or an administrator moved
    /// them): `observe_cores` keeps or releases them.
    outside: FxHashSet<u32>,
}

/// The earliest of `start` and what `forecast` has for slot `s`.
pub(super) fn plan_at(forecast: &mut Vec<Option<f64>>, s: u32, start: f64) {
    let s = s as usize;
    if s >= forecast.len() {
        forecast.resize(s + 1, None);
    }
    let e = forecast[s].get_or_insert(start);
    *e = e.min(start);
}

impl<C: Cluster> Daemon<C> {
    /// One observation of the refreshed snapshot: jobs first (who holds or will take
    /// which node), then nodes, core jobs and satellites, each turned into events.
    pub(super) fn observe(&mut self, now: f64) {
        let parts = self.cfg.elastic_partitions();
        let parts: Vec<String> = parts.into_iter().map(str::to_string).collect();
        self.slots
            .sync(self.cluster.nodes(), &self.node_ids, &parts);
        let mut scan = self.scan_jobs(now);
        self.observe_nodes(&scan, now);
        self.observe_gpu_slots(&scan.sats, now);
        self.observe_cores(&scan, &parts, now);
        let copies = std::mem::take(&mut scan.jobs);
        self.observe_satellites(scan, now);
        self.observe_copies = copies;
        self.observe_limits(now);
    }

    /// The job table in one pass: which jobs are bftrainerd's (cores, satellites, ones
    /// their owners changed), which nodes regular jobs hold or are planned onto, and
    /// where regular jobs wait.
    fn scan_jobs(&mut self, now: f64) -> Scan {
        let jobs_len = self.cluster.jobs().len();
        // What the job table says of regular jobs, kept from the cycle before while no
        // table changed (its expressions kept with it); else one pass over the table.
        let keep = !self.tables_reloaded
            && self
                .regular
                .as_ref()
                .is_some_and(|r| r.fits(jobs_len, self.slots.generation()));
        #[cfg(test)]
        let keep = keep && !self.afresh;
        let regular = match self.regular.take() {
            Some(r) if keep => {
                self.slots.keep_exprs();
                r
            }
            _ => self.scan_regular(),
        };
        // A regular job is there: a hold after a preemption has served.
        if !self.reclaimed.is_empty() {
            for s in regular.busy.iter() {
                if let Some(id) = self.slots.engine(s) {
                    self.reclaimed.remove(&id);
                }
            }
        }
        let mut foreign_busy = regular.busy.clone();
        let mut our_nodes = Marks::default();
        our_nodes.reset(self.slots.len());
        let mut forecast = regular.forecast.clone();
        let mut pending_parts = regular.pending_parts.clone();
        // Each pending regular job's planned nodes, kept whole: a plan that runs over a
        // core's node is not acted on early (`observe_nodes`).
        let mut plans = regular.plans.clone();
        let tagged = &regular.tagged;
        let uid_of = &regular.uid_of;
        self.index_jobs();
        let jobs = self.cluster.jobs();
        let seen = self.stats.cycles;
        // The copies of the cycle before, compared in place and copied again where
        // they differ.
        let mut core_jobs: Vec<Job> = std::mem::take(&mut self.observe_copies);
        let mut n_cores = 0usize;
        let mut cores_seen: FxHashMap<u32, usize> = FxHashMap::default();
        let mut sats: Vec<(usize, u32)> = Vec::new(); // (index in the snapshot, parent)
        let mut modified_sats: Vec<(u32, u32)> = Vec::new(); // (job id, parent)
        let mut refusals: Vec<(usize, &'static str)> = Vec::new();
        let mut tagged_preempted = false;
        let mut outside: FxHashSet<u32> = FxHashSet::default();
        for &i in tagged.iter() {
            let j = &jobs[i];
            let ours = match tag_of(&mut self.tags, j, seen) {
                Tag::Core => {
                    let inside = j
                        .partition
                        .as_deref()
                        .is_some_and(|p| self.cfg.core_partition_ok(p));
                    // One already ours stays in view whatever its partition now: it is
                    // kept or released to Slurm, never counted finished while it runs
                    // or left held (`observe_cores`).
                    let known = !inside
                        && j.state.is_active()
                        && match self.cores.get(&j.job_id) {
                            Some(c) => !c.ended,
                            // A restart under a changed `[policy] partition`: the
                            // journal's engine has it.
                            None => self.job_index.get(&j.job_id).is_some_and(|&k| {
                                !matches!(
                                    self.engine.job_status(k),
                                    JobStatus::Finished | JobStatus::Cancelled
                                )
                            }),
                        };
                    if known {
                        outside.insert(j.job_id);
                    }
                    if inside || known {
                        cores_seen.insert(j.job_id, n_cores);
                        keep_copy(&mut core_jobs, n_cores, j);
                        n_cores += 1;
                        true
                    } else {
                        refusals.push((i, "a core tag outside the elastic partitions"));
                        false
                    }
                }
                Tag::Satellite { parent, as_written } => {
                    let consistent = as_written
                        && j.partition
                            .as_deref()
                            .is_some_and(|p| self.cfg.satellite_partition_ok(p))
                        && uid_of.get(&parent).map_or(true, |&u| u == j.user_id)
                        && self.cores.get(&parent).map_or(true, |c| c.uid == j.user_id);
                    // One of ours that its owner changed since (renamed, moved to
                    // another partition...; the plugin refuses that, this is for a
                    // change made around it): it no longer counts as a satellite, so it
                    // is cancelled rather than left running unmanaged.
                    let modified = !consistent
                        && self
                            .cores
                            .get(&parent)
                            .is_some_and(|c| c.uid == j.user_id && !c.ended)
                        && uid_of.get(&parent).map_or(true, |&u| u == j.user_id);
                    if consistent {
                        sats.push((i, parent));
                        true
                    } else if modified {
                        if j.state.is_active() {
                            modified_sats.push((j.job_id, parent));
                        }
                        false
                    } else {
                        refusals.push((
                            i,
                            "a satellite tag, name, partition or owner bftrainerd did not write",
                        ));
                        false
                    }
                }
                Tag::Malformed => {
                    if j.state.is_active() {
                        refusals.push((i, "a malformed bftrainer tag"));
                    }
                    false
                }
                Tag::Other => false,
            };
            let holding = is_running(j) || j.state.is_completing();
            if is_running(j) && j.preempt_time.is_some() {
                tagged_preempted = true;
            }
            if holding {
                if let Some(expr) = &j.nodes {
                    for &s in self
                        .slots
                        .expand(expr, &self.cluster, &self.node_ids)
                        .iter()
                    {
                        if ours {
                            // A satellite or core being preempted goes to a regular job.
                            if j.preempt_time.is_some() {
                                if let Some(id) = self.slots.engine(s) {
                                    self.reclaimed.insert(id, now);
                                }
                                foreign_busy.set(s);
                            } else {
                                our_nodes.set(s);
                            }
                        } else {
                            foreign_busy.set(s);
                        }
                    }
                }
            } else if !ours && j.state.base() == JobBase::Pending && !j.is_held() {
                // A job with a bftrainer-looking tag that is not ours counts as regular.
                if let Some(p) = &j.partition {
                    pending_parts.extend(p.split(',').map(str::to_string));
                }
                if let (Some(expr), Some(start)) = (&j.sched_nodes, j.expected_start()) {
                    let nodes = self.slots.expand(expr, &self.cluster, &self.node_ids);
                    for &s in nodes.iter() {
                        plan_at(&mut forecast, s, start as f64);
                    }
                    plans.push(nodes);
                }
            }
        }
        core_jobs.truncate(n_cores);
        // Memos of jobs gone from the snapshot are dropped.
        if self.tags.len() > 2 * tagged.len() + 1024 {
            self.tags.retain(|_, m| m.seen == seen);
        }
        // For reconcile, this cycle.
        self.tagged_of = Some(jobs.len());
        self.regular = Some(regular);
        for (i, why) in refusals {
            let j = &self.cluster.jobs()[i];
            if !self.refused.contains(&j.job_id) {
                let j = j.clone();
                self.refuse(&j, why);
            }
        }

        Scan {
            jobs: core_jobs,
            cores_seen,
            sats,
            modified_sats,
            foreign_busy,
            forecast,
            our_nodes,
            pending_parts,
            plans,
            tagged_preempted,
            outside,
        }
    }

    /// Each node of the elastic partitions classed (open with its forecast, claimed,
    /// planned, lost) and told to the engine when that changed.
    fn observe_nodes(&mut self, scan: &Scan, now: f64) {
        let Scan {
            jobs,
            cores_seen,
            modified_sats,
            foreign_busy,
            forecast,
            our_nodes,
            pending_parts,
            plans,
            tagged_preempted,
            ..
        } = scan;
        // Slurm's planned starts (its clock) in engine time.
        let off = self.wall_offset;
        let forecast_of = |s: u32| forecast.get(s as usize).copied().flatten().map(|t| t + off);
        // Core nodes are not released early on a forecast: losing one requeues the
        // whole job, and a pending job's planned nodes may change (measured: a 1-node
        // job planned on a core's node while Slurm preempted a satellite for it).
        let mut core_nodes = Marks::default();
        core_nodes.reset(self.slots.len());
        for c in self.cores.values().filter(|c| !c.ended) {
            for &n in self.engine.job_anchors(c.jid) {
                core_nodes.set(
                    self.slots
                        .slot(&self.nodes[n as usize].name, &self.node_ids),
                );
            }
        }
        // ... and where Slurm says the cores run, whatever the engine holds.
        for &i in cores_seen.values() {
            if is_running(&jobs[i]) {
                if let Some(e) = &jobs[i].nodes {
                    for &s in self.slots.expand(e, &self.cluster, &self.node_ids).iter() {
                        core_nodes.set(s);
                    }
                }
            }
        }
        let table = self.cluster.nodes();
        // Nor are the other nodes of a plan that includes a core's node: freeing them
        // would only help Slurm start the job there, requeueing the core. Slurm's own
        // preemption picks satellites first (their partition's lower PriorityTier);
        // measured on 24.11 and 26.05, whose plan for a 2-node job named a satellite's
        // node and the core's while Slurm was preempting two other satellites for it.
        // A plan that cannot fit beside the cores (a job as large as the partition) has
        // to preempt one anyway: its other nodes are released ahead as usual.
        let non_core = (0..table.len())
            .filter(|&i| self.slots.elastic(i) && !core_nodes.get(self.slots.of_node(i)))
            .count();
        // While Slurm preempts elastic jobs for a regular job (or just did: their nodes
        // are reclaimed), it has chosen the nodes; the pending job's plan can still name
        // others (24.11 and 26.05 keep it pending until the preempted jobs completed),
        // and releasing those too would only shrink the elastic job for nothing.
        let preempting = !self.reclaimed.is_empty() || *tagged_preempted;
        let steers = |p: &[u32]| p.len() <= non_core && p.iter().any(|&s| core_nodes.get(s));
        let mut steered = Marks::default();
        steered.reset(self.slots.len());
        for p in plans.iter().filter(|p| steers(p)) {
            for &s in p.iter() {
                steered.set(s);
            }
        }
        // Nodes backfill flagged PLANNED without a plan we can read (sched_nodes unset)
        // count as one plan.
        let flagged: Vec<u32> = (0..table.len())
            .filter(|&i| {
                table[i].state.is_planned() && forecast_of(self.slots.of_node(i)).is_none()
            })
            .map(|i| self.slots.of_node(i))
            .collect();
        if steers(&flagged) {
            for &s in &flagged {
                steered.set(s);
            }
        }
        // Nodes, by their index in the table.
        let mut classes: Vec<Option<(Option<Class>, Why)>> = vec![None; table.len()];
        for (i, n) in table.iter().enumerate() {
            if !self.slots.elastic(i) {
                continue;
            }
            let s = self.slots.of_node(i);
            let st = n.state;
            let uncertain =
                st.is_not_responding() || st.base() == bftrainer_slurm::NodeBase::Unknown;
            let node_id = self.slots.engine(s);
            // (Most cycles hold no node: no lookup per node then.)
            let reclaimed = node_id
                .filter(|_| !self.reclaimed.is_empty())
                .and_then(|id| self.reclaimed.get(&id))
                .is_some_and(|&t| now - t < self.cfg.reclaim_hold_s);
            let ours = our_nodes.get(s);
            let busy = foreign_busy.get(s) || ours || st.base() != bftrainer_slurm::NodeBase::Idle;
            if busy && !self.held_after_job.is_empty() {
                if let Some(id) = node_id {
                    self.held_after_job.remove(&id);
                }
            }
            let (class, why) =
                if uncertain && !st.is_drain() && st.base() != bftrainer_slurm::NodeBase::Down {
                    // slurmctld just restarted, or the node misses pings: Slurm has not
                    // decided; neither have we (no event until it does).
                    (None, Why::NotResponding)
                } else if (st.is_drain() || st.is_unavailable() || st.is_reserved())
                    && st.keeps_jobs()
                    && ours
                    && core_nodes.get(s)
                {
                    // Draining, failing, in maintenance or a reservation, or not answering
                    // pings under a running core job: Slurm lets the job run on (only DOWN
                    // kills it, `NodeState::keeps_jobs`), and losing the node would requeue the whole
                    // job. It keeps the node, with a forecast of now so nothing more is
                    // lent there; the node is lost once the core leaves it. The forecast
                    // stays the one first sent, so a long drain is one event, not one per
                    // poll.
                    let since = node_id
                        .and_then(|id| self.nodes[id as usize].sent_forecast)
                        .filter(|&t| t <= now)
                        .unwrap_or(now);
                    (
                        Some(Class::Available {
                            reclaim_at: Some(since),
                        }),
                        Why::Unavailable,
                    )
                } else if st.is_unavailable() || st.is_drain() || st.is_reserved() {
                    (Some(Class::Lost), Why::Unavailable)
                } else if foreign_busy.get(s) {
                    (Some(Class::Claimed), Why::RegularJob)
                } else if !ours && st.base() != bftrainer_slurm::NodeBase::Idle {
                    // Allocated to something not in our snapshot (a job just started).
                    (Some(Class::Claimed), Why::RegularJob)
                } else if !ours
                    && n.partitions.iter().any(|p| pending_parts.contains(p))
                    && node_id.is_some_and(|id| self.nodes[id as usize].class == Class::Claimed)
                    && !reclaimed
                    && !node_id.is_some_and(|id| self.held_after_job.contains(&id))
                {
                    // A regular job just left while regular jobs wait in its partitions:
                    // Slurm's scheduler is about to fill it; lend it only if it stays idle.
                    if let Some(id) = node_id {
                        self.reclaimed.insert(id, now);
                        self.held_after_job.insert(id);
                    }
                    (Some(Class::Claimed), Why::QueueWaits)
                } else if reclaimed && !ours {
                    // Taken from an elastic job by preemption moments ago: the regular job
                    // that preempted it is about to start there; do not lend it back.
                    (Some(Class::Claimed), Why::Reclaimed)
                } else {
                    let mut r = forecast_of(s);
                    if r.is_none() && st.is_planned() {
                        r = Some(now);
                    }
                    match r {
                        Some(t)
                            if t <= now + self.cfg.release_before_s
                                && !core_nodes.get(s)
                                && !steered.get(s)
                                && !preempting =>
                        {
                            (Some(Class::Claimed), Why::Planned)
                        }
                        _ => (Some(Class::Available { reclaim_at: r }), Why::Open),
                    }
                };
            classes[i] = Some((class, why));
        }
        self.reclaimed
            .retain(|_, t| now - *t < self.cfg.reclaim_hold_s);
        for &(id, parent) in modified_sats {
            let memo = self.sats.entry(id).or_default();
            if memo.signalled_at.is_some_and(|t| now - t < 5.0) {
                continue;
            }
            memo.signalled_at = Some(now);
            memo.ending = true;
            log::warn!(
                "satellite {id} of job {parent} no longer has the name, partition or tag bftrainerd gave it (changed by its owner?): cancelling it"
            );
            self.call(|c| c.cancel(id), "cancel", id);
        }
        // Nodes the engine knows that left the elastic partitions (removed from them,
        // renamed, deleted from slurm.conf): lost until they come back.
        let mut listed = vec![false; self.nodes.len()];
        for (i, c) in classes.iter().enumerate() {
            if c.is_some() {
                if let Some(id) = self.slots.engine(self.slots.of_node(i)) {
                    listed[id as usize] = true;
                }
            }
        }
        // (GPU slots are `observe_gpu_slots`' to class.)
        let vanished: Vec<NodeId> = (0..self.nodes.len() as NodeId)
            .filter(|&id| !listed[id as usize] && !self.nodes[id as usize].gpu_slot)
            .collect();
        for id in vanished {
            if self.nodes[id as usize].class != Class::Lost {
                log::info!(
                    "node {}: no longer in the elastic partitions; not lent until it is back",
                    self.nodes[id as usize].name
                );
            }
            self.nodes[id as usize].why = Why::Unavailable;
            self.observe_node(id, Class::Lost);
        }
        // In the order of their names.
        let order = self.slots.take_order();
        for &i in &order {
            let i = i as usize;
            let Some((mut class, mut why)) = classes[i] else {
                continue;
            };
            let id = match self.slots.engine(self.slots.of_node(i)) {
                Some(id) => id,
                None => {
                    let id = self.nodes.len() as NodeId;
                    // Declared at once (the engine needs the id for later events).
                    let ev = Event::NodeAdded {
                        node: id,
                        name: self.cluster.nodes()[i].name.clone(),
                    };
                    if self.feed(&ev, now).is_ok() {
                        self.learn(&ev).ok();
                        if let Some(j) = self.journal.as_mut() {
                            j.push(&record(now, ev));
                        }
                    }
                    id
                }
            };
            if let Some(sa) = self.set_aside.get(&id) {
                if sa.until > now {
                    class = Some(Class::Lost);
                    why = Why::SetAside;
                } else {
                    log::info!(
                        "node {}: back in the pool after being set aside ({})",
                        self.cluster.nodes()[i].name,
                        sa.reason
                    );
                    let failures = sa.failures;
                    self.set_aside.insert(
                        id,
                        SetAside {
                            failures,
                            until: f64::NEG_INFINITY,
                            reason: String::new(),
                        },
                    );
                }
            }
            self.nodes[id as usize].why = why;
            if let Some(class) = class {
                self.observe_node(id, class);
            }
        }
        self.slots.put_order(order);
    }

    fn observe_cores(&mut self, scan: &Scan, parts: &[String], now: f64) {
        let Scan {
            jobs,
            cores_seen,
            outside,
            ..
        } = scan;
        let known: Vec<u32> = self.cores.keys().copied().collect();
        self.sat_parts.clear();
        for &(i, parent) in &scan.sats {
            self.sat_parts.entry(parent).or_default().push(i);
        }
        // Released to Slurm this cycle (still tagged in this snapshot): not adopted
        // again below.
        let mut released: FxHashSet<u32> = FxHashSet::default();
        for id in known {
            let job = cores_seen.get(&id).map(|&i| &jobs[i]);
            if let Some(j) = job.filter(|_| outside.contains(&id)) {
                if self.left_the_partitions(id, j, now) {
                    released.insert(id);
                    continue;
                }
            }
            self.observe_core(id, job, now);
        }
        // An ended core that Slurm shows active again: a new job under the same id.
        let reborn: Vec<u32> = cores_seen
            .iter()
            .filter(|(id, &i)| {
                jobs[i].state.is_active()
                    && self.cores.get(id).is_some_and(|c| c.ended)
                    && !released.contains(id)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in reborn {
            log::info!(
                "elastic job {id} is active again after its end (requeued, or a job id that wrapped): adopting it as a new job"
            );
            self.cores.remove(&id);
            self.blame.forget(id);
            self.measured.remove(&id);
        }
        let mut new: Vec<usize> = cores_seen
            .iter()
            .filter(|(id, _)| !self.cores.contains_key(id) && !released.contains(id))
            .map(|(_, &i)| i)
            .collect();
        new.sort_by_key(|&i| (jobs[i].submit_time, jobs[i].job_id));
        for i in new {
            self.adopt_core(&jobs[i], now);
        }
        // A job waiting for admission whose constraint or memory no node bftrainerd
        // lends can meet is not admitted (it would only time out, again and again),
        // and says why in `bftrainer jobs`.
        let waiting: Vec<(u32, usize)> = cores_seen
            .iter()
            .filter(|(id, _)| {
                self.cores
                    .get(id)
                    .is_some_and(|c| !c.ended && self.engine.job_nodes(c.jid).is_empty())
            })
            .map(|(&id, &i)| (id, i))
            .collect();
        // One check per distinct request: users choose how many jobs wait, and each
        // check walks the node table.
        let mut checked: FxHashMap<Request, Option<String>> = FxHashMap::default();
        for (id, i) in waiting {
            let j = &jobs[i];
            let pending_note = self.cores[&id].requeue_hold && j.is_held();
            let why = held_why(j)
                .or_else(|| pending_note.then(|| spec::SiteHold::Requeue.describe().to_string()))
                .or_else(|| not_yet_eligible(j, now - self.wall_offset));
            if let Some(why) = why {
                self.set_unservable(id, Some(why), now);
                continue;
            }
            let key = (
                j.constraint.as_deref(),
                j.mem_per_node_mb,
                j.admin_comment.as_deref(),
                j.tres_per_node.as_deref(),
            );
            let why = match checked.get(&key) {
                Some(w) => w.clone(),
                None => {
                    let w = self.unservable_why(j, parts);
                    checked.insert(key, w.clone());
                    w
                }
            };
            self.set_unservable(id, why, now);
        }
        self.take_back_held(scan, now);
        // Jobs the journal knows as queued or active that slurmctld no longer has
        // (they ended while the daemon was down and aged out): finished. Only the
        // engine's live jobs are looked at, not every job ever.
        let live: Vec<JobId> = self
            .engine
            .active()
            .iter()
            .copied()
            .chain(self.engine.queue())
            .collect();
        for jid in live {
            let id = self.jobs[jid as usize];
            if self.cores.get(&id).is_some_and(|c| c.jid == jid) {
                continue;
            }
            log::warn!("elastic job {id} is gone from slurmctld; counted finished");
            self.pending.push(Event::JobFinished { job: jid });
        }
        // Ended jobs are forgotten after `job_retention` (their history stays in the
        // journal and in accounting): the daemon's per-poll work and memory follow the
        // live jobs, not every job ever run.
        let retention = self.cfg.job_retention_s;
        let old: Vec<u32> = self
            .cores
            .iter()
            .filter(|(_, c)| c.ended && now - c.ended_at > retention)
            .map(|(&id, _)| id)
            .collect();
        for id in old {
            if let Some(c) = self.cores.remove(&id) {
                self.blame.forget(id);
                self.unservable.remove(&id);
                self.measured.remove(&id);
                // Journaled, so a restart forgets it too (`learn` drops its history).
                self.emit(Event::JobForgotten { job: c.jid });
            }
        }
    }

    /// Satellites: joined, preempted, failed or ended, each once.
    fn observe_satellites(&mut self, scan: Scan, now: f64) {
        let Scan { sats, .. } = scan;
        // An ended satellite is news only if it is the newest of its parent on
        // its node and it ended while this daemon ran; older ones are history (handled
        // before a restart, or replaced since).
        let started = *self.started_at.get_or_insert(now);
        let old: Vec<bool> = {
            let jobs = self.cluster.jobs();
            // By node, and by GPU slot on a node lent by GPU (`gpulend`): several
            // satellites of one job share such a node.
            let slot = |id: u32| self.sats.get(&id).and_then(|m| m.slot);
            // The newest by submit time, not by id: ids wrap at MaxJobId.
            let mut newest: FxHashMap<(u32, &str, Option<NodeId>), &Job> = FxHashMap::default();
            for &(i, parent) in &sats {
                let j = &jobs[i];
                let e = newest
                    .entry((parent, sat_node(j), slot(j.job_id)))
                    .or_insert(j);
                if is_newer(j, e) {
                    *e = j;
                }
            }
            sats.iter()
                .map(|&(i, parent)| {
                    let j = &jobs[i];
                    !j.state.is_active()
                        && (newest
                            .get(&(parent, sat_node(j), slot(j.job_id)))
                            .is_some_and(|n| is_newer(n, j))
                            || j.end_time.is_some_and(|e| (e as f64) < started.floor()))
                })
                .collect()
        };
        let mut live: FxHashSet<u32> = FxHashSet::default();
        for (&(i, parent), old) in sats.iter().zip(old) {
            let sj = {
                let j = &self.cluster.jobs()[i];
                live.insert(j.job_id);
                let memo = self.sats.entry(j.job_id).or_default();
                if old {
                    memo.done = true;
                    continue;
                }
                memo.parent = parent;
                let node = sat_node(j);
                if memo.node != node {
                    memo.node.clear();
                    memo.node.push_str(node);
                }
                // Its end was seen: nothing more to observe (most satellites in a
                // snapshot that keeps ended jobs).
                if memo.done {
                    continue;
                }
                SatJob::of(j)
            };
            self.observe_satellite(&sj, parent, now);
        }
        // Every live one has a memo: with as many memos as live ones, none is gone.
        if self.sats.len() != live.len() {
            self.sats.retain(|id, _| live.contains(id));
        }
    }

    /// Why the idle nodes bftrainerd may lend cannot serve waiting job `j` (its
    /// `--constraint` against their features, its `--mem` against their memory), if
    /// fewer than its minimum can.
    pub(super) fn unservable_why(&self, j: &Job, parts: &[String]) -> Option<String> {
        let constraint = match j.constraint.as_deref().map(Constraint::parse) {
            Some(Ok(c)) => Some(c),
            // Slurm accepted it; an expression we cannot read is left to Slurm.
            Some(Err(_)) | None => None,
        };
        let mem = j.mem_per_node_mb;
        let gpus = j
            .tres_per_node
            .as_deref()
            .and_then(bftrainer_slurm::gpus_per_node);
        // With GPU lending, idle GPU slots are no place for a core (it holds whole
        // nodes of its partition): a job waits until MIN whole nodes serve it, whatever
        // it asks.
        let gpu_lending = !self.cfg.gpu_partitions.is_empty();
        if constraint.is_none() && mem.is_none() && gpus.is_none() && !gpu_lending {
            return None;
        }
        let min = match j.admin_comment.as_deref().and_then(spec::parse_tag) {
            Some(Ok(s)) => s.min,
            _ => 1,
        };
        // The nodes open to it now: idle, in the elastic partitions, lendable.
        let open = self
            .cluster
            .nodes()
            .iter()
            .filter(|n| n.partitions.iter().any(|p| parts.contains(p)))
            .filter(|n| {
                self.node_ids.get(&n.name).is_some_and(|&id| {
                    matches!(self.nodes[id as usize].class, Class::Available { .. })
                        && self.engine.node_state(id) == NodeState::Idle
                })
            });
        let fit = open
            .filter(|n| constraint.as_ref().map_or(true, |c| c.matches(&n.features)))
            .filter(|n| mem.map_or(true, |m| n.real_memory_mb >= m))
            .filter(|n| {
                gpus.as_ref().map_or(true, |(typ, count)| {
                    let have = n
                        .gres
                        .as_deref()
                        .map_or(0, |g| bftrainer_slurm::gpus_of_type(g, typ.as_deref()));
                    have >= *count
                })
            })
            .count() as u32;
        if fit >= min {
            return None;
        }
        let mut asks = Vec::new();
        if let Some(c) = &j.constraint {
            asks.push(format!("--constraint={c}"));
        }
        if let Some(m) = mem {
            asks.push(format!("--mem={m}M"));
        }
        if let Some((typ, count)) = &gpus {
            asks.push(match typ {
                Some(t) => format!("{count} GPUs of type {t} per node"),
                None => format!("{count} GPUs per node"),
            });
        }
        if asks.is_empty() {
            return Some(format!(
                "{fit} whole nodes bftrainerd may lend are idle and its core needs {min} (GPU slots of shared nodes serve only its growth); it waits for such nodes"
            ));
        }
        Some(format!(
            "it asks {} and {fit} of the idle nodes bftrainerd may lend meet that (it needs at least {min}); it waits for such nodes",
            asks.join(" ")
        ))
    }

    /// A job held by an administrator or its owner after bftrainerd chose its nodes but
    /// before Slurm started it (job_submit/bftrainer refuses bftrainerd's release then):
    /// its nodes go back to the pool and it waits, paused, for the hold to be lifted.
    fn take_back_held(&mut self, scan: &Scan, now: f64) {
        let held: Vec<(u32, JobId, String)> = scan
            .cores_seen
            .iter()
            .filter_map(|(&id, &i)| {
                let c = self.cores.get(&id).filter(|c| !c.ended)?;
                if self.engine.job_nodes(c.jid).is_empty() {
                    return None;
                }
                held_why(&scan.jobs[i]).map(|why| (id, c.jid, why))
            })
            .collect();
        for (id, jid, why) in held {
            log::info!(
                "elastic job {id} was held before it started: its nodes go back to the pool"
            );
            for n in self.engine.job_nodes(jid).to_vec() {
                self.emit(Event::WorkerLeft { job: jid, node: n });
            }
            if let Some(c) = self.cores.get_mut(&id) {
                c.admit_at = None;
                c.pinned = None;
            }
            self.set_unservable(id, Some(why), now);
        }
    }

    /// Keeps a waiting job out of admission while no lent node can serve it, and lets
    /// it back when one can (a pause the engine journals; a blame pause stays).
    pub(super) fn set_unservable(&mut self, id: u32, why: Option<String>, now: f64) {
        let Some(jid) = self.cores.get(&id).map(|c| c.jid) else {
            return;
        };
        match why {
            Some(why) => {
                let before = self.unservable.insert(id, why.clone());
                if before.as_ref() != Some(&why) {
                    log::warn!("elastic job {id} is not admitted: {why}");
                }
                if before.is_none() {
                    self.emit(Event::JobPaused {
                        job: jid,
                        until: Some(now + UNSERVABLE_PAUSE_S),
                    });
                }
            }
            None => {
                if let Some(was) = self.unservable.remove(&id) {
                    if was.starts_with("held by") {
                        log::info!("elastic job {id}: its hold was lifted");
                    } else if was.starts_with(NOT_BEFORE) {
                        log::info!("elastic job {id}: its BeginTime has passed");
                    } else {
                        log::info!("elastic job {id}: lent nodes can serve it now");
                    }
                    let until = self.blame.paused(id, now).map(|p| p.until);
                    self.emit(Event::JobPaused { job: jid, until });
                }
            }
        }
    }

    pub(super) fn refuse(&mut self, j: &Job, why: &str) {
        if self.refused.insert(j.job_id) {
            self.stats.not_adopted += 1;
            log::warn!(
                "not adopting job {} (user {}, partition {}): {why}; admin comment {:?}",
                j.job_id,
                j.user_id,
                j.partition.as_deref().unwrap_or("-"),
                j.admin_comment.as_deref().unwrap_or("")
            );
        }
    }

    pub(super) fn observe_node(&mut self, id: NodeId, class: Class) {
        let st = self.engine.node_state(id);
        let rec = &self.nodes[id as usize];
        let ev = match class {
            Class::Lost if st != NodeState::Lost => Some(Event::NodeLost { node: id }),
            Class::Claimed if matches!(st, NodeState::Idle | NodeState::Held(_)) => {
                Some(Event::NodeClaimed { node: id })
            }
            Class::Available { reclaim_at }
                if matches!(st, NodeState::Busy | NodeState::Lost)
                    || rec.sent_forecast != reclaim_at =>
            {
                Some(Event::NodeIdle {
                    node: id,
                    reclaim_at,
                })
            }
            _ => None,
        };
        self.nodes[id as usize].class = class;
        if let Some(ev) = ev {
            self.emit(ev);
        }
    }

    pub(super) fn job_spec(&self, j: &Job, s: &spec::ElasticSpec) -> ElasticSpec {
        let cap = self.nodes.len().max(1) as u32;
        let max = s.max.unwrap_or(cap).max(s.min);
        let mut up = self.cfg.default_up_s;
        let mut down = self.cfg.default_down_s;
        let mut curve = self.cfg.default_curve.clone();
        if let (Some(name), Some(dir)) = (&s.profile, &self.cfg.profile_dir) {
            match config::load_profile(dir, name) {
                Ok(p) => {
                    curve = Some(p.curve);
                    up = p.up_s.unwrap_or(up);
                    down = p.down_s.unwrap_or(down);
                }
                Err(e) => log::warn!(
                    "job {}: profile '{name}' unusable ({e}); using the default curve",
                    j.job_id
                ),
            }
        }
        if let Some(v) = s.up {
            up = f64::from(v);
        }
        if let Some(v) = s.down {
            down = f64::from(v);
        }
        // Linear speed-up by default; a job that can only ever use one node has a
        // one-point curve (the allocator refuses repeated node counts).
        let objective = curve.unwrap_or_else(|| {
            Curve::new(if max > 1 {
                vec![(1, 1.0), (max, f64::from(max))]
            } else {
                vec![(1, 1.0)]
            })
        });
        ElasticSpec {
            name: j.job_id.to_string(),
            min_nodes: s.min,
            max_nodes: max,
            scale_up_s: up,
            scale_down_s: down,
            objective,
            user: Some(j.user_id),
            // Slurm's priority where it has one; a core job held until admission has
            // none, so it gets the one Slurm's factors would give it (`priority`).
            priority: if j.is_held() {
                priority::admission_priority(j, &self.prio, self.clock)
            } else {
                j.priority
            },
        }
    }

    pub(super) fn adopt_core(&mut self, j: &Job, now: f64) {
        // An ended job is adopted only if the journal knows it (it ended while the
        // daemon was down): observe_core then tells an end from a preemption.
        let newest = self.engine_job(j.job_id);
        if !j.state.is_active() && newest.is_none() {
            return;
        }
        let s = match j.admin_comment.as_deref().and_then(spec::parse_tag) {
            Some(Ok(s)) => s,
            _ => return,
        };
        // The journal may know it already (restart): find its engine id. One the engine
        // has ended that Slurm shows active again (requeued after its end, or a job id
        // that wrapped onto it) is a new job.
        let known = newest.filter(|&k| {
            !(j.state.is_active()
                && matches!(
                    self.engine.job_status(k),
                    JobStatus::Finished | JobStatus::Cancelled
                ))
        });
        let jid = match known {
            Some(k) => k,
            None => {
                let jid = self.engine.n_jobs() as JobId;
                let spec = self.job_spec(j, &s);
                log::info!(
                    "elastic job {} of user {} ({}:{} nodes) found {}",
                    j.job_id,
                    j.user_name.as_deref().unwrap_or("?"),
                    spec.min_nodes,
                    spec.max_nodes,
                    if j.is_held() {
                        "held, queued for admission"
                    } else {
                        "not held"
                    }
                );
                // Declared at once: later events of this cycle name it.
                let ev = Event::JobSubmitted { job: jid, spec };
                match self.feed(&ev, now) {
                    Ok(_) => {
                        self.learn(&ev).ok();
                        if let Some(jr) = self.journal.as_mut() {
                            jr.push(&record(now, ev));
                        }
                        // Where it may be placed: only nodes that serve it.
                        let needs = placement::job_needs(j);
                        if !needs.is_empty() {
                            self.emit(Event::JobNeeds { job: jid, needs });
                        }
                        // The global batches the allocator may choose from.
                        if s.batch.is_some() {
                            self.emit(Event::BatchRange {
                                job: jid,
                                range: s.batch,
                            });
                        }
                    }
                    Err(e) => {
                        log::warn!("engine refused elastic job {}: {e}", j.job_id);
                        return;
                    }
                }
                jid
            }
        };
        let status = self.engine.job_status(jid);
        if matches!(status, JobStatus::Finished | JobStatus::Cancelled) {
            // It ended in the journal's view, yet runs or waits in Slurm: not ours now.
            return;
        }
        self.cores.insert(
            j.job_id,
            Core {
                jid,
                uid: j.user_id,
                gid: j.group_id,
                admit_at: None,
                pinned: None,
                started: is_running(j),
                preempting: false,
                restarts: j.restart_count,
                asked_at: f64::NEG_INFINITY,
                requeue_hold: false,
                hold_tried: f64::NEG_INFINITY,
                rate: None,
                rate_at: f64::NEG_INFINITY,
                costs: None,
                batch_asked: None,
                step_s: 0.0,
                ended: false,
                ended_at: f64::INFINITY,
                user: j.user_name.clone(),
                partition: j.partition.clone(),
                preempt_seen: None,
                trained: false,
                trained_until: 0.0,
            },
        );
        if is_running(j) {
            // Slurm runs it: taken as it runs, never requeued for want of a record.
            self.mark_adoption(j.job_id, jid, j);
        }
    }

    /// Core `id`, bftrainerd's, is outside the elastic partitions now. One running in
    /// the partition it was adopted in (`[policy] partition` changed under it) stays
    /// bftrainerd's until it ends: false. One an administrator moved to another
    /// partition, or one not running (waiting for an admission that the changed config
    /// no longer gives there), is released to Slurm: its tag is taken off (else the
    /// gate would hold its next start for an admission that never comes), bftrainerd's
    /// own hold is lifted (an administrator's or owner's is theirs to lift), it leaves
    /// the engine (its satellites are cancelled) and the log says so: true.
    pub(super) fn left_the_partitions(&mut self, id: u32, j: &Job, now: f64) -> bool {
        let Some(core) = self.cores.get(&id) else {
            return false;
        };
        let moved = core.partition != j.partition;
        if !moved && (is_running(j) || j.state.is_completing()) {
            return false;
        }
        if now - core.asked_at < 5.0 {
            return true;
        }
        let own_hold = j.is_held()
            && !core.requeue_hold
            && spec::site_hold(j.admin_comment.as_deref(), j.comment.as_deref()).is_none();
        let up = JobUpdate {
            admin_comment: Some(String::new()),
            // Slurm's INFINITE: what `scontrol release` sends.
            priority: own_hold.then_some(u32::MAX),
            ..Default::default()
        };
        let part = j.partition.as_deref().unwrap_or("-");
        match self.cluster.update(id, &up) {
            Ok(()) => {
                log::warn!(
                    "elastic job {id} is in partition {part}, outside the elastic partitions ({}){}: released to Slurm, its tag taken off{}; its satellites are cancelled",
                    self.cfg.elastic_partitions().join(", "),
                    if moved { " (moved there)" } else { "" },
                    if own_hold { " and bftrainerd's hold lifted" } else { "" },
                );
                let jid = core.jid;
                self.stats.released += 1;
                self.emit(Event::JobCancelled { job: jid });
                let c = self.cores.get_mut(&id).unwrap();
                c.ended = true;
                c.ended_at = now;
            }
            Err(e) => {
                self.cores.get_mut(&id).unwrap().asked_at = now;
                self.stats.slurm_errors += 1;
                self.error(format!(
                    "releasing elastic job {id} (now in partition {part}) to Slurm failed: {e}"
                ));
            }
        }
        true
    }

    /// Gives up the engine's nodes of a core job: core nodes lost to a regular job,
    /// the rest back to the pool (its satellites are cancelled by reconcile).
    pub(super) fn job_lost_nodes(&mut self, jid: JobId) {
        let anchors: Vec<NodeId> = self.engine.job_anchors(jid).to_vec();
        let nodes: Vec<NodeId> = self.engine.job_nodes(jid).to_vec();
        for n in nodes {
            if anchors.contains(&n) {
                self.emit(Event::WorkerPreempted { job: jid, node: n });
            } else {
                self.emit(Event::WorkerLeft { job: jid, node: n });
            }
        }
    }

    pub(super) fn observe_core(&mut self, id: u32, job: Option<&Job>, now: f64) {
        let Some(core) = self.cores.get(&id) else {
            return;
        };
        if core.ended {
            return;
        }
        let jid = core.jid;
        let status = self.engine.job_status(jid);
        let Some(j) = job else {
            log::warn!("elastic job {id} is gone from slurmctld; counted finished");
            self.emit(Event::JobFinished { job: jid });
            if let Some(c) = self.cores.get_mut(&id) {
                c.ended = true;
                c.ended_at = now;
            }
            return;
        };
        let base = j.state.base();
        if !j.state.is_active() {
            // A run that ended while being preempted (the runtime left within the
            // grace time, or PreemptMode=CANCEL) is a preemption, not an end, unless
            // it COMPLETED and its runtime wrote that this run's training finished
            // (`done=1` in the Comment, for this start time): then its work is done
            // and a requeue would only run it again.
            let finished_run = base == JobBase::Complete
                && j.comment
                    .as_deref()
                    .and_then(RunComment::parse)
                    .is_some_and(|c| c.finished_run(j.start_time));
            let preempted = base == JobBase::Preempted
                || (j.preempt_time.is_some()
                    && !finished_run
                    && matches!(base, JobBase::Complete | JobBase::Failed));
            if preempted && status == JobStatus::Active {
                let core = self.cores.get_mut(&id).unwrap();
                if now - core.asked_at < 5.0 {
                    return;
                }
                core.asked_at = now;
                if !core.preempting {
                    self.stats.preemptions += 1;
                }
                core.preempting = false;
                core.started = false;
                core.admit_at = None;
                log::info!(
                    "elastic job {id} ended {} during its preemption: requeueing it held (a preemption, not an end)",
                    j.state.name()
                );
                core.restarts = j.restart_count.saturating_add(1);
                self.job_lost_nodes(jid);
                match self.cluster.requeue(id, true) {
                    Ok(()) => self.stats.requeues += 1,
                    Err(e) => {
                        self.stats.slurm_errors += 1;
                        self.error(format!("requeue of preempted elastic job {id} failed: {e}"));
                    }
                }
                return;
            }
            let ev = if base == JobBase::Cancelled {
                Event::JobCancelled { job: jid }
            } else {
                Event::JobFinished { job: jid }
            };
            log::info!("elastic job {id} ended: {}", j.state.name());
            self.emit(ev);
            let c = self.cores.get_mut(&id).unwrap();
            c.ended = true;
            c.ended_at = now;
            return;
        }
        let core = self.cores.get_mut(&id).unwrap();
        if j.restart_count > core.restarts {
            // Slurm requeued it (preemption): whatever it held is gone.
            core.restarts = j.restart_count;
            core.started = false;
            core.admit_at = None;
            if !core.preempting {
                self.stats.preemptions += 1;
            }
            core.preempting = false;
            log::info!(
                "elastic job {id} was requeued by Slurm (restart {})",
                j.restart_count
            );
            // Back held from a requeue the daemon did not ask for (not within
            // OWN_REQUEUE_S of asking: a call that timed out may still have been done):
            // someone's `scontrol requeuehold`, which Slurm records as the owner's hold
            // whoever gave it, or Slurm's own hold of a failed launch. Admitting it
            // again would undo that hold. Not bft-run's requeue with hold of a start
            // that was not admitted (its note in the Comment): that one waits for
            // exactly this admission.
            let unadmitted = j
                .comment
                .as_deref()
                .is_some_and(|c| c.starts_with(spec::UNADMITTED_NOTE));
            if unadmitted {
                log::info!(
                    "elastic job {id} was started by Slurm without an admission and requeued held by its runtime: it waits to be admitted again"
                );
            }
            if j.is_held()
                && !unadmitted
                && now - core.asked_at >= OWN_REQUEUE_S
                && spec::site_hold(j.admin_comment.as_deref(), j.comment.as_deref()).is_none()
            {
                core.requeue_hold = true;
                log::info!(
                    "elastic job {id} came back held ({}): not admitted until it is released",
                    j.reason.as_deref().unwrap_or("no reason given")
                );
            }
            let held = core.requeue_hold;
            self.job_lost_nodes(jid);
            if held {
                // Out of this cycle's decision already (the waiting jobs' check below
                // skips a job the engine still counts nodes for).
                self.set_unservable(id, Some(spec::SiteHold::Requeue.describe().into()), now);
                self.write_requeue_hold(id, j, now);
            }
            return;
        }
        if is_running(j) {
            if j.preempt_time.is_some() {
                if !core.preempting {
                    core.preempting = true;
                    self.stats.preemptions += 1;
                    log::info!(
                        "elastic job {id}: Slurm preempts its core on {}; giving up its nodes",
                        j.nodes.as_deref().unwrap_or("?")
                    );
                    self.job_lost_nodes(jid);
                }
                return;
            }
            core.admit_at = None;
            if !core.started
                && status == JobStatus::Active
                && !self.engine.job_nodes(jid).is_empty()
            {
                core.started = true;
                log::info!(
                    "elastic job {id} runs on {}",
                    j.nodes.as_deref().unwrap_or("?")
                );
                self.emit(Event::JobStarted { job: jid });
            }
            self.observe_progress(id, j, now);
            self.publish_batch(id, j, now);
            return;
        }
        // Pending.
        core.preempting = false;
        if core.trained {
            // Requeued after its training finished (Slurm's REQUEUE preemption): the
            // next run is admitted as any.
            self.lift_trained(id, now);
        }
        let Some(core) = self.cores.get_mut(&id) else {
            return;
        };
        if core.requeue_hold {
            self.write_requeue_hold(id, j, now);
        }
        let Some(core) = self.cores.get_mut(&id) else {
            return;
        };
        if let Some(t) = core.admit_at {
            if now - t > self.cfg.admit_timeout_s {
                core.admit_at = None;
                let why = j.reason.as_deref().unwrap_or("no reason given").to_string();
                log::warn!(
                    "elastic job {id} did not start within {} s of its admission ({why}); holding it again and re-planning",
                    self.cfg.admit_timeout_s,
                );
                // The nodes are idle (not claimed): back to the pool for a new plan.
                for n in self.engine.job_nodes(jid).to_vec() {
                    self.emit(Event::WorkerLeft { job: jid, node: n });
                }
                // Its own request, limits or begin time keep it from starting: it
                // waits out a pause before the next admission, the nodes go to others.
                if self.outage_ended < t && self.outage_since.is_none() {
                    self.job_failed(
                        id,
                        format!(
                            "it did not start within {} s of its admission ({why})",
                            self.cfg.admit_timeout_s
                        ),
                        now,
                    );
                }
            }
        }
    }

    /// Puts the note of a requeue with hold ([`spec::requeue_hold_note`]) into the
    /// waiting core job's Comment, where the hold is then on record for this daemon and
    /// the next (and the owner's `scontrol release` lifts it: job_submit/bftrainer sets
    /// the waiting note then). Done once the Comment shows the note or another hold, or
    /// the job is no longer held (released before the note was written).
    fn write_requeue_hold(&mut self, id: u32, j: &Job, now: f64) {
        let Some(core) = self.cores.get_mut(&id) else {
            return;
        };
        if !core.requeue_hold {
            return;
        }
        if !j.is_held()
            || spec::site_hold(j.admin_comment.as_deref(), j.comment.as_deref()).is_some()
        {
            core.requeue_hold = false;
            return;
        }
        if now - core.hold_tried < 5.0 {
            return;
        }
        core.hold_tried = now;
        let up = JobUpdate {
            comment: Some(spec::requeue_hold_note()),
            ..Default::default()
        };
        if let Err(e) = self.cluster.update(id, &up) {
            self.stats.slurm_errors += 1;
            self.error(format!(
                "recording the requeue hold of elastic job {id} in its Comment failed: {e}"
            ));
        }
    }

    /// The runtime publishes its measured rate in the core job's Comment
    /// ([`RunComment`]): a change of more than 1% (or of size) is a `Progress` event.
    /// Its measured step time is kept for shrinks (a new run's unmeasured 0 keeps the
    /// previous run's: the same script).
    pub(super) fn observe_progress(&mut self, id: u32, j: &Job, now: f64) {
        let rc = j.comment.as_deref().and_then(RunComment::parse);
        self.observe_trained(id, j, rc.as_ref(), now);
        let Some(rc) = rc else {
            return;
        };
        let Some(core) = self.cores.get_mut(&id) else {
            return;
        };
        if rc.step > 0.0 {
            core.step_s = rc.step;
        }
        if !core.started {
            return;
        }
        self.observe_sensitivity(id, j, &rc);
        let Some(core) = self.cores.get_mut(&id) else {
            return;
        };
        // The Comment is the owner's to write: a rate, a size (`nodes=`) or a rescale
        // cost (`up=`, `down=`) that changes at every poll would put a record in the
        // journal, and an fsync, at every poll. The first rate and the first costs are
        // news at once; any change after them at most every PROGRESS_EVERY_S (one
        // window for all of them), the values then in the Comment winning. Changes
        // left for later are counted.
        let resized = core.rate.map_or(true, |(_, n)| n != rc.nodes);
        let changed = core.rate.map_or(true, |(r, _)| {
            (rc.rate - r).abs() > 0.01 * r.max(f64::MIN_POSITIVE)
        });
        let rate_news = rc.rate > 0.0 && (resized || changed);
        let costs = (rc.up, rc.down);
        let cost_news = core.costs.unwrap_or((0.0, 0.0)) != costs;
        // The batch the rate is measured at, for a job with a batch range: news when
        // it differs from the engine's (its rates at another batch are dropped).
        // The Comment is the job's own to write: a batch outside its declared range
        // (checked by the plugins) is not believed, so a forged one cannot rebase its
        // rates through the model.
        let (range, known) = self.engine.job_batch(core.jid);
        let batch_news =
            range.is_some_and(|(lo, hi)| (lo..=hi).contains(&rc.batch)) && known != Some(rc.batch);
        if !rate_news && !cost_news && !batch_news {
            return;
        }
        let first = (rate_news && core.rate.is_none())
            || (cost_news && core.costs.is_none())
            || (batch_news && known.is_none());
        if !first && now - core.rate_at < PROGRESS_EVERY_S {
            self.stats.progress_deferred += 1;
            return;
        }
        core.rate_at = now;
        let jid = core.jid;
        if rate_news {
            core.rate = Some((rc.rate, rc.nodes));
        }
        if cost_news {
            core.costs = Some(costs);
        }
        if batch_news {
            self.emit(Event::JobBatch {
                job: jid,
                batch: rc.batch,
            });
        }
        if rate_news {
            self.emit(Event::Progress {
                job: jid,
                samples_per_s: rc.rate,
                remaining: None,
                nodes: Some(rc.nodes),
            });
        }
        if cost_news {
            self.emit(Event::RescaleCost {
                job: jid,
                up_s: rc.up,
                down_s: rc.down,
            });
        }
    }

    /// The runtime writes `done=1` into the Comment as its last word, then its workers
    /// leave and the job ends up to a leave timeout later: meanwhile the job is paused
    /// (no satellite: they could only fail, the coordinator is over). The pause is
    /// short and renewed while the Comment says so, so that one a restart or a requeue
    /// leaves behind ends by itself; a later run (another start time) lifts it at once.
    fn observe_trained(&mut self, id: u32, j: &Job, rc: Option<&RunComment>, now: f64) {
        let finished = rc.is_some_and(|c| c.finished_run(j.start_time));
        let Some(core) = self.cores.get_mut(&id) else {
            return;
        };
        if !finished {
            if core.trained {
                self.lift_trained(id, now);
            }
            return;
        }
        if core.trained && now < core.trained_until - TRAINED_PAUSE_S / 2.0 {
            return;
        }
        if !core.trained {
            log::info!("elastic job {id}: its training finished (done=1 in its Comment); it gets no more satellites");
        }
        core.trained = true;
        core.trained_until = now + TRAINED_PAUSE_S;
        let jid = core.jid;
        // `emit` sets the pause's end.
        self.emit(Event::JobPaused {
            job: jid,
            until: None,
        });
    }

    /// Ends the pause of a job whose training finished (a blame pause stays).
    fn lift_trained(&mut self, id: u32, now: f64) {
        let Some(core) = self.cores.get_mut(&id) else {
            return;
        };
        core.trained = false;
        let jid = core.jid;
        let until = self.blame.paused(id, now).map(|p| p.until);
        self.emit(Event::JobPaused { job: jid, until });
    }

    /// Hands a running core job the global batch the last decision chose for it (a job
    /// with a batch range): its tag's `batch_now` ([`spec::with_batch_now`]), which
    /// only root and bftrainerd write and bft-run reads. One update when the decision
    /// changes; one that Slurm's answer does not show yet (or that failed) is sent
    /// again after 5 s.
    pub(super) fn publish_batch(&mut self, id: u32, j: &Job, now: f64) {
        let Some(core) = self.cores.get_mut(&id) else {
            return;
        };
        let Some(want) = self.engine.decided_batch(core.jid) else {
            return;
        };
        let tag = j.admin_comment.as_deref().unwrap_or("");
        // Written already and not yet in Slurm's answer (or refused): again after 5 s.
        let asked = core
            .batch_asked
            .is_some_and(|(b, t)| b == want && now - t < 5.0);
        if spec::batch_now(tag) == Some(want) || asked {
            return;
        }
        let Some(new) = spec::with_batch_now(tag, Some(want)) else {
            return;
        };
        core.batch_asked = Some((want, now));
        let up = JobUpdate {
            admin_comment: Some(new),
            ..Default::default()
        };
        match self.cluster.update(id, &up) {
            Ok(()) => {
                log::info!(
                    "elastic job {id}: global batch {want} (was {})",
                    spec::batch_now(tag)
                        .map_or_else(|| "the script's own".to_string(), |b| b.to_string())
                );
            }
            Err(e) => log::warn!("elastic job {id}: cannot hand it global batch {want}: {e}"),
        }
    }
}

/// Why a waiting core job cannot start yet (`now`: the wall clock's time, as Slurm's
/// timestamps): its BeginTime is ahead (a requeue sets it
/// a while ahead, Slurm's delay before a requeued job may start again). Admitted before
/// it, the job would hold its pinned nodes idle and time out of its admission.
fn not_yet_eligible(j: &Job, now: f64) -> Option<String> {
    let t = j.eligible_time?;
    ((t as f64) > now).then(|| {
        format!(
            "{NOT_BEFORE} {} UTC (its BeginTime: Slurm delays a requeued job's next start)",
            bftrainer_core::timefmt::format_time(t)
        )
    })
}

/// Start of [`not_yet_eligible`]'s reason.
const NOT_BEFORE: &str = "it may not start before";

/// Why a waiting core job must not be admitted: a hold placed by an administrator or
/// its owner, which job_submit/bftrainer recorded (`spec::SiteHold`). Holds of running
/// jobs mean nothing to Slurm, nor here.
fn held_why(j: &Job) -> Option<String> {
    if j.state.base() != JobBase::Pending {
        return None;
    }
    spec::site_hold(j.admin_comment.as_deref(), j.comment.as_deref())
        .map(|h| h.describe().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sat(id: u32, submit: i64) -> Job {
        let mut j = gen::job(id, "elastic-sat", JobBase::Complete);
        j.submit_time = Some(submit);
        j
    }

    #[test]
    fn the_newest_satellite_is_the_last_submitted_across_a_job_id_wrap() {
        // Slurm's default MaxJobId is 67,043,328: after it ids start again at 1.
        let before_wrap = sat(67_043_000, 1_000);
        let after_wrap = sat(3, 1_010);
        assert!(is_newer(&after_wrap, &before_wrap));
        assert!(!is_newer(&before_wrap, &after_wrap));
        // Submitted in the same second on both sides of the wrap.
        let same_second = sat(2, 1_000);
        assert!(is_newer(&same_second, &before_wrap));
        assert!(!is_newer(&before_wrap, &same_second));
        // No wrap: the later id of one second, the later second whatever the ids.
        assert!(is_newer(&sat(11, 5), &sat(10, 5)));
        assert!(!is_newer(&sat(10, 5), &sat(11, 5)));
        assert!(is_newer(&sat(10, 6), &sat(11, 5)));
        assert!(!is_newer(&sat(10, 5), &sat(10, 5)));
    }
}
