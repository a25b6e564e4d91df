//! A generated cluster for the observe-and-decide benchmark (10,000 nodes, 20,000
//! jobs): snapshots in memory, Slurm calls counted and applied to the snapshot as
//! slurmctld would (a submitted job pends; `tick` starts pending elastic jobs on their
//! pinned nodes). Correctness tests never use it: they run against real Slurm.

use super::cluster::{Cluster, Result};
use bftrainer_slurm::{
    BatchJob, FairshareTable, Job, JobBase, JobState, JobUpdate, Node, NodeBase, NodeState,
    Partition, PriorityWeights, Refresh, SignalTarget, TimeLimit,
};

/// Calls the daemon made.
#[derive(Debug, Default, Clone)]
pub struct Calls {
    pub refreshes: u64,
    pub full_loads: u64,
    pub submits: u64,
    pub updates: u64,
    pub signals: u64,
    pub cancels: u64,
    pub requeues: u64,
}

#[derive(Debug)]
pub struct GenCluster {
    pub nodes: Vec<Node>,
    pub partitions: Vec<Partition>,
    pub jobs: Vec<Job>,
    /// The next refresh reports a change.
    pub dirty: bool,
    pub calls: Calls,
    /// What `priority_inputs` answers (priority/basic by default).
    pub priority: (PriorityWeights, FairshareTable),
    /// What `preemption` answers: PreemptType (`preempt/partition_prio` by default)
    /// and the global PreemptMode (REQUEUE by default).
    pub preempt_type: Option<String>,
    pub preempt_mode: u16,
    next_id: u32,
    /// The SPANK environment and environment of the last job submitted (what tests of
    /// satellites check; only the last, so a long benchmark keeps no list).
    pub last_submit_env: Option<(
        bftrainer_core::spankopt::Entries,
        bftrainer_core::spankopt::Entries,
    )>,
    /// Jobs already ended at the last `purge_ended`.
    ended: std::collections::HashSet<u32>,
}

pub fn node(name: String, parts: &[&str]) -> Node {
    Node {
        name,
        state: NodeState::from_base(NodeBase::Idle),
        partitions: parts.iter().map(|p| p.to_string()).collect(),
        cpus: 64,
        alloc_cpus: Some(0),
        real_memory_mb: 256_000,
        alloc_memory_mb: Some(0),
        free_memory_mb: None,
        gres: None,
        gpus: 0,
        gres_used: None,
        features: Vec::new(),
        active_features: Vec::new(),
        reason: None,
        boot_time: None,
        last_busy: None,
        owner: None,
        weight: 1,
    }
}

/// The small cluster of the daemon's tests: `n` idle nodes n1..nN in `batch` (tier
/// 10), `elastic` (2) and `elastic-sat` (1), and `cores` held elastic core jobs (ids
/// 1..=cores, each `--elastic=spec`) waiting for admission.
pub fn held_cores(n: usize, cores: u32, spec: &str) -> GenCluster {
    let names: Vec<String> = (1..=n).map(|i| format!("n{i}")).collect();
    let parts = ["batch", "elastic", "elastic-sat"];
    let nodes = names.iter().map(|n| node(n.clone(), &parts)).collect();
    let partitions = vec![
        partition("batch", &names, 10),
        partition("elastic", &names, 2),
        partition("elastic-sat", &names, 1),
    ];
    let jobs = (1..=cores)
        .map(|id| {
            let mut j = job(id, "elastic", JobBase::Pending);
            j.admin_comment = Some(format!("bftrainer:v1 {spec},role=core"));
            j.priority = 0;
            j
        })
        .collect();
    GenCluster::new(nodes, partitions, jobs)
}

/// A partition over `nodes` at PriorityTier `tier` (GraceTime 30 s; `batch` is the
/// default one).
pub fn partition(name: &str, nodes: &[String], tier: u16) -> Partition {
    Partition {
        name: name.into(),
        nodes: None,
        node_names: nodes.to_vec(),
        priority_tier: tier,
        priority_job_factor: 1,
        preempt_mode: bftrainer_slurm::Partition::PREEMPT_REQUEUE,
        grace_time_s: 30,
        max_time: None,
        default_time: None,
        total_cpus: 0,
        total_nodes: nodes.len() as u32,
        up: true,
        is_default: name == "batch",
    }
}

pub fn job(id: u32, partition: &str, base: JobBase) -> Job {
    Job {
        job_id: id,
        array_job_id: None,
        array_task_id: None,
        array_task_str: None,
        het_job_id: None,
        het_job_offset: None,
        name: format!("job{id}"),
        user_id: 1000 + id % 50,
        user_name: None,
        group_id: 1000,
        account: None,
        qos: None,
        state: JobState::from_base(base),
        reason: None,
        reason_detail: None,
        partition: Some(partition.to_string()),
        nodes: None,
        sched_nodes: None,
        req_nodes: None,
        exc_nodes: None,
        batch_host: None,
        num_nodes: 1,
        num_cpus: 64,
        comment: None,
        admin_comment: None,
        submit_time: Some(0),
        start_time: None,
        end_time: None,
        time_limit: Some(TimeLimit::Minutes(60)),
        priority: 1000,
        requeue: true,
        restart_count: 0,
        preempt_time: None,
        eligible_time: None,
        work_dir: Some("/tmp".into()),
        std_out: None,
        constraint: None,
        mem_per_node_mb: None,
        mem_per_cpu_mb: None,
        tres_per_node: None,
        tres_per_task: None,
        cpus_per_task: None,
        ntasks_per_node: None,
    }
}

impl GenCluster {
    pub fn new(nodes: Vec<Node>, partitions: Vec<Partition>, jobs: Vec<Job>) -> Self {
        let next_id = jobs.iter().map(|j| j.job_id).max().unwrap_or(0) + 1;
        GenCluster {
            nodes,
            partitions,
            jobs,
            dirty: true,
            calls: Calls::default(),
            priority: Default::default(),
            preempt_type: Some("preempt/partition_prio".into()),
            preempt_mode: bftrainer_slurm::Partition::PREEMPT_REQUEUE,
            next_id,
            last_submit_env: None,
            ended: Default::default(),
        }
    }

    pub fn node_mut(&mut self, name: &str) -> Option<&mut Node> {
        self.nodes.iter_mut().find(|n| n.name == name)
    }

    /// Adds `j` under the next job id (as a submission would), which it returns.
    pub fn add_job(&mut self, mut j: Job) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        j.job_id = id;
        self.jobs.push(j);
        self.dirty = true;
        id
    }

    /// What slurmctld does MinJobAge after a job ended: forgets it. Called once per
    /// MinJobAge, it removes the jobs that had ended by the previous call.
    pub fn purge_ended(&mut self) {
        let old = std::mem::take(&mut self.ended);
        let before = self.jobs.len();
        self.jobs
            .retain(|j| j.state.is_active() || !old.contains(&j.job_id));
        self.ended = self
            .jobs
            .iter()
            .filter(|j| !j.state.is_active())
            .map(|j| j.job_id)
            .collect();
        if self.jobs.len() != before {
            self.dirty = true;
        }
    }

    /// What slurmctld does between two polls for the daemon's own jobs: released
    /// elastic jobs and satellites start on their requested nodes.
    pub fn start_pending_elastic(&mut self, now: i64) {
        for j in &mut self.jobs {
            let ours = j
                .admin_comment
                .as_deref()
                .is_some_and(|c| c.starts_with("bftrainer:"));
            if ours && j.state.base() == JobBase::Pending && j.priority != 0 {
                if let Some(n) = j.req_nodes.clone() {
                    j.state = JobState::from_base(JobBase::Running);
                    j.nodes = Some(n);
                    j.start_time = Some(now);
                    self.dirty = true;
                }
            }
        }
    }
}

/// Job `id`: the table is in id order as the generator and `submit` build it (a binary
/// search, as slurmctld's hash of job ids), else searched in full.
fn find(jobs: &mut [Job], id: u32) -> Option<&mut Job> {
    match jobs.binary_search_by_key(&id, |j| j.job_id) {
        Ok(i) => Some(&mut jobs[i]),
        Err(_) => jobs.iter_mut().find(|j| j.job_id == id),
    }
}

impl Cluster for GenCluster {
    fn refresh(&mut self, full_jobs: bool) -> Result<Refresh> {
        self.calls.refreshes += 1;
        if full_jobs {
            self.calls.full_loads += 1;
        }
        let d = std::mem::take(&mut self.dirty);
        if d {
            // What ClusterView does when the node table changes.
            bftrainer_slurm::assign_partitions(&mut self.nodes, &self.partitions);
        }
        Ok(Refresh {
            nodes: d,
            partitions: d,
            jobs: d || full_jobs,
        })
    }
    fn nodes(&self) -> &[Node] {
        &self.nodes
    }
    fn partitions(&self) -> &[Partition] {
        &self.partitions
    }
    fn jobs(&self) -> &[Job] {
        &self.jobs
    }
    fn submit(&mut self, b: &BatchJob) -> Result<u32> {
        self.calls.submits += 1;
        self.last_submit_env = Some((b.spank_env.clone(), b.env.clone()));
        let id = self.next_id;
        self.next_id += 1;
        let mut j = job(
            id,
            b.partition.as_deref().unwrap_or("batch"),
            JobBase::Pending,
        );
        j.name = b.name.clone().unwrap_or_default();
        j.admin_comment = b.admin_comment.clone();
        j.req_nodes = b.node_list.clone();
        if let Some((u, g)) = b.run_as {
            j.user_id = u;
            j.group_id = g;
        }
        self.jobs.push(j);
        self.dirty = true;
        Ok(id)
    }
    fn update(&mut self, id: u32, u: &JobUpdate) -> Result<()> {
        self.calls.updates += 1;
        if let Some(j) = find(&mut self.jobs, id) {
            if let Some(n) = &u.node_list {
                j.req_nodes = Some(n.clone());
            }
            if let Some(c) = &u.admin_comment {
                j.admin_comment = (!c.is_empty()).then(|| c.clone());
            }
            if let Some(p) = u.priority {
                j.priority = if p == u32::MAX { 1000 } else { p };
            }
        }
        self.dirty = true;
        Ok(())
    }
    fn hold(&mut self, id: u32, _tag: &str) -> Result<()> {
        self.calls.updates += 1;
        if let Some(j) = find(&mut self.jobs, id) {
            j.priority = 0;
        }
        self.dirty = true;
        Ok(())
    }
    fn release(&mut self, id: u32, _tag: &str, comment: &str) -> Result<()> {
        self.calls.updates += 1;
        if let Some(j) = find(&mut self.jobs, id) {
            j.priority = 1000;
            j.comment = Some(comment.to_string());
        }
        self.dirty = true;
        Ok(())
    }
    fn signal(&mut self, _id: u32, _signal: i32, _target: SignalTarget) -> Result<()> {
        self.calls.signals += 1;
        Ok(())
    }
    fn cancel(&mut self, id: u32) -> Result<()> {
        self.calls.cancels += 1;
        if let Some(j) = find(&mut self.jobs, id) {
            j.state = JobState::from_base(JobBase::Cancelled);
        }
        self.dirty = true;
        Ok(())
    }
    fn requeue(&mut self, id: u32, hold: bool) -> Result<()> {
        self.calls.requeues += 1;
        if let Some(j) = find(&mut self.jobs, id) {
            j.state = JobState::from_base(JobBase::Pending);
            j.nodes = None;
            j.restart_count += 1;
            if hold {
                j.priority = 0;
            }
        }
        self.dirty = true;
        Ok(())
    }
    fn compress(&self, names: &[String]) -> String {
        names.join(",")
    }
    fn expand(&self, expr: &str) -> Vec<String> {
        expr.split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }
    fn priority_inputs(&mut self) -> Result<(PriorityWeights, FairshareTable)> {
        Ok(self.priority.clone())
    }
    fn preemption(&mut self) -> Result<bftrainer_slurm::Preemption> {
        Ok(bftrainer_slurm::Preemption {
            preempt_type: self.preempt_type.clone(),
            preempt_mode: self.preempt_mode,
        })
    }
}
