import os
import random
import threading

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import bftrainer  # noqa: E402
from bftrainer.elastic import _is_peer_failure  # noqa: E402
from bftrainer.state import CheckpointError  # noqa: E402


def make(tmp_path=None, every=0, **kw):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = bftrainer.ElasticSampler(10, 2, world=lambda: (0, 1))
    return bftrainer.State(
        model=model,
        optimizer=opt,
        sampler=sampler,
        checkpoint_dir=str(tmp_path) if tmp_path else None,
        checkpoint_every=every,
        best=1.0,
        **kw,
    )


def train_step(s):
    idx = s.sampler.take()
    s.optimizer.zero_grad()
    s.model(torch.ones(len(idx), 3)).sum().backward()
    s.optimizer.step()
    s.best = s.best / 2


def model_and_momentum(s):
    return (
        {k: v.clone() for k, v in s.model.state_dict().items()},
        s.optimizer.state_dict()["state"][0]["momentum_buffer"].clone(),
    )


def assert_model_and_momentum(s, kept):
    for k, v in s.model.state_dict().items():
        assert torch.equal(v, kept[0][k])
    assert torch.equal(s.optimizer.state_dict()["state"][0]["momentum_buffer"], kept[1])


# -- rollback ----------------------------------------------------------------------------


def test_a_clean_rollback_puts_back_the_small_parts_and_leaves_model_and_optimizer():
    """copy=False, not dirty: the failure came before the optimizer stepped, so model
    and optimizer are the commit; step, sampler, extras and learning rate come back."""
    s = make()
    train_step(s)
    s.step = 1
    s.save()
    assert s._copy is None  # no copy of model or optimizer is kept
    kept = model_and_momentum(s)
    s.sampler.take()
    s.best = 7.0
    s.step = 2
    s.optimizer.param_groups[0]["lr"] = 5.0  # e.g. a scheduler stepped before the collective
    s.restore(dirty=False)
    assert s.sampler.consumed == 2 and s.best == 0.5 and s.step == 1 and s.committed_step == 1
    assert s.optimizer.param_groups[0]["lr"] == 0.1
    assert_model_and_momentum(s, kept)
    s.restore()  # no argument: not dirty
    assert s.committed_step == 1


def test_a_dirty_rollback_with_copy_restores_model_and_optimizer_from_the_cpu_copy():
    s = make(copy=True)
    train_step(s)
    s.step = 1
    s.save()
    kept = model_and_momentum(s)
    bufs = [id(t) for t in s._copy_bufs.values()]
    assert all(t.device.type == "cpu" for t in s._copy_bufs.values())
    train_step(s)
    train_step(s)
    s.restore(dirty=True)
    assert s.sampler.consumed == 2 and s.best == 0.5 and s.step == 1 and s.committed_step == 1
    assert_model_and_momentum(s, kept)
    # The copy does not share storage with the live model or optimizer.
    train_step(s)
    s.restore(dirty=True)
    assert_model_and_momentum(s, kept)
    # The next commit refreshes the copy in the same CPU tensors.
    train_step(s)
    s.step = 2
    s.save()
    assert [id(t) for t in s._copy_bufs.values()] == bufs
    kept2 = model_and_momentum(s)
    train_step(s)
    s.restore(dirty=True)
    assert_model_and_momentum(s, kept2)


def test_a_rollback_after_the_optimizer_stepped_is_dirty_whatever_the_caller_says():
    """Under HSDP nothing marks a step dirty (FSDP's reductions end inside backward): a
    collective of the script's own failing after opt.step() came back as not dirty, and
    the stepped model stayed, to be stepped again by the rerun of the step."""
    s = make(copy=True)
    train_step(s)
    s.step = 1
    s.save()
    kept = model_and_momentum(s)
    train_step(s)  # opt.step(), then the failure
    s.restore(dirty=False)
    assert s.committed_step == 1
    assert_model_and_momentum(s, kept)
    # Without a copy it cannot roll back in place: it asks a peer.
    s = make()
    train_step(s)
    s.step = 1
    s.save()
    train_step(s)
    s.restore(dirty=False)
    assert s.committed_step == -1
    # A step that failed before opt.step() stays clean: only the small parts come back.
    s = make()
    train_step(s)
    s.step = 1
    s.save()
    s.sampler.take()
    s.restore(dirty=False)
    assert s.committed_step == 1 and s.sampler.consumed == 2


def test_a_dirty_rollback_without_copy_asks_a_peer_for_the_state(capsys):
    s = make()
    train_step(s)
    s.step = 1
    s.save()
    train_step(s)
    s.restore(dirty=True)
    assert s.committed_step == -1
    assert s.sampler.consumed == 2 and s.best == 0.5 and s.step == 1  # the small parts came back
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot roll back to step 1 in place" in err and "receives the state of a peer" in err
    # A second failure before the sync: still nothing to roll back to, said once.
    s.restore(dirty=False)
    assert s.committed_step == -1 and capsys.readouterr().err == ""


def test_a_transfer_cut_short_leaves_no_commit_unless_a_copy_exists():
    for copy in (False, True):
        s = make(copy=copy)
        train_step(s)
        s.step = 1
        s.save()
        kept = model_and_momentum(s)
        s._receiving()
        with torch.no_grad():
            s.model.weight.fill_(123.0)  # half of a state arrived
        s.restore(dirty=False)
        if copy:
            assert s.committed_step == 1
            assert_model_and_momentum(s, kept)
        else:
            assert s.committed_step == -1 and not s._intact


def test_a_newcomer_without_commit_restores_to_nothing():
    s = make()
    s.restore()
    assert s.committed_step == -1
    s.restore(dirty=True)
    assert s.committed_step == -1


# -- scheduler, scaler, RNG, extras with state_dict --------------------------------------


def test_scheduler_and_scaler_are_committed_rolled_back_and_checkpointed(tmp_path):
    def build():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        return bftrainer.State(model=model, optimizer=opt, scheduler=sched, scaler=scaler,
                               checkpoint_dir=str(tmp_path))

    s = build()
    s.scaler.scale(s.model(torch.ones(1, 3)).sum()).backward()
    s.scaler.step(s.optimizer)
    s.scaler.update(new_scale=512.0)
    s.scheduler.step()
    s.step = 1
    s.save()
    s.scheduler.step()
    s.scheduler.step()
    s.scaler.update(new_scale=8.0)
    assert s.optimizer.param_groups[0]["lr"] == 0.0125
    s.restore()
    assert s.scheduler.last_epoch == 1 and s.scheduler.get_last_lr() == [0.05]
    assert s.optimizer.param_groups[0]["lr"] == 0.05
    assert s.scaler.get_scale() == 512.0
    s.write_checkpoint()
    s.wait_checkpoint()
    t = build()
    assert t.load_checkpoint()
    assert t.scheduler.state_dict() == s.scheduler.state_dict()
    assert t.scaler.state_dict() == s.scaler.state_dict()
    assert t.optimizer.param_groups[0]["lr"] == 0.05 and len(t.optimizer.state_dict()["state"]) == 2


def test_a_scheduler_given_as_an_extra_keeps_driving_the_live_optimizer():
    s = make()
    s2 = bftrainer.State(model=s.model, optimizer=s.optimizer,
                         sched=torch.optim.lr_scheduler.StepLR(s.optimizer, step_size=1, gamma=0.5))
    sched = s2.sched
    s.optimizer.step()  # no gradients: changes nothing (the scheduler wants a step first)
    s2.save()
    sched.step()
    s2.restore()
    assert s2.sched is sched and sched.optimizer is s.optimizer and sched.last_epoch == 0
    assert s.optimizer.param_groups[0]["lr"] == 0.1
    sched.step()
    assert s.optimizer.param_groups[0]["lr"] == 0.05


def draws():
    return torch.rand(3).tolist(), random.random(), float(np.random.rand())


def test_rng_state_is_rolled_back_so_a_retaken_step_draws_the_same_numbers():
    s = make()
    s.save()
    first = draws()
    s.restore()
    assert draws() == first
    off = make(rng=False)
    off.save()
    first = draws()
    off.restore()
    assert draws() != first
    assert "rng" not in s.state_dict() and "rng" not in s._payload()  # per rank: never sent


def test_extras_that_cannot_be_committed_are_refused_naming_them():
    with pytest.raises(TypeError, match=r"state extra 'cfg'\['f'\] is a builtins.function"):
        bftrainer.State(cfg={"f": lambda: 1})
    s = make()
    s.best = threading.Lock()
    with pytest.raises(TypeError, match=r"state extra 'best' is a _thread.lock"):
        s.save()


def test_bad_state_arguments_are_refused():
    with pytest.raises(ValueError, match="may not be named"):
        bftrainer.State(step=3)
    with pytest.raises(ValueError, match="may not be named"):
        bftrainer.State(commit=3)
    with pytest.raises(ValueError, match="needs checkpoint_dir"):
        bftrainer.State(checkpoint_every=5)
    with pytest.raises(ValueError, match="0 \\(off\\) or positive"):
        bftrainer.State(checkpoint_every=-1)
    with pytest.raises(TypeError, match="scheduler must have state_dict"):
        bftrainer.State(scheduler=3)


# -- checkpoints ---------------------------------------------------------------------------


def test_checkpoint_every_n_commits_and_resume(tmp_path):
    s = make(tmp_path, every=2)
    for _ in range(3):
        train_step(s)
        s.commit()  # standalone: rank 0, world 1
    s.wait_checkpoint()
    t = make(tmp_path, every=2)
    assert t.load_checkpoint()
    assert t.step == 2 and t.sampler.consumed == 4 and t.best == 0.25
    assert t.committed_step == 2


def test_a_checkpoint_holds_only_what_a_weights_only_load_reads(tmp_path):
    s = make(tmp_path, odd={0: (float("nan"), None, "x"), "t": torch.arange(3)})
    train_step(s)
    s.commit()
    s.write_checkpoint()
    s.wait_checkpoint()
    d = torch.load(s.checkpoint_path(), weights_only=True)
    assert d["bftrainer"] == 2 and d["state"]["step"] == 1 and d["state"]["extras"]["odd"][0][2] == "x"
    assert set(d["state"]) == {"step", "extras", "model", "optimizer", "sampler"}


ran = []


def _side_effect():
    ran.append(1)
    return {}


class Evil:
    def __reduce__(self):
        return (_side_effect, ())


def test_a_checkpoint_with_code_in_it_is_refused_without_running_it(tmp_path):
    s = make(tmp_path)
    torch.save({"bftrainer": 2, "job": None, "state": Evil()}, s.checkpoint_path())
    with pytest.raises(CheckpointError, match="weights-only load refuses"):
        s.load_checkpoint()
    assert ran == []


def test_a_checkpoint_of_another_job_is_refused_unless_asked_for(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BFT_JOB", "4242")
    s = make(tmp_path)
    train_step(s)
    s.commit()
    s.write_checkpoint()
    s.wait_checkpoint()
    assert make(tmp_path).load_checkpoint()  # the same job (a requeue): resumes
    monkeypatch.setenv("BFT_JOB", "777")
    with pytest.raises(CheckpointError) as e:
        make(tmp_path).load_checkpoint()
    msg = str(e.value)
    assert "job '4242'" in msg and "job '777'" in msg and s.checkpoint_path() in msg
    assert "State(..., resume_any_job=True)" in msg
    monkeypatch.delenv("BFT_JOB")
    with pytest.raises(CheckpointError, match="this is job none \\(BFT_JOB is not set"):
        make(tmp_path).load_checkpoint()
    t = make(tmp_path, resume_any_job=True)
    assert t.load_checkpoint() and t.step == 1 and t.committed_step == 1
    assert "resumes from the checkpoint" in capsys.readouterr().err


def test_checkpoints_are_written_in_the_background_one_at_a_time(tmp_path, monkeypatch, capsys):
    s = make(tmp_path)
    s.save()
    release = threading.Event()
    started = threading.Event()
    real_save = torch.save

    def slow_save(obj, f):
        started.set()
        release.wait(10)
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", slow_save)
    assert s.write_checkpoint()
    started.wait(10)
    # The snapshot is taken at the call: training on does not change what is written.
    train_step(s)
    s.step = 5
    assert not s.write_checkpoint() and not s.write_checkpoint()  # in flight: skipped
    err = capsys.readouterr().err
    assert err.count("skipped") == 1 and "previous one is still being written" in err
    assert not os.path.exists(s.checkpoint_path())
    release.set()
    s.wait_checkpoint()
    assert torch.load(s.checkpoint_path(), weights_only=True)["state"]["step"] == 0
    assert [f for f in os.listdir(tmp_path) if ".tmp." in f] == []


def test_an_error_in_the_writer_is_reported_and_raised_by_wait_checkpoint(tmp_path, monkeypatch, capsys):
    s = make(tmp_path)
    s.save()

    def broken_save(obj, f):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    s.write_checkpoint()
    with pytest.raises(OSError, match="No space left on device"):
        s.wait_checkpoint()
    err = capsys.readouterr().err
    assert f"writing checkpoint {s.checkpoint_path()} (step 0) failed" in err
    assert [f for f in os.listdir(tmp_path) if ".tmp." in f] == []
    s.wait_checkpoint()  # raised once


# -- memory ---------------------------------------------------------------------------------


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status")


def test_a_commit_without_copy_costs_no_memory_of_the_model_size(capsys):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(12)])  # 50M params, 201 MB
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    model(torch.ones(1, 2048)).sum().backward()
    opt.step()  # Adam's moments: 2 x the model
    sampler = bftrainer.ElasticSampler(1000, 10, world=lambda: (0, 1))
    figures = {}
    for copy in (False, True):
        s = bftrainer.State(model=model, optimizer=opt, sampler=sampler, copy=copy, best=1.0)
        s.commit()
        before = rss_mb()
        for _ in range(5):
            s.commit()
        steady = rss_mb() - before
        figures[copy] = (before, steady)
        if not copy:
            grown_first = before
    with capsys.disabled():
        print(f"\nmodel {size:.0f} MB (+ Adam {2 * size:.0f} MB): RSS {figures[False][0]:.0f} MB; "
              f"5 commits copy=False +{figures[False][1]:.1f} MB; "
              f"first commit copy=True +{figures[True][0] - grown_first:.0f} MB, then 5 commits +{figures[True][1]:.1f} MB")
    assert figures[False][1] < 5
    assert figures[True][0] - grown_first > 2.5 * size  # the CPU copy of model and optimizer
    assert figures[True][1] < 5  # kept in the same buffers


# -- runtime ------------------------------------------------------------------------------


def test_only_communication_errors_count_as_a_peer_failure():
    assert _is_peer_failure(RuntimeError("[gloo/transport/tcp/pair.cc:545] Read error: Connection reset by peer"))
    assert _is_peer_failure(bftrainer.PeerFailure("x"))
    assert not _is_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not _is_peer_failure(ValueError("gloo"))
    # An error raised while a peer failure was handled (torch's c10d logging wrapper
    # asks get_backend of a group outside its tables): still a peer failure.
    try:
        try:
            raise RuntimeError("collective was abandoned (a member failed): member(s) 2.0 failed")
        except RuntimeError:
            raise ValueError("Process group <ElasticGroup> is not initialized in the world group map")
    except ValueError as e:
        assert _is_peer_failure(e)
    try:
        try:
            raise KeyError("x")
        except KeyError:
            raise ValueError("unrelated")
    except ValueError as e:
        assert not _is_peer_failure(e)


def test_standalone_run_trains_alone(capsys):
    s = make()

    @bftrainer.run
    def train(state):
        for _ in state.sampler:
            state.commit()
        return state.step

    assert train(s) == 5
    assert bftrainer.world_size() == 1 and bftrainer.rank() == 0
    assert "training alone" in capsys.readouterr().err


def test_a_job_killed_and_started_again_resumes_from_its_checkpoint(tmp_path):
    """What a requeued core job does: the same command again, same checkpoint dir."""
    import subprocess
    import sys
    import time

    example = os.path.join(os.path.dirname(__file__), "..", "examples", "train.py")
    args = [sys.executable, example, "--samples", "512", "--batch", "16", "--epochs", "4",
            "--step-sleep", "0.01", "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "10",
            "--timeline", str(tmp_path / "tl")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BFT_")}
    p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (tmp_path / "tl").exists() and len((tmp_path / "tl").read_text().splitlines()) > 40:
            break
        time.sleep(0.05)
    p.kill()
    p.wait()
    killed_at = len((tmp_path / "tl").read_text().splitlines())
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    steps = [int(line.split()[1]) for line in (tmp_path / "tl").read_text().splitlines()]
    resumed = steps[killed_at]
    assert 10 < resumed <= killed_at + 1, f"resumed at step {resumed} after a kill at {killed_at}"
    assert resumed % 10 == 1  # the step after the last checkpoint
    # The sampler's position came back with the model: the budget is met exactly.
    assert "after 128 steps, 2048 samples" in out.stdout, out.stdout
