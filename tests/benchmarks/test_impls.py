"""The implementations under test and one whole call of each."""

import argparse
import inspect

import pytest
import torch

from benchmarks.impls import EPS, FWD, FWD_BWD, IMPLS, LIGER_SETTINGS, make_call, make_impl, parse_impls
from rmsnorm_kernel.ops.reference import manual_backward, rmsnorm_reference
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.testing import make_inputs


def test_unknown_impl_names_are_refused():
    with pytest.raises(argparse.ArgumentTypeError, match="unknown cuda; accepted: a comma-separated subset"):
        parse_impls("triton,cuda")
    with pytest.raises(argparse.ArgumentTypeError, match="',' names no implementation"):
        parse_impls(",")
    with pytest.raises(ValueError, match="impl is 'cuda'"):
        make_impl("cuda", "cpu")
    assert parse_impls(" triton, F.rms_norm ,") == ["triton", "F.rms_norm"]


def test_liger_is_no_implementation_off_a_gpu_and_the_others_agree_with_the_reference():
    assert make_impl("liger", "cpu") is None
    x, gamma, _ = make_inputs((3, 33), torch.float32, "cpu")
    want = rmsnorm_reference(x, gamma, EPS)
    for name in ("reference", "F.rms_norm"):
        assert compare(make_impl(name, "cpu")(x, gamma), want).ok, name
    assert set(IMPLS) == {"triton", "reference", "F.rms_norm", "compile", "liger", "seed"}


def test_a_forward_call_needs_no_gradient_and_a_backward_call_returns_dx_and_dgamma(device):
    x, gamma, dy = make_inputs((4, 33), torch.float32, device)
    (y,) = make_call(FWD, rmsnorm_reference, x, gamma, dy)()
    assert not y.requires_grad
    step = make_call(FWD_BWD, rmsnorm_reference, x, gamma, dy)
    y, dx, dgamma = step()
    want_dx, want_dgamma = manual_backward(x, gamma, dy)
    assert compare(dx, want_dx).ok and compare(dgamma, want_dgamma).ok
    _, dx_again, dgamma_again = step()  # a second call: the same gradients, nothing accumulated
    assert torch.equal(dx_again, dx) and torch.equal(dgamma_again, dgamma)


def test_liger_settings_are_liger_defaults():
    rms = pytest.importorskip("liger_kernel.ops.rms_norm")
    params = inspect.signature(rms.LigerRMSNormFunction.forward).parameters
    for name, value in LIGER_SETTINGS.items():
        assert params[name].default == value
