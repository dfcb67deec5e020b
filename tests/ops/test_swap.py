"""swap_rmsnorm on small random models of transformers' families (no download): the same logits, loss and
gradients as the original, within the declared tolerances, with every norm on the Triton path."""

import copy

import pytest
import torch
from torch import nn

from rmsnorm_kernel import RMSNorm, call_counts, oracle, swap_rmsnorm
from rmsnorm_kernel.ops.contract import MAX_N
from rmsnorm_kernel.ops.tolerances import compare

transformers = pytest.importorskip("transformers")

SIZES = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=32,
)
#: family -> (config class, model class, the norms a model of SIZES has)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", 2 * 2 + 1),
    "mistral": ("MistralConfig", "MistralForCausalLM", 2 * 2 + 1),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", 2 * 2 + 1),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", 2 * 4 + 1),  # q_norm and k_norm in every layer
    "gemma": ("GemmaConfig", "GemmaForCausalLM", 2 * 2 + 1),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", 2 * 6 + 1),  # 4 around attention and MLP, q and k
}


def small_model(family: str, dtype: torch.dtype, device) -> nn.Module:
    config_cls, model_cls, _ = FAMILIES[family]
    config = getattr(transformers, config_cls)(**SIZES, attn_implementation="eager")
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config)
    with torch.no_grad():  # norm weights away from their initial ones (or zeros): a lost weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model.to(device=device, dtype=dtype)


def loss_logits_grads(model: nn.Module, ids: torch.Tensor):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.detach(), out.logits.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_swapped_model_gives_the_original_logits_loss_and_gradients(family, dtype, device):
    original = small_model(family, dtype, device)
    swapped = copy.deepcopy(original)
    done = swap_rmsnorm(swapped)
    assert len(done.replaced) == FAMILIES[family][2] and done.left_alone == {}
    assert all(isinstance(swapped.get_submodule(name), RMSNorm) for name in done.replaced)
    ids = torch.randint(0, SIZES["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1)).to(device)
    want = loss_logits_grads(original, ids)
    before = call_counts()
    got = loss_logits_grads(swapped, ids)
    after = call_counts()
    norms = FAMILIES[family][2]
    assert (after["forward"] - before["forward"], after["backward"] - before["backward"]) == (norms, norms)
    for what, g, w in [("loss", got[0], want[0]), ("logits", got[1], want[1])]:
        c = compare(g, w)
        assert c.ok, f"{what}: {c.max_abs:.3g} off, {c.worst_over_tol:.3g} x the tolerance"
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        c = compare(got[2][name], want[2][name])
        assert c.ok, f"grad of {name}: {c.max_abs:.3g} off, {c.worst_over_tol:.3g} x the tolerance"


def test_swap_keeps_each_weight_its_eps_and_its_numerics():
    model = small_model("qwen3", torch.float32, "cpu")
    old_q_norm = model.model.layers[0].self_attn.q_norm
    done = swap_rmsnorm(model, impl="reference")
    new_q_norm = model.model.layers[0].self_attn.q_norm
    assert done.replaced["model.layers.0.self_attn.q_norm"] == "Qwen3RMSNorm"
    assert new_q_norm.weight is old_q_norm.weight  # the same Parameter, so an optimizer still holds it
    assert (new_q_norm.eps, new_q_norm.mode, new_q_norm.impl) == (old_q_norm.variance_epsilon, "llama", "reference")
    gemma = small_model("gemma", torch.float32, "cpu")
    swap_rmsnorm(gemma)
    assert gemma.model.norm.mode == "gemma" and gemma.model.norm.eps == gemma.config.rms_norm_eps


def test_torch_rmsnorm_is_swapped_and_an_unknown_norm_is_named_and_left_alone(caplog):
    class MyRMSNorm(nn.Module):
        def forward(self, x):
            return x

    torch_norm = nn.RMSNorm((2, 4), eps=1e-5)
    model = nn.Sequential(nn.Linear(8, 8), torch_norm, MyRMSNorm())
    done = swap_rmsnorm(model)
    assert done.replaced == {"1": "RMSNorm"} and done.left_alone == {"2": "MyRMSNorm"}
    assert isinstance(model[1], RMSNorm) and model[1].weight is torch_norm.weight
    assert (model[1].normalized_shape, model[1].eps, model[1].mode) == ((2, 4), 1e-5, "torch")
    assert type(model[2]) is MyRMSNorm
    assert "2 is a MyRMSNorm, which it does not know; left alone" in caplog.text
    again = swap_rmsnorm(model, impl="reference")  # a second swap changes the path of what the first made
    assert again.replaced == {} and again.retargeted == {"1": "triton"} and model[1].impl == "reference"


def test_a_norm_held_under_several_names_is_replaced_by_one_module_under_all():
    shared = nn.RMSNorm(8)
    model = nn.ModuleDict(
        {"a": nn.Sequential(shared), "b": nn.Sequential(shared), "c": nn.ModuleList([shared, shared])}
    )
    done = swap_rmsnorm(model)
    assert sorted(done.replaced) == ["a.0", "b.0", "c.0", "c.1"]
    assert model["a"][0] is model["b"][0] is model["c"][0] is model["c"][1]
    assert isinstance(model["a"][0], RMSNorm) and model["a"][0].weight is shared.weight


def test_what_is_not_a_model_or_not_a_path_is_refused_naming_swap_rmsnorm():
    with pytest.raises(TypeError, match="swap_rmsnorm: model is a str; accepted: a torch.nn.Module"):
        swap_rmsnorm("model")
    with pytest.raises(ValueError, match="swap_rmsnorm: impl is 'bad'; accepted: 'triton', 'reference', 'native'"):
        swap_rmsnorm(nn.Sequential(nn.RMSNorm(8)), impl="bad")


#: Of the bfloat16 outputs, the share that must be bit-identical to transformers' module: the formulas are
#: the same, and a float32 r that differs in its last bit (another order of the sum, another rsqrt) moves
#: a rounded output only when it sits on a rounding boundary.
BIT_IDENTICAL_SHARE = 0.999


@pytest.mark.parametrize(
    "module_path, shape",
    [
        ("llama.modeling_llama.LlamaRMSNorm", (4, 16, 512)),
        ("qwen3.modeling_qwen3.Qwen3RMSNorm", (2, 16, 8, 128)),  # a q/k norm: per head, over head_dim
        ("gemma.modeling_gemma.GemmaRMSNorm", (4, 16, 512)),
    ],
    ids=lambda v: v.rsplit(".", 1)[-1] if isinstance(v, str) else "x".join(map(str, v)),
)
def test_bfloat16_outputs_are_bit_identical_to_transformers_module_and_gradients_match_the_oracle(
    module_path, shape, device
):
    """y: bit-identical to the module's (the share above). dx and dweight: within the tolerance of the
    mode's float64 oracle. The module's own autograd gradients are not the yardstick: they round
    intermediate products to bfloat16, and Qwen3's dweight (256 of them summed per element here) is off
    the oracle by 1.5 times the tolerance."""
    module_name, cls_name = module_path.rsplit(".", 1)
    cls = getattr(__import__(f"transformers.models.{module_name}", fromlist=[cls_name]), cls_name)
    torch.manual_seed(0)
    theirs = cls(shape[-1], eps=1e-6)
    with torch.no_grad():
        theirs.weight.add_(0.3 * torch.randn(shape[-1]))
    theirs = theirs.to(device=device, dtype=torch.bfloat16)
    ours = nn.Sequential(copy.deepcopy(theirs))
    swap_rmsnorm(ours)
    x = torch.randn(shape, device=device).to(torch.bfloat16)
    dy = torch.randn(shape, device=device).to(torch.bfloat16)
    results = []
    for m in (theirs, ours):
        xl = x.clone().requires_grad_()
        y = m(xl)
        y.backward(dy)
        results.append((y.detach(), xl.grad, next(m.parameters()).grad))
    (y_t, _, _), (y_o, dx_o, dw_o) = results
    assert y_o.dtype == y_t.dtype
    assert (y_o == y_t).float().mean().item() >= BIT_IDENTICAL_SHARE
    _, dx_want, dw_want = oracle(x, theirs.weight.detach(), dy, 1e-6, mode=ours[0].mode)
    for name, got, want in [("dx", dx_o, dx_want), ("dweight", dw_o, dw_want)]:
        c = compare(got, want)
        assert c.ok, f"{name}: {c.max_abs:.3g} off the oracle, {c.worst_over_tol:.3g} x the tolerance"


def test_converted_norms_keep_each_modules_training_mode():
    model = small_model("llama", torch.float32, "cpu").eval()
    model.model.layers[1].input_layernorm.train()  # one norm in training mode inside a model in eval()
    modes = {name: m.training for name, m in model.named_modules()}
    done = swap_rmsnorm(model)
    assert len(done.replaced) == FAMILIES["llama"][2]
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert not model.model.norm.training and model.model.layers[1].input_layernorm.training


def test_hooks_on_a_norm_stay_fire_once_a_call_and_their_handles_still_remove_them(device):
    norm = nn.RMSNorm(8, device=device)
    model = nn.Sequential(nn.Linear(8, 8, device=device), norm)
    fired = []
    handles = [
        norm.register_forward_pre_hook(lambda m, args: fired.append("pre")),
        norm.register_forward_hook(lambda m, args, out: fired.append("forward")),
        norm.register_full_backward_hook(lambda m, gin, gout: fired.append("backward")),
        norm.register_state_dict_post_hook(lambda m, sd, prefix, local: fired.append("state_dict")),
        norm.register_load_state_dict_post_hook(lambda m, keys: fired.append("load")),
    ]
    done = swap_rmsnorm(model)
    assert done.replaced == {"1": "RMSNorm"} and model[1] is norm and isinstance(norm, RMSNorm)
    before = call_counts()
    model(torch.randn(3, 8, device=device, requires_grad=True)).sum().backward()
    after = call_counts()
    assert (after["forward"] - before["forward"], after["backward"] - before["backward"]) == (1, 1)
    model.load_state_dict(model.state_dict())
    assert fired == ["pre", "forward", "backward", "state_dict", "load"]
    for handle in handles:
        handle.remove()
    model(torch.randn(3, 8, device=device, requires_grad=True)).sum().backward()
    model.load_state_dict(model.state_dict())
    assert len(fired) == 5


def test_a_norm_whose_forward_is_set_on_the_module_is_left_as_it_is_and_named(caplog):
    norm = nn.RMSNorm(8)
    norm.forward = lambda x: x  # as accelerate's hooks wrap a module's forward
    linear = nn.Linear(8, 8)
    linear.forward = lambda x: x  # not a norm: not named
    model = nn.Sequential(norm, linear)
    done = swap_rmsnorm(model)
    assert done.replaced == {} and type(norm) is nn.RMSNorm and list(done.refused) == ["0"]
    assert "forward is set on the module itself" in done.refused["0"]
    assert "swap_rmsnorm: 0 left as it is: its forward is set on the module itself" in caplog.text


def test_a_norm_passed_as_the_model_is_converted_in_place_under_the_empty_name(device):
    norm = nn.RMSNorm(8, eps=1e-5, device=device)
    weight = norm.weight
    done = swap_rmsnorm(norm)
    assert done.replaced == {"": "RMSNorm"} and isinstance(norm, RMSNorm) and norm.weight is weight
    before = call_counts()
    norm(torch.randn(2, 8, device=device))
    assert call_counts()["forward"] - before["forward"] == 1
    again = swap_rmsnorm(norm, impl="reference")
    assert again.replaced == {} and again.retargeted == {"": "triton"} and norm.impl == "reference"


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: nn.RMSNorm(8, eps=0.0), "eps is 0.0; accepted: a finite number > 0"),
        (lambda: nn.RMSNorm((2, MAX_N)), f"x has rows of N = {2 * MAX_N} elements; accepted: N <= {MAX_N}"),
        (lambda: nn.RMSNorm(8, dtype=torch.float8_e4m3fn), "gamma has dtype torch.float8_e4m3fn"),
        (
            lambda: transformers.models.llama.modeling_llama.LlamaRMSNorm(8, eps=0.0),
            "eps is 0.0; accepted: a finite number > 0",
        ),
        (
            lambda: transformers.models.gemma.modeling_gemma.GemmaRMSNorm(MAX_N + 1),
            f"N = {MAX_N + 1} elements; accepted: N <= {MAX_N}",
        ),
    ],
    ids=["eps0", "rows_too_long", "float8_weight", "llama_eps0", "gemma_rows_too_long"],
)
def test_a_norm_the_triton_path_would_refuse_is_left_as_it_is_and_named_with_the_contracts_reason(make, reason, caplog):
    norm = make()
    cls = type(norm)
    model = nn.Sequential(nn.RMSNorm(8), norm)
    done = swap_rmsnorm(model)
    assert done.replaced == {"0": "RMSNorm"} and type(model[1]) is cls
    assert done.refused["1"].startswith("the Triton path would refuse it at its first forward: rmsnorm (triton): ")
    assert reason in done.refused["1"] and reason in caplog.text


def test_a_norm_the_triton_path_refuses_is_converted_where_a_path_takes_it(device):
    model = nn.Sequential(nn.RMSNorm(8, eps=0.0, device=device))
    done = swap_rmsnorm(model, fallback="reference")
    assert done.replaced == {"0": "RMSNorm"} and done.refused == {}
    model(torch.randn(2, 8, device=device))
    assert model[0].fallback_count == 1  # the reference took the call the kernels refuse
    swap_rmsnorm(torch_norm := nn.RMSNorm(8, eps=0.0), impl="native")
    assert isinstance(torch_norm, RMSNorm) and torch_norm.impl == "native"
    again = swap_rmsnorm(model)  # back to the kernels without the fallback: refused, left on its path
    assert again.retargeted == {} and "eps is 0.0" in again.refused["0"] and model[0].fallback == "reference"


def test_norms_a_conversion_could_not_keep_whole_are_left_as_they_are_and_named():
    zero = nn.RMSNorm(0)  # torch takes a zero dimension; this package's RMSNorm does not
    parametrized = nn.RMSNorm(8)
    torch.nn.utils.parametrize.register_parametrization(parametrized, "weight", nn.Identity())
    model = nn.Sequential(zero, parametrized)
    done = swap_rmsnorm(model, impl="reference")
    assert done.replaced == {} and type(zero) is nn.RMSNorm and isinstance(parametrized, nn.RMSNorm)
    assert "normalized_shape is (0,); accepted: a positive int" in done.refused["0"]
    assert "its weight is parametrized (torch.nn.utils.parametrize)" in done.refused["1"]
