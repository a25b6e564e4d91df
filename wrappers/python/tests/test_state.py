import pytest

torch = pytest.importorskip("torch")

import bftrainer  # noqa: E402
from bftrainer.elastic import _is_peer_failure  # noqa: E402


def make(tmp_path=None, every=0):
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
    )


def train_step(s):
    idx = s.sampler.take()
    s.optimizer.zero_grad()
    s.model(torch.ones(len(idx), 3)).sum().backward()
    s.optimizer.step()
    s.best = s.best / 2


def test_restore_goes_back_to_the_last_commit_exactly():
    s = make()
    train_step(s)
    s.save()
    s.step = 1
    s.save()
    kept = {k: v.clone() for k, v in s.model.state_dict().items()}
    kept_opt = s.optimizer.state_dict()["state"][0]["momentum_buffer"].clone()
    train_step(s)
    train_step(s)
    assert s.sampler.consumed == 6 and s.best == 0.125
    s.restore()
    assert s.sampler.consumed == 2 and s.best == 0.5 and s.step == 1
    for k, v in s.model.state_dict().items():
        assert torch.equal(v, kept[k])
    assert torch.equal(s.optimizer.state_dict()["state"][0]["momentum_buffer"], kept_opt)
    # The saved copy does not share storage with the live model.
    train_step(s)
    s.restore()
    for k, v in s.model.state_dict().items():
        assert torch.equal(v, kept[k])


def test_a_newcomer_without_commit_restores_to_nothing():
    s = make()
    s.restore()
    assert s.committed_step == -1


def test_checkpoint_every_n_commits_and_resume(tmp_path):
    s = make(tmp_path, every=2)
    for _ in range(3):
        train_step(s)
        s.commit()  # standalone: rank 0, world 1
    t = make(tmp_path, every=2)
    assert t.load_checkpoint()
    assert t.step == 2 and t.sampler.consumed == 4 and t.best == 0.25
    assert t.committed_step == 2


def test_bad_state_arguments_are_refused():
    with pytest.raises(ValueError, match="may not be named"):
        bftrainer.State(step=3)
    with pytest.raises(ValueError, match="needs checkpoint_dir"):
        bftrainer.State(checkpoint_every=5)
    with pytest.raises(ValueError, match="0 \\(off\\) or positive"):
        bftrainer.State(checkpoint_every=-1)


def test_only_communication_errors_count_as_a_peer_failure():
    assert _is_peer_failure(RuntimeError("[gloo/transport/tcp/pair.cc:545] Read error: Connection reset by peer"))
    assert _is_peer_failure(bftrainer.PeerFailure("x"))
    assert not _is_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not _is_peer_failure(ValueError("gloo"))


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
    import os
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
