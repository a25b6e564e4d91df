//! GPU-granular lending live (`[gpu_lending]`): the idle GPUs of a node that regular
//! jobs share are lent to an elastic job one GPU at a time, as satellites of one GPU,
//! and taken back when a regular job claims them.

mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;

use live::{Live, GRACE_TIME_S};
use std::os::unix::fs::PermissionsExt;
use std::time::Instant;

/// GPU satellites of `parent` (partition shared-sat) that run: job ids.
fn gpu_satellites(l: &Live, parent: u32) -> Vec<u32> {
    l.squeue()
        .into_iter()
        .filter(|r| {
            r.name == format!("bftsat-{parent}")
                && r.state == "RUNNING"
                && r.partition == "shared-sat"
                && r.nodes == "n2"
        })
        .map(|r| r.id)
        .collect()
}

/// n2's GPU slots as `bftrainer nodes --json` shows them: (name, state, why, holder).
fn gpu_slots(l: &Live) -> Vec<(String, String, String, Option<u64>)> {
    let v = l.cli_json("nodes");
    v.as_array()
        .map(|a| {
            a.iter()
                .filter(|n| n["name"].as_str().is_some_and(|s| s.starts_with("n2/gpu")))
                .map(|n| {
                    (
                        n["name"].as_str().unwrap_or_default().to_string(),
                        n["state"].as_str().unwrap_or_default().to_string(),
                        n["why"].as_str().unwrap_or_default().to_string(),
                        n["holder"].as_u64(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The GPUs (CUDA_VISIBLE_DEVICES) a job wrote to `file`, once it has.
fn gpus_in(l: &Live, file: &std::path::Path) -> Vec<String> {
    let text = l.wait(60, &format!("{} to be written", file.display()), || {
        std::fs::read_to_string(file)
            .ok()
            .filter(|t| t.ends_with('\n'))
    });
    let mut v: Vec<String> = text.trim().split(',').map(str::to_string).collect();
    v.sort();
    v
}

/// A regular job in partition `shared` on n2 asking 2 GPUs; it writes the GPUs it
/// got to `out`.
fn regular_on_n2(l: &Live, out: &std::path::Path) -> u32 {
    let cmd = format!(
        "echo \"$CUDA_VISIBLE_DEVICES\" > {}; exec sleep 600",
        out.display()
    );
    l.c.sbatch(&[
        "-p",
        "shared",
        "-w",
        "n2",
        "-n1",
        "--gres=gpu:a100:2",
        "-o",
        "/dev/null",
        "--wrap",
        &cmd,
    ])
    .unwrap()
}

#[test]
fn cluster_gpulend_lends_idle_gpus_of_a_shared_node_and_takes_them_back() {
    // n1: a whole GPU node of the elastic partitions; n2: 4 GPUs that regular jobs
    // share (partitions shared and shared-sat, `cluster up --shared-gpus 2`).
    let s = live::setup_sized(
        "bftd-gpulend",
        2,
        "",
        "[gpu_lending]\npartitions = [\"shared\"]\nsatellite_partition = \"shared-sat\"",
        &|join: &std::path::Path| {
            let seen = join.with_file_name("seen");
            std::fs::create_dir_all(&seen).unwrap();
            std::fs::set_permissions(&seen, std::fs::Permissions::from_mode(0o777)).unwrap();
            let script = join.with_file_name("join-gpu.sh");
            // Written from inside the satellite's step, where its worker runs.
            std::fs::write(
                &script,
                format!(
                    "#!/bin/sh\necho \"${{CUDA_VISIBLE_DEVICES:-none}}\" > {}/$SLURM_JOB_ID\nexec sleep 3600\n",
                    seen.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
            format!("{} {{parent}}", script.display())
        },
    );
    let seen = s.dir.join("seen");
    // Two nodes, but up to 5 lent units (n1 and n2's four GPUs).
    let conf = std::fs::read_to_string(&s.conf).unwrap();
    std::fs::write(&s.conf, conf.replace("max_nodes = 2\n", "max_nodes = 5\n")).unwrap();
    let mut l = Live::from_setup_with(
        s,
        bftrainer_testcluster::Options {
            gpus: Some("a100:4".into()),
            shared_gpus: Some("2".into()),
            ..Default::default()
        },
    );
    let out = l.dir.join("regular");
    std::fs::create_dir_all(&out).unwrap();
    // A regular job holds 2 of n2's 4 GPUs.
    let first = regular_on_n2(&l, &out.join("first"));
    let first_gpus = gpus_in(&l, &out.join("first"));
    assert_eq!(first_gpus.len(), 2, "{first_gpus:?}");
    // n1, the only whole node, is taken by a regular job too.
    let blocker = l.regular(1, 600);
    l.wait(60, "the regular job on n1", || {
        (l.state_of(blocker) == "RUNNING").then_some(())
    });
    l.spawn();
    // An elastic job of 1 GPU per node, and one asking no GPU: n2's idle GPUs could
    // serve them, but a core holds whole nodes of its partition, so both wait (and
    // say why) while n1 is taken.
    let job = l.submit_elastic_with("1:5", &["--gres=gpu:a100:1"]);
    let cpu_job = l.submit_elastic("1:2");
    l.wait(60, "both elastic jobs to be reported waiting", || {
        let log = l.log_text();
        (log.contains(&format!("elastic job {job} is not admitted: it asks 1 GPUs of type a100 per node and 0 of the idle nodes"))
            && log.contains(&format!("elastic job {cpu_job} is not admitted: 0 whole nodes bftrainerd may lend are idle and its core needs 1")))
        .then_some(())
    });
    l.cycles_later(5);
    let log = l.log_text();
    assert!(
        !log.contains("admit job"),
        "admitted without a whole node:\n{log}"
    );
    assert_eq!(l.active_satellites(job) + l.active_satellites(cpu_job), 0);
    l.c.run("scancel", &[&cpu_job.to_string()]).unwrap();
    l.c.run("scancel", &[&blocker.to_string()]).unwrap();
    // n1 is free: the GPU job's core goes there, and n2's 2 idle GPUs are lent to it as
    // two satellites of one GPU each.
    let sats = l.wait(
        90,
        "the job's core on n1 and two GPU satellites on n2",
        || {
            let core = l.squeue().into_iter().find(|r| r.id == job)?;
            let sats = gpu_satellites(&l, job);
            (core.state == "RUNNING" && core.nodes == "n1" && sats.len() == 2).then_some(sats)
        },
    );
    let mut lent: Vec<String> = Vec::new();
    for sat in &sats {
        let got = gpus_in(&l, &seen.join(sat.to_string()));
        assert_eq!(got.len(), 1, "satellite {sat} sees {got:?}: one GPU each");
        lent.extend(got);
    }
    lent.sort();
    let all: Vec<String> = (0..4).map(|k| k.to_string()).collect();
    let mut both = lent.clone();
    both.extend(first_gpus.iter().cloned());
    both.sort();
    assert_eq!(
        both, all,
        "lent {lent:?} beside the regular job's {first_gpus:?}"
    );
    let log = l.log_text();
    assert!(
        log.contains(&format!("grow job {job} onto n2/gpu")),
        "the growth names GPU slots:\n{log}"
    );

    // bftrainerd killed with -9 and started again: it finds the two GPU satellites,
    // binds each to one of the job's GPU slots (from its journal) and keeps both: none
    // cancelled, none added, for 5 cycles after it has bound them.
    l.kill9();
    let mark = l.log_text().len();
    l.spawn();
    l.wait(
        60,
        "the restarted daemon to bind both GPU satellites",
        || {
            let log = l.log_text();
            let after = log.get(mark..).unwrap_or("");
            sats.iter()
                .all(|s| {
                    after.contains(&format!(
                        "satellite {s} of job {job} on n2: GPU slot n2/gpu"
                    ))
                })
                .then_some(())
        },
    );
    l.cycles_later(5);
    let mut now = gpu_satellites(&l, job);
    now.sort_unstable();
    let mut before = sats.clone();
    before.sort_unstable();
    assert_eq!(now, before, "{:#?}", l.squeue());
    assert_eq!(l.active_satellites(job), 2, "{:#?}", l.squeue());
    let log = l.log_text();
    let after = &log[mark..];
    assert!(
        !after.contains("cancel") && !after.contains("shrink") && !after.contains("grow job"),
        "the restart changed the satellites:\n{after}"
    );
    let slots = gpu_slots(&l);
    let held = slots
        .iter()
        .filter(|(_, _, _, holder)| *holder == Some(u64::from(job)))
        .count();
    assert_eq!(held, 2, "{slots:?}");

    // A regular job asks the 2 lent GPUs: Slurm preempts both satellites, the job
    // starts within GraceTime + 5 s and gets exactly those GPUs.
    let t0 = Instant::now();
    let second = regular_on_n2(&l, &out.join("second"));
    l.wait(60, "the second regular job to run", || {
        (l.state_of(second) == "RUNNING").then_some(())
    });
    let waited = t0.elapsed().as_secs_f64();
    println!("regular job on the lent GPUs started {waited:.2} s after its submission");
    assert!(
        waited <= GRACE_TIME_S as f64 + 5.0,
        "the regular job waited {waited:.1} s for lent GPUs"
    );
    assert_eq!(gpus_in(&l, &out.join("second")), lent);
    // The elastic job runs on in its core; once the reclaim hold is over, bftrainerd
    // sees all four GPUs of n2 held by regular jobs and lends none of them: no
    // satellite of the job waits or runs there, and none was submitted since.
    l.wait(60, "n2's GPU slots all claimed by regular jobs", || {
        let slots = gpu_slots(&l);
        (slots.len() == 4
            && slots.iter().all(|(_, state, why, holder)| {
                state == "busy" && why == "regular_job" && holder.is_none()
            }))
        .then_some(())
    });
    assert_eq!(l.active_satellites(job), 0, "{:#?}", l.squeue());
    assert_eq!(l.state_of(job), "RUNNING");
    assert_eq!(l.state_of(first), "RUNNING");
    let log = l.log_text();
    for sat in &sats {
        assert!(
            log.contains(&format!(
                "satellite {sat} of job {job} on n2: preempted by a regular job"
            )),
            "satellite {sat}'s preemption not seen:\n{log}"
        );
    }
    let preempted = log.find("preempted by a regular job").unwrap();
    assert!(
        !log[preempted..].contains(&format!("grow job {job} onto n2")),
        "GPUs lent again while the regular jobs hold n2:\n{log}"
    );

    // The GPUs come free again: lent again.
    l.c.run("scancel", &[&second.to_string()]).unwrap();
    l.wait(90, "two GPU satellites again", || {
        (gpu_satellites(&l, job).len() == 2).then_some(())
    });
    // The first regular job ends too: n2 is wholly idle (as an inference pool's node
    // between requests) and all four of its GPUs are lent, one satellite each, each
    // seeing one GPU of its own (the job's MAX, 5, is its core and four slots).
    l.c.run("scancel", &[&first.to_string()]).unwrap();
    let sats = l.wait(90, "four GPU satellites on the idle n2", || {
        let sats = gpu_satellites(&l, job);
        (sats.len() == 4 && sats.iter().all(|s| seen.join(s.to_string()).exists())).then_some(sats)
    });
    let mut got: Vec<String> = sats
        .iter()
        .flat_map(|s| {
            let g = gpus_in(&l, &seen.join(s.to_string()));
            assert_eq!(g.len(), 1, "satellite {s} sees {g:?}: one GPU each");
            g
        })
        .collect();
    got.sort();
    assert_eq!(got, all, "n2's four GPUs, one to each satellite");
}
