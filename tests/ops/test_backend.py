"""The backend choice, and that it holds whatever was imported first: Triton decorates its own ``tl``
helpers at ``import triton``, so a process that imported Triton (or transformers, which imports it)
before this package must still run the kernels. Each case is a fresh interpreter, where nothing of the
test process is imported yet."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys

import pytest

from rmsnorm_kernel.ops.backend import interpreter_problem
from tests.helpers import CPU_ONLY, INTERPRETER_PROBLEM, ROOT, needs_a_working_interpreter

WARNING = "rmsnorm_kernel: no CUDA device found; the Triton kernels run on the CPU through Triton's interpreter"

# Forward and backward on the Triton path against the reference, at a short N (the whole-row kernels)
# and a long one (the chunked forward and the looped backward, which use tl.cdiv, tl.sum and tl.zeros).
CHECK = """
import torch
import rmsnorm_kernel
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.testing import make_inputs

counting = rmsnorm_kernel.counting()
counting.__enter__()  # the calls below are counted
for shape in [(5, 40), (2, 9000)]:
    x, gamma, dy = make_inputs(shape, torch.float32, "cpu")
    xt, gt = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    xr, gr = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    y = rmsnorm_kernel.rmsnorm(xt, gt)
    y.backward(dy)
    y_ref = rmsnorm_kernel.rmsnorm_reference(xr, gr)
    y_ref.backward(dy)
    for got, want in [(y, y_ref), (xt.grad, xr.grad), (gt.grad, gr.grad)]:
        assert compare(got, want).ok, (shape, compare(got, want))
print(rmsnorm_kernel.backend(), rmsnorm_kernel.call_counts())
"""


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter on a machine without a visible GPU (CUDA_VISIBLE_DEVICES empty, so
    also on a GPU machine) and without TRITON_INTERPRET, unless ``env`` sets it."""
    base = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**base, **CPU_ONLY, **env},
    )


FIRST = {
    "triton": "import triton",
    "triton.language": "import triton.language as tl",
    "triton-then-variable": "import os, triton\nos.environ['TRITON_INTERPRET'] = '1'",
    "rmsnorm_kernel": "import rmsnorm_kernel",
}


@pytest.mark.slow
@needs_a_working_interpreter
@pytest.mark.parametrize("first", sorted(FIRST))
def test_the_kernels_run_in_the_interpreter_whatever_was_imported_first(first):
    proc = run_python(f"{FIRST[first]}\n{CHECK}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "interpreter {'forward': 2, 'backward': 2}"
    if first != "triton-then-variable":  # the package chose the interpreter itself: it says so
        assert WARNING in proc.stderr
    assert "Cannot call @triton.jit'd" not in proc.stderr


@pytest.mark.slow
@needs_a_working_interpreter
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_the_kernels_run_after_transformers_imported_triton():
    code = "import sys\nfrom transformers import PreTrainedModel\nassert 'triton.language' in sys.modules\n"
    proc = run_python(code + CHECK)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "interpreter {'forward': 2, 'backward': 2}"
    assert WARNING in proc.stderr


@pytest.mark.slow
@needs_a_working_interpreter
def test_triton_helpers_are_decorated_again_for_the_interpreter_and_it_is_logged():
    code = (
        "import logging, triton, triton.language as tl\n"
        "from triton.runtime import JITFunction\n"
        "assert isinstance(tl.sum, JITFunction)  # compiled-mode, as Triton decorated it at import\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "import rmsnorm_kernel\n"
        "print(type(tl.sum).__name__, type(tl.cdiv).__name__, type(tl.zeros).__name__)\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["InterpretedFunction"] * 3
    assert WARNING in proc.stderr
    assert "Triton was imported before TRITON_INTERPRET=1 was set; triton.language.random" in proc.stderr


@pytest.mark.slow
@needs_a_working_interpreter
def test_import_is_refused_with_one_line_where_the_helpers_cannot_be_interpreted():
    """A program that pinned Triton's knob to compiled mode: the decorator never sees the variable."""
    proc = run_python("import triton\ntriton.knobs.runtime.interpret = False\nimport rmsnorm_kernel\n")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ImportError: rmsnorm_kernel: Triton's @triton.jit helpers (tl.sum, tl.cdiv, ...) are compiled for a "
        "GPU, and the interpreter cannot call them; set TRITON_INTERPRET=1 in the environment before starting "
        "Python, and leave triton.knobs.runtime.interpret unset"
    )


@pytest.mark.slow
@needs_a_working_interpreter
def test_importing_the_package_imports_no_triton_before_the_choice():
    """The backend module reads the device and sets the variable without importing Triton itself."""
    proc = run_python("import sys, rmsnorm_kernel, os\nprint('triton' in sys.modules, os.environ['TRITON_INTERPRET'])")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False 1"


@pytest.mark.slow
@pytest.mark.skipif(INTERPRETER_PROBLEM is None, reason="this Triton's interpreter runs with this NumPy")
def test_an_interpreter_that_cannot_run_with_this_numpy_is_refused_at_import_in_one_line():
    proc = run_python("import rmsnorm_kernel")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == f"ImportError: {INTERPRETER_PROBLEM}"


@pytest.mark.parametrize(
    "triton_version, numpy_version, refused",
    [
        ("3.6.0", "2.4.6", True),
        ("3.6.1", "2.4.0rc1", True),
        ("3.6.0", "3.0.0", True),
        ("3.6.0", "2.3.5", False),
        ("3.7.0", "2.4.6", False),
        ("3.9.0", "2.4.6", False),
    ],
)
def test_triton_3_6s_interpreter_with_numpy_2_4_or_later_is_named_with_what_is_accepted(
    triton_version, numpy_version, refused
):
    problem = interpreter_problem(triton_version, numpy_version)
    assert (problem is not None) == refused
    if refused:
        assert f"Triton {triton_version}'s interpreter fails with NumPy {numpy_version}" in problem
        assert problem.endswith("accepted: numpy < 2.4 (pip install 'numpy<2.4') or triton >= 3.7")
