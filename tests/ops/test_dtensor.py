"""DTensor inputs on 2 CPU processes (gloo): rows sharded along a leading dimension, or replicated, with a
replicated gamma give the single-process oracle's y, dx and dgamma; a shard of the normalized dimension is
refused."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from rmsnorm_kernel.ops.backend import INTERPRETER, backend

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        backend() != INTERPRETER or not torch.distributed.is_available(),
        reason="2 processes on the CPU, where the kernels run in Triton's interpreter",
    ),
]

WORLD = 2
#: (name, global shape of x, its placement as (kind, dim))
LAYOUTS = [
    ("rows", (6, 33), ("shard", 0)),  # data parallel: rows split between the processes
    ("sequence", (2, 6, 33), ("shard", 1)),  # sequence parallel: (batch, seq, hidden) split along seq
    ("replicated", (4, 33), ("replicate", None)),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        from rmsnorm_kernel import ContractError, RMSNorm, oracle, rmsnorm
        from rmsnorm_kernel.ops.reference import add_oracle
        from rmsnorm_kernel.ops.tolerances import compare
        from rmsnorm_kernel.testing import make_inputs

        mesh = init_device_mesh("cpu", (WORLD,))
        lines = []
        for name, shape, (kind, dim) in LAYOUTS:
            x, gamma, dy = make_inputs(shape, torch.float32, "cpu")
            placement = [Shard(dim)] if kind == "shard" else [Replicate()]
            x_dt = distribute_tensor(x, mesh, placement).requires_grad_()
            g_dt = distribute_tensor(gamma, mesh, [Replicate()]).requires_grad_()
            y = rmsnorm(x_dt, g_dt)
            y.backward(distribute_tensor(dy, mesh, placement))
            want = oracle(x, gamma, dy)
            got = (y.full_tensor(), x_dt.grad.full_tensor(), g_dt.grad.full_tensor())
            ok = [compare(g.detach(), w).ok for g, w in zip(got, want)]
            lines.append(f"{name} {y.placements == x_dt.placements} {ok}")
        # a plain weight, as an RMSNorm module holds it (2-D normalized_shape: a reshaped, non-leaf weight)
        x, gamma, dy = make_inputs((6, 32), torch.float32, "cpu")
        module = RMSNorm((2, 16), eps=1e-6)
        with torch.no_grad():
            module.weight.copy_(gamma.reshape(2, 16))
        x_dt = distribute_tensor(x.reshape(6, 2, 16), mesh, [Shard(0)]).requires_grad_()
        module(x_dt).backward(distribute_tensor(dy.reshape(6, 2, 16), mesh, [Shard(0)]))
        want = oracle(x, gamma, dy)
        got = (x_dt.grad.full_tensor().reshape(6, 32), module.weight.grad.reshape(32))  # a plain gradient
        lines.append(f"module {[compare(g, w).ok for g, w in zip(got, want[1:])]}")
        # the fused residual add, rows sharded
        x, gamma, dy = make_inputs((6, 33), torch.float32, "cpu")
        residual, _, dh = make_inputs((6, 33), torch.float32, "cpu", seed=1)
        leaves = [distribute_tensor(t, mesh, [Shard(0)]).requires_grad_() for t in (x, residual)]
        g_dt = distribute_tensor(gamma, mesh, [Replicate()]).requires_grad_()
        y, h = rmsnorm(leaves[0], g_dt, residual=leaves[1])
        torch.autograd.backward([y, h], [distribute_tensor(t, mesh, [Shard(0)]) for t in (dy, dh)])
        want = add_oracle(x, residual, gamma, dy, dh)
        got = (y, h, leaves[0].grad, leaves[1].grad, g_dt.grad)
        lines.append(f"residual {[compare(g.full_tensor().detach(), w).ok for g, w in zip(got, want)]}")
        # under torch.compile, the same route
        compiled = torch.compile(lambda a, r: rmsnorm(a, gamma, residual=r), fullgraph=False)
        y, h = compiled(*(distribute_tensor(t, mesh, [Shard(0)]) for t in (x, residual)))
        want = add_oracle(x, residual, gamma, dy, dh)
        lines.append(f"compiled {[compare(t.full_tensor(), w).ok for t, w in zip((y, h), want)]}")
        x_dt = distribute_tensor(torch.ones(4, 8), mesh, [Shard(1)])
        try:
            rmsnorm(x_dt, torch.ones(8))
            lines.append("last-dim accepted")
        except ContractError as e:
            lines.append(f"last-dim refused: {e}")
        if rank == 0:
            with open(out, "w") as f:
                f.write("\n".join(lines))
    finally:
        torch.distributed.destroy_process_group()


def test_sharded_or_replicated_rows_give_the_oracles_result_and_a_shard_of_the_normalized_dim_is_refused(
    tmp_path,
):
    out = tmp_path / "result.txt"
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    lines = out.read_text().splitlines()
    for (name, _, _), line in zip(LAYOUTS, lines):
        assert line == f"{name} True [True, True, True]"
    assert lines[len(LAYOUTS)] == "module [True, True]"  # a plain weight gets its reduced gradient
    assert lines[len(LAYOUTS) + 1] == "residual [True, True, True, True, True]"
    assert lines[len(LAYOUTS) + 2] == "compiled [True, True]"
    assert lines[-1].startswith(
        "last-dim refused: rmsnorm (triton): x is sharded along its last dimension, the one normalized"
    )
