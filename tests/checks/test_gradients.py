"""The reference checks: the oracle's gradients hold, and a wrong hand-written backward is caught."""

from rmsnorm_kernel.checks import gradients


def test_reference_checks_pass_in_every_dtype():
    results = gradients.reference_checks(shapes=[(3, 7)])
    assert {r.check for r in results} == {"gradcheck", "manual dx = autograd", "manual dgamma = autograd"}
    assert {r.dtype for r in results} == {"float64", "float32", "float16", "bfloat16"}
    assert all(r.ok for r in results), [r for r in results if not r.ok]


def test_reference_checks_catch_a_dgamma_averaged_over_rows(monkeypatch):
    real = gradients.manual_backward

    def dgamma_as_mean(x, gamma, dy, eps):  # a classic slip: averaging dgamma over rows instead of summing
        dx, dgamma = real(x, gamma, dy, eps)
        return dx, dgamma / x.shape[0]

    monkeypatch.setattr(gradients, "manual_backward", dgamma_as_mean)
    results = gradients.reference_checks(shapes=[(3, 7)])
    assert not any(r.ok for r in results if r.check == "manual dgamma = autograd")
    assert all(r.ok for r in results if r.check != "manual dgamma = autograd")


def test_reference_checks_default_to_the_declared_shapes(monkeypatch):
    monkeypatch.setattr(gradients, "REFERENCE_SHAPES", ((2, 3),))
    assert {r.shape for r in gradients.reference_checks()} == {(2, 3)}
