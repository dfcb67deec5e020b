"""Where a run's files go: version folders claimed once."""

from rmsnorm_kernel.training.paths import claim_version


def test_a_new_version_is_claimed_once_even_when_another_run_took_it_first(tmp_path):
    """Two runs started at once list the same folders; the checkpoint folder's mkdir decides."""
    runs, ckpt = tmp_path / "runs" / "triton_seed0", tmp_path / "ckpt" / "triton_seed0"
    (runs / "version_0").mkdir(parents=True)
    assert claim_version(runs, ckpt) == 1  # past what TensorBoard already holds
    assert claim_version(runs, ckpt) == 2  # version_1 is now taken by the first claim
    (ckpt / "version_3").mkdir()  # made by another process in between
    assert claim_version(runs, ckpt) == 4
