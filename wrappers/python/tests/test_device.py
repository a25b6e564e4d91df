"""The library's choice of device and backend: the GPU of the worker's LOCAL_RANK with
NCCL where CUDA devices are visible, else gloo on the CPU, said on stderr; bad settings
refused with a message that names them."""

import os
import subprocess
import sys

import pytest

from bftrainer import DeviceChoice, choose_device

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def test_without_cuda_it_is_gloo_on_the_cpu_and_says_so():
    for env in ({}, {"CUDA_VISIBLE_DEVICES": "NoDevFiles", "LOCAL_RANK": "1"}, {"CUDA_VISIBLE_DEVICES": "0,1"}):
        c = choose_device(env, 0)
        assert (c.device, c.backend) == ("cpu", "gloo"), env
        assert "no CUDA device" in c.why and "gloo on the CPU" in c.why, c
    c = choose_device({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, 0)
    assert "CUDA_VISIBLE_DEVICES 'NoDevFiles'" in c.why, c
    assert "CUDA_VISIBLE_DEVICES unset" in choose_device({}, 0).why
    assert choose_device({"BFT_BACKEND": "gloo"}, 0).device == "cpu"


def test_on_gpus_each_local_rank_takes_its_own_with_nccl():
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb", "LOCAL_WORLD_SIZE": "2"}
    for local in (0, 1):
        c = choose_device({**env, "LOCAL_RANK": str(local)}, 2)
        assert c == DeviceChoice(
            f"cuda:{local}",
            "nccl",
            f"local rank {local} of 2 on cuda:{local} (2 visible, CUDA_VISIBLE_DEVICES 'GPU-aaaa,GPU-bbbb'), nccl",
        )
    # BFT_LOCAL_RANK when LOCAL_RANK is not set (an older bft-run); 0 without either.
    assert choose_device({"BFT_LOCAL_RANK": "3"}, 4).device == "cuda:3"
    assert choose_device({"LOCAL_RANK": "2", "BFT_LOCAL_RANK": "3"}, 4).device == "cuda:2"
    assert choose_device({}, 8).device == "cuda:0"
    # gloo on GPUs, when asked: the model stays on the GPU.
    assert choose_device({"LOCAL_RANK": "1", "BFT_BACKEND": "gloo"}, 2)[:2] == ("cuda:1", "gloo")


def test_more_workers_than_gpus_share_them_with_gloo_and_are_refused_with_nccl():
    c = choose_device({"LOCAL_RANK": "1", "BFT_BACKEND": "gloo", "LOCAL_WORLD_SIZE": "2"}, 1)
    assert (c.device, c.backend) == ("cuda:0", "gloo")
    assert "shared with local rank 0" in c.why, c
    with pytest.raises(ValueError, match="NCCL cannot put two ranks on one GPU"):
        choose_device({"LOCAL_RANK": "1"}, 1)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"BFT_BACKEND": "mpi"}, "BFT_BACKEND='mpi' is not a backend; give one of: nccl, gloo"),
        ({"BFT_BACKEND": "nccl"}, "BFT_BACKEND=nccl, but this worker sees no CUDA device"),
        ({"LOCAL_RANK": "-1"}, "LOCAL_RANK='-1' is not a local rank"),
        ({"LOCAL_RANK": "one"}, "LOCAL_RANK='one' is not a local rank"),
        ({"LOCAL_RANK": ""}, "LOCAL_RANK='' is not a local rank"),
        ({"LOCAL_RANK": "\u0663"}, "is not a local rank"),  # a digit, but not ASCII
        ({"LOCAL_RANK": "9" * 5000}, "is not a local rank"),
        ({"BFT_LOCAL_RANK": "1.5"}, "BFT_LOCAL_RANK='1.5' is not a local rank"),
    ],
)
def test_bad_settings_are_refused_by_name(env, message):
    with pytest.raises(ValueError) as e:
        choose_device(env, 0)
    assert message in str(e.value)
    assert len(str(e.value)) < 400, "a hostile value is quoted in full"


def test_a_worker_without_cuda_reports_gloo_on_the_cpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA devices")
    code = (
        "import bftrainer; d = bftrainer.device(); d2 = bftrainer.device(); "
        "print(d, bftrainer.backend(), d == d2)"
    )
    env = {**os.environ, "PYTHONPATH": SRC, "CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_RANK": "1", "BFT_WORKER_ID": "4.1"}
    env.pop("BFT_BACKEND", None)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "cpu gloo True", p.stdout
    line = "bftrainer: worker 4.1: no CUDA device (CUDA_VISIBLE_DEVICES '0,1'): gloo on the CPU"
    # Said once, however often it is asked.
    assert p.stderr.count(line) == 1, p.stderr
