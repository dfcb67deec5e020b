"""The compile report: no graph break, Inductor's code saved, the Triton path launched from it: its kernels
on a GPU, its opaque ops under the interpreter."""

import os
from pathlib import Path

import torch

from rmsnorm_kernel.checks import compile_report
from rmsnorm_kernel.ops.module import RMSNorm

from .helpers import BreakingNet


def test_compile_report_saves_inductor_code_that_runs_both_directions(tmp_path, device):
    rep = compile_report.compile_report(tmp_path / "code", device=device)
    for name in compile_report.CACHE_VARIABLES:  # the temporary cache folder was for this compile only
        assert compile_report.TEMP_PREFIX not in os.environ.get(name, "")
    assert rep.ok, rep.problems
    assert rep.graph_break_count == 0 and rep.outputs_match and rep.grads_match
    assert rep.triton_calls == {"forward": 1, "backward": 1}
    assert rep.code_files and all(Path(f).parent == tmp_path / "code" for f in rep.code_files)
    code = "\n".join(Path(f).read_text() for f in rep.code_files)
    if device == "cuda":  # the generated code launches the kernels itself
        assert "_rmsnorm_fwd_kernel" in code and "_rmsnorm_bwd_kernel" in code
        # no norm op left to call: only the count op, as the report runs inside counting()
        assert "torch.ops.rmsnorm_kernel.rmsnorm" not in code and "torch.ops.rmsnorm_kernel.add_rmsnorm" not in code
        assert "torch.ops.rmsnorm_kernel.count_call.default(" in code
    else:
        assert "torch.ops.rmsnorm_kernel.rmsnorm.default(" in code
        assert "torch.ops.rmsnorm_kernel.rmsnorm_backward.default(" in code
    assert any(">> " in e and compile_report.LAUNCHES["forward"].search(e) for e in rep.excerpts)


def test_compile_report_reports_graph_breaks(tmp_path, device, monkeypatch):
    monkeypatch.setattr(compile_report, "demo_network", BreakingNet)
    rep = compile_report.compile_report(tmp_path / "code", device=device)
    assert not rep.ok
    assert rep.graph_break_count >= 1 and "graph break" in rep.problems[0]
    assert rep.break_reasons and rep.break_reasons[0] in rep.problems[0]
    assert not rep.code_files


def test_op_call_excerpts_mark_each_call_with_its_context():
    code = "\n".join(
        ["a = 1", "b = 2", "buf0 = torch.ops.rmsnorm_kernel.rmsnorm.default(x, w, 1e-06)", "c = 3", "d = 4", "e = 5"]
    )
    calls, excerpts = compile_report.op_call_excerpts(code, context=1)
    assert calls == ["buf0 = torch.ops.rmsnorm_kernel.rmsnorm.default(x, w, 1e-06)"]
    assert excerpts == ["   b = 2\n>> buf0 = torch.ops.rmsnorm_kernel.rmsnorm.default(x, w, 1e-06)\n   c = 3"]


def test_compiled_network_is_the_demo_network_on_the_triton_path_with_a_gamma_not_all_ones():
    net = compile_report.demo_network()
    assert list(dict(net.named_children())) == ["inp", "norm", "out"] and net.norm.activation == "silu"
    assert (net.inp.in_features, net.inp.out_features, net.out.out_features) == (16, 257, 4)
    assert isinstance(net.norm, RMSNorm) and net.norm.impl == "triton"
    assert not torch.equal(net.norm.weight, torch.ones(257))


def test_a_launch_of_the_packages_kernels_counts_and_an_inductor_kernel_does_not():
    code = "\n".join(
        [
            "triton_per_fused_mean_pow_rsqrt_0.run(buf1, arg0_1, stream=stream0)",
            "_rmsnorm_fwd_kernel_0.run(arg0_1, arg1_1, buf2, 257, stream=stream0)",
            "_rmsnorm_bwd_kernel_1.run(buf3, arg0_1, stream=stream0)",
        ]
    )
    calls, _ = compile_report.op_call_excerpts(code, context=0)
    assert calls == [
        "_rmsnorm_fwd_kernel_0.run(arg0_1, arg1_1, buf2, 257, stream=stream0)",
        "_rmsnorm_bwd_kernel_1.run(buf3, arg0_1, stream=stream0)",
    ]
    assert compile_report.LAUNCHES["forward"].search(calls[0]) and compile_report.LAUNCHES["backward"].search(calls[1])
