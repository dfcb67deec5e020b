"""Several machines through torchrun: 2 nodes x 1 process of 16 examples train like 1 process of 32.

Two ``torchrun --nnodes=2 --nproc-per-node=1 --node-rank=R`` commands, started at once on this machine,
stand for two machines (torchrun's static rendezvous at 127.0.0.1); Lightning finds them through its
``TorchElasticEnvironment`` and takes ``trainer.num_nodes=2``. Both work in the same folder, as machines
with a shared filesystem do. On the CPU (gloo) where the kernels run through Triton's interpreter; where
they run on CUDA, one GPU per node (``CUDA_VISIBLE_DEVICES``, NCCL), skipped on a machine with one GPU.
The single-process run they are compared with trains in this process.
"""

import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from rmsnorm_kernel.ops.tolerances import TOLERANCES, TRAINING_CURVE_RTOL, compare
from rmsnorm_kernel.training.checkpoints import read_checkpoint
from rmsnorm_kernel.training.events import read_scalars
from tests.helpers import QUIET, ROOT

from .helpers import checkpoint_of, train

NODES = 2
STEPS = 16
IMPL = "triton"
SCHEDULE = [
    f"norm={IMPL}",
    f"trainer.max_steps={STEPS}",
    "trainer.val_check_interval=8",
    "checkpoint.every_n_steps=8",
    "data.train_size=512",
    "data.val_size=64",
    "data.test_size=64",
]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
MULTINODE = [
    f"trainer.num_nodes={NODES}",
    "trainer.devices=1",
    "trainer.strategy=ddp",
    "trainer.accelerator=gpu" if GPUS else "trainer.accelerator=cpu",
]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        GPUS == 1, reason="2 nodes need 2 processes on one kind of device: 2 GPUs here, or the CPU (no CUDA at all)"
    ),
]
EVENT_FILE = re.compile(r"events\.out\.tfevents\.\d+\.(?P<host>.+)\.(?P<pid>\d+)\.\d+")


@dataclass
class Node:
    rank: int
    returncode: int
    stdout: str
    stderr: str
    pid: int  # the training process torchrun started on this node (its Hydra folder is node<rank>_<pid>)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tails(nodes) -> str:
    # torchrun's own traceback (some 2,000 characters) follows the training process's: keep room for both
    return "\n".join(f"--- node {n.rank}: exit {n.returncode}, stderr tail:\n{n.stderr[-8000:]}" for n in nodes)


def launch_nodes(cwd: Path, *overrides, timeout=300) -> list[Node]:
    """``train.py`` through one torchrun per node, all started at once in ``cwd``; waits for all of them.

    When one node fails, the others (left waiting for it) are killed after a grace period of 20 s, and
    every node still running after ``timeout`` seconds is killed (exit -9). Each node's
    output goes to ``cwd/node<rank>.stdout`` and ``.stderr``; its Hydra folder is
    ``cwd/outputs/hydra/node<rank>_<pid>``, so the training process of each node is known by its id.
    """
    port = free_port()
    hydra_root = cwd / "outputs" / "hydra"
    before = set(hydra_root.glob("node*_*"))
    procs = []
    for rank in range(NODES):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={NODES}",
            "--nproc-per-node=1",
            f"--node-rank={rank}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            str(ROOT / "train.py"),
            *overrides,
            *QUIET,
            f"hydra.run.dir=outputs/hydra/node{rank}_${{pid:}}",
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if GPUS:
            env["CUDA_VISIBLE_DEVICES"] = str(rank)  # each "machine" has its own GPU
        out, err = open(cwd / f"node{rank}.stdout", "w"), open(cwd / f"node{rank}.stderr", "w")
        # its own session: on failure, torchrun and the process it started are stopped together
        procs.append(
            (subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, env=env, start_new_session=True), out, err)
        )
    deadline, failed_at = time.monotonic() + timeout, None
    while any(p.poll() is None for p, _, _ in procs):
        if failed_at is None and any(p.returncode not in (None, 0) for p, _, _ in procs):
            failed_at = time.monotonic()
        if time.monotonic() > deadline or (failed_at is not None and time.monotonic() > failed_at + 20):
            for p, _, _ in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        time.sleep(0.2)
    nodes = []
    for rank, (p, out, err) in enumerate(procs):
        out.close()
        err.close()
        hydra_dirs = set(hydra_root.glob(f"node{rank}_*")) - before
        pid = int(hydra_dirs.pop().name.rsplit("_", 1)[1]) if len(hydra_dirs) == 1 else -1
        nodes.append(
            Node(
                rank,
                p.returncode,
                (cwd / f"node{rank}.stdout").read_text(),
                (cwd / f"node{rank}.stderr").read_text(),
                pid,
            )
        )
    return nodes


def writer_pids(log_dir: Path) -> set[int]:
    """The processes that wrote TensorBoard event files in a run folder (the file names hold their ids)."""
    pids = set()
    for p in log_dir.iterdir():
        if p.name.startswith("events.out.tfevents."):
            m = EVENT_FILE.fullmatch(p.name)
            assert m, p.name
            pids.add(int(m["pid"]))
    return pids


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """2 nodes x 1 process x 16 examples (two torchrun commands), and 1 process x 32 (in this process).

    The tests read a copy of the 2-node folder; the resume test continues the run in the folder itself
    (a checkpoint remembers the absolute folder it was written to: a copy would not continue it as is)."""
    launch = tmp_path_factory.mktemp("nodes")
    nodes = launch_nodes(launch, *SCHEDULE, *MULTINODE, "data.batch_size=16")
    assert all(n.returncode == 0 for n in nodes), tails(nodes)
    multi = tmp_path_factory.mktemp("nodes_read") / "nodes"
    shutil.copytree(launch, multi)
    single = tmp_path_factory.mktemp("single")
    assert train(single, *SCHEDULE, "data.batch_size=32").ok
    return {"nodes": (multi, nodes), "launch": launch, "single": single}


def test_two_nodes_train_like_one_process_at_the_same_global_batch(runs):
    multi, _ = runs["nodes"]
    nodes, single = read_checkpoint(checkpoint_of(multi, IMPL)), read_checkpoint(checkpoint_of(runs["single"], IMPL))
    assert nodes["global_step"] == single["global_step"] == STEPS
    assert nodes["state_dict"].keys() == single["state_dict"].keys()
    for key, tensor in single["state_dict"].items():
        c = compare(nodes["state_dict"][key], tensor)  # the float32 tolerance of ops/tolerances.py
        assert c.ok, f"{key}: max abs {c.max_abs:.3g}"


def test_two_nodes_log_the_test_mse_and_train_curve_of_one_process(runs):
    multi, _ = runs["nodes"]
    (log_dir,) = (multi / "runs").glob("*/version_*")
    (single_dir,) = (runs["single"] / "runs").glob("*/version_*")
    nodes, single = read_scalars(log_dir), read_scalars(single_dir)
    tol = TOLERANCES[torch.float32]
    (_, a), (_, b) = nodes["test/mse"][-1], single["test/mse"][-1]
    assert math.isclose(a, b, rel_tol=tol.rtol, abs_tol=tol.atol), (a, b)
    assert [s for s, _ in nodes["train/mse"]] == list(range(STEPS))  # one value per step, not one per node
    for (_, a), (_, b) in zip(nodes["train/mse"], single["train/mse"]):
        assert math.isclose(a, b, rel_tol=TRAINING_CURVE_RTOL)
    assert nodes["reload/max_abs_diff"] == [(STEPS, 0.0)]


def test_only_process_0_of_node_0_writes_logs_and_checkpoints(runs):
    multi, (node0, node1) = runs["nodes"]
    assert node0.pid > 0 and node1.pid > 0 and node0.pid != node1.pid
    # one run folder, one checkpoint folder: node 1 claimed no version of its own
    run_dirs = list((multi / "runs").glob("*/version_*"))
    ckpt_dirs = list((multi / "checkpoints").glob("*/version_*"))
    assert len(run_dirs) == 1 and len(ckpt_dirs) == 1, (run_dirs, ckpt_dirs)
    # every checkpoint once, no lock or temporary file left behind
    assert sorted(p.name for p in ckpt_dirs[0].iterdir()) == [
        "end.json",  # the record of the run's end
        "final.ckpt",
        "last.ckpt",
        "step00008.ckpt",
        "step00016.ckpt",
    ]
    # one event-file writer, node 0's training process
    assert writer_pids(run_dirs[0]) == {node0.pid}
    # the summary once, from node 0
    assert node0.stdout.count(f"run {IMPL}_seed0: OK") == 1
    assert f"{IMPL}_seed0" not in node1.stdout
    # both nodes found Lightning's view of torchrun: 2 processes, global ranks 0 and 1
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in node0.stderr and "GLOBAL_RANK: 1, MEMBER: 2/2" in node1.stderr
    # apart from the runs and checkpoints, each process wrote only its own Hydra folder (and the launch logs)
    assert sorted(p.name for p in multi.iterdir()) == [
        "checkpoints",
        "node0.stderr",
        "node0.stdout",
        "node1.stderr",
        "node1.stdout",
        "outputs",
        "runs",
    ]
    assert sorted(p.name for p in (multi / "outputs" / "hydra").iterdir()) == [
        f"node0_{node0.pid}",
        f"node1_{node1.pid}",
    ]


def test_two_nodes_resume_the_run_from_the_shared_folder(runs):
    """Every node reads the checkpoint it resumes (a shared filesystem); node 0 alone writes on. The run had
    ended, so extending it branches: a second version folder, the first one left as it was."""
    launch = runs["launch"]
    first_ckpt_dir = next((launch / "checkpoints").glob("*/version_0"))
    first_files = {p.name: p.read_bytes() for p in first_ckpt_dir.iterdir()}
    nodes = launch_nodes(
        launch, *SCHEDULE, *MULTINODE, "data.batch_size=16", f"trainer.max_steps={STEPS + 8}", "ckpt_path=last"
    )
    assert all(n.returncode == 0 for n in nodes), tails(nodes)
    node0, node1 = nodes
    assert {p.name: p.read_bytes() for p in first_ckpt_dir.iterdir()} == first_files  # nothing replaced
    (log_dir,) = (launch / "runs").glob("*/version_1")  # the branch
    (ckpt_dir,) = (launch / "checkpoints").glob("*/version_1")
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["end.json", "final.ckpt", "last.ckpt", "step00024.ckpt"]
    assert read_checkpoint(ckpt_dir / "final.ckpt")["global_step"] == STEPS + 8
    assert [s for s, _ in read_scalars(log_dir)["train/mse"]] == list(range(STEPS, STEPS + 8))
    assert writer_pids(log_dir) == {node0.pid}  # node 1 wrote no event file
    assert node0.stdout.count(f"run {IMPL}_seed0: OK") == 1 and f"{IMPL}_seed0" not in node1.stdout
