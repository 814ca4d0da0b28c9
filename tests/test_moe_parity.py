"""Parity of the Llama family's mixtures of experts and Qwen3 with transformers, in float64: Mixtral (grouped
heads, renormalised top-k), Qwen2-MoE (a shared expert behind its sigmoid gate, q/k/v biases, not renormalised),
Qwen3-MoE (q/k norms per head, a dense first layer among sparse ones), OLMoE (q/k norms over the projection) and
Qwen3 dense. A small model with random weights made there (no download), saved with ``save_pretrained`` and read
by ``Llama.from_pretrained``, gives the same logits, the same loss (the next-token loss plus
``router_aux_loss_coef`` x transformers' own ``load_balancing_loss_func`` over the real tokens) and the same
gradient of every parameter, routers and every expert included, as PyTorch's autograd; greedy generation equals
``generate`` token for token; a minitf model written by ``save_pretrained`` loads there with the same logits.

transformers computes RMSNorm, the rotary angles, Mixtral's router softmax and the load-balancing loss's sums in
float32 whatever the model's dtype: the tests give them exact float64 forms of the same lines (as
tests/test_llama.py does) and run the experts' own Python loop (``experts_implementation="eager"``) and SDPA
attention. Tolerance: relative 1e-10 (measured: about 1e-15). Skipped without the ``bench`` extra."""
import contextlib
import json

import pytest
from hypothesis import given, settings, strategies as st

import minitf
from minitf import backend
from minitf.llama import Llama, LlamaConfig
from minitf.llama import moe_hf
from minitf.module import no_grad
from minitf.sampling import generate
from tests.helpers import np, randomize, relative_difference, seeds
from tests.test_llama import _hf, float64_patches, greedy_both

pytestmark = [pytest.mark.usefixtures("float64"), pytest.mark.extra("torch", "bench"),
              pytest.mark.extra("transformers", "bench"), pytest.mark.extra("safetensors", "bench")]
RTOL = 1e-10
FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "qwen3")
_MODULES = {"mixtral": ("mixtral", "Mixtral"), "qwen2_moe": ("qwen2_moe", "Qwen2Moe"),
            "qwen3_moe": ("qwen3_moe", "Qwen3Moe"), "olmoe": ("olmoe", "Olmoe"), "qwen3": ("qwen3", "Qwen3")}


@contextlib.contextmanager
def hugging_face_in_float64():
    """The five families' modules with their float32 steps made float64 (:func:`tests.test_llama.float64_patches`;
    the routers' softmax and the load-balancing loss's sums too), the same lines otherwise."""
    import importlib
    torch, _ = _hf()

    def mixtral_router_forward(self, hidden_states):  # MixtralTopKRouter.forward without .float()
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = torch.nn.functional.linear(hidden_states, self.weight)
        router_probs = torch.nn.functional.softmax(router_logits, dim=-1)
        router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
        router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
        return router_logits, router_top_value, router_indices

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "float", torch.Tensor.double)  # the load-balancing loss's .float()
        float64_patches(patch, [(importlib.import_module(f"transformers.models.{folder}.modeling_{folder}"), prefix)
                                for folder, prefix in _MODULES.values()])
        from transformers.models.mixtral import modeling_mixtral
        patch.setattr(modeling_mixtral.MixtralTopKRouter, "forward", mixtral_router_forward)
        yield


def hf_config(family, E=4, k=2, layers=2, heads=(4, 2), head_dim=4, tied=False, **extra):
    """A small transformers config of ``family``: E experts, k per token (Qwen3-MoE's first layer dense)."""
    _, transformers = _hf()
    common = dict(vocab_size=37, hidden_size=16, num_hidden_layers=layers, num_attention_heads=heads[0],
                  num_key_value_heads=heads[1], intermediate_size=10, max_position_embeddings=64,
                  tie_word_embeddings=tied, attn_implementation="sdpa", experts_implementation="eager",
                  bos_token_id=0, eos_token_id=0, pad_token_id=None)
    values = {
        "mixtral": dict(num_local_experts=E, num_experts_per_tok=k, head_dim=head_dim, sliding_window=None,
                        router_aux_loss_coef=0.05),
        "qwen2_moe": dict(num_experts=E, num_experts_per_tok=k, moe_intermediate_size=6,
                          shared_expert_intermediate_size=8, norm_topk_prob=False, router_aux_loss_coef=0.05),
        "qwen3_moe": dict(num_experts=E, num_experts_per_tok=k, moe_intermediate_size=6, head_dim=head_dim,
                          mlp_only_layers=[0], norm_topk_prob=True, router_aux_loss_coef=0.05),
        "olmoe": dict(num_experts=E, num_experts_per_tok=k, norm_topk_prob=False, router_aux_loss_coef=0.05),
        "qwen3": dict(head_dim=head_dim),
    }[family]
    Config = {"mixtral": transformers.MixtralConfig, "qwen2_moe": transformers.Qwen2MoeConfig,
              "qwen3_moe": transformers.Qwen3MoeConfig, "olmoe": transformers.OlmoeConfig,
              "qwen3": transformers.Qwen3Config}[family]
    return Config(**(common | values | extra))


def hf_model(family, seed, scale=None, **config):
    """A random float64 model of ``family`` in eval mode: every parameter ~ N(0, 0.5^2) around its init, or with
    ``scale`` every matrix ~ N(0, scale^2), norms' gains 1 (greedy decoding then varies its tokens)."""
    torch, transformers = _hf()
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(family, **config)).to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if scale is not None:
                p.normal_(0.0, scale) if p.ndim >= 2 else p.fill_(1.0 if "norm" in name else 0.0)
            else:
                p.add_(torch.randn_like(p) * 0.5)
    return model.eval()


def their_gradient(theirs, name, config, family):
    """transformers' gradient of minitf's parameter ``name``, in minitf's layout (their stacked experts: the
    (E, 2F, D) gate_up_proj split and each expert transposed; a router's (E, D) transposed)."""
    params = dict(theirs.named_parameters())
    parts = name.split(".")
    if ".experts." in name:
        i, which = int(parts[1]), parts[-1]
        F = config.expert_d_ff
        if which == "down_proj":
            return params[f"model.layers.{i}.mlp.experts.down_proj"].grad.numpy().transpose(0, 2, 1)
        gate_up = params[f"model.layers.{i}.mlp.experts.gate_up_proj"].grad.numpy()
        return (gate_up[:, :F] if which == "gate_proj" else gate_up[:, F:]).transpose(0, 2, 1)
    hf_name = "lm_head.weight" if name == "lm_head.weight" else "model." + name
    grad = params[hf_name].grad.numpy()
    return grad.T if grad.ndim == 2 and "embed" not in name and name != "lm_head.weight" else grad


@settings(max_examples=8, deadline=None)
@given(family=st.sampled_from(FAMILIES), seed=seeds, data=st.data())
def test_logits_loss_with_the_auxiliary_loss_and_every_gradient_match_transformers(family, seed, data,
                                                                                    tmp_path_factory):
    """With some keys of the batch padding: the attention mask, which the load-balancing loss also reads."""
    torch, _ = _hf()
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    E = data.draw(st.integers(2, 5))
    shape = dict(E=E, k=data.draw(st.integers(1, E)), layers=data.draw(st.integers(2, 3)),
                 heads=data.draw(st.sampled_from([(4, 2), (2, 2), (2, 1)])), tied=data.draw(st.booleans()))
    folder = tmp_path_factory.mktemp(family)
    with hugging_face_in_float64():
        theirs = hf_model(family, seed % 2**31, **shape)
        theirs.save_pretrained(folder)
        model = Llama.from_pretrained(folder)
        config = model.config
        assert (config.num_experts > 0) == (family != "qwen3") and model.embed_tokens.weight.data.dtype == np.float64
        B, L = data.draw(st.integers(1, 3)), data.draw(st.integers(2, 7))
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, 37, (B, L))
        pad = rng.random((B, L)) < data.draw(st.sampled_from([0.0, 0.3]))
        pad[:, :2] = False
        targets = np.where(pad, -1, ids)[:, 1:]
        loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
        model.zero_grad()
        logits = model(ids[:, :-1], key_padding_mask=backend.asarray(pad[:, :-1]))
        aux = model.aux_losses()
        loss = loss_fn(logits, targets) + sum(v * c for v, c in aux.values())
        model.backward_aux({name: c for name, (_, c) in aux.items()})
        model.backward(loss_fn.backward())
        mask = torch.from_numpy((~pad[:, :-1]).astype(np.int64))
        out = theirs(torch.from_numpy(ids[:, :-1]), attention_mask=mask, output_router_logits=family != "qwen3")
        their_targets = torch.from_numpy(np.where(targets < 0, -100, targets)).reshape(-1)
        their_loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 37), their_targets)
        if family != "qwen3":
            their_aux = load_balancing_loss_func(out.router_logits, config.num_experts, config.num_experts_per_tok,
                                                 mask)
            assert abs(aux["load_balancing"][0] - their_aux.item()) <= RTOL * their_aux.item()
            assert aux["load_balancing"][1] == 0.05 == theirs.config.router_aux_loss_coef
            their_loss = their_loss + theirs.config.router_aux_loss_coef * their_aux
        else:
            assert aux == {}
        their_loss.backward()
    assert relative_difference(backend.to_numpy(logits), out.logits.detach().numpy()) < RTOL
    assert abs(loss - their_loss.item()) <= RTOL * abs(their_loss.item())
    ours = dict(model.named_parameters())
    assert sum(int(p.size) for p in ours.values()) == sum(p.numel() for p in theirs.parameters())
    pairs = [(name, backend.to_numpy(p.grad), their_gradient(theirs, name, config, family)) for name, p in ours.items()]
    largest = max(float(np.abs(b).max()) for _, _, b in pairs)
    for name, a, b in pairs:
        # the floor as in tests/test_llama.py: an exactly-0 gradient there is rounding noise here
        assert relative_difference(a, b, floor=1e-4 * largest) < RTOL, name
    routers = [name for name, _, _ in pairs if name.endswith(".mlp.gate.weight")]
    assert len(routers) == sum(map(config.is_sparse, range(config.num_layers))) == (family != "qwen3") * len(routers)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "qwen2_moe", "qwen3"])
def test_greedy_generation_equals_transformers_generate(family, tmp_path):
    with hugging_face_in_float64():
        theirs = hf_model(family, 3, scale=0.5, E=4, k=2)
        theirs.save_pretrained(tmp_path)
        model = Llama.from_pretrained(tmp_path)
        ours, expected = greedy_both(model, theirs, np.random.default_rng(3).integers(1, 37, (2, 6)), 30)
    assert np.array_equal(ours, expected.numpy())
    assert len(set(ours[:, 6:].ravel().tolist())) > 2


@pytest.mark.parametrize("family, fields", [
    ("mixtral", dict(num_experts=4, num_experts_per_tok=2)),
    ("qwen2_moe", dict(num_experts=3, num_experts_per_tok=2, moe_d_ff=6, shared_expert_d_ff=5, attention_bias=True,
                       norm_topk_prob=False)),
    ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=3, moe_d_ff=6, qk_norm="head", mlp_only_layers=(0,))),
    ("olmoe", dict(num_experts=4, num_experts_per_tok=2, qk_norm="projection", norm_topk_prob=False)),
    ("qwen3", dict(qk_norm="head")),
])
def test_save_pretrained_loads_in_transformers_with_the_same_logits(family, fields, tmp_path):
    torch, transformers = _hf()
    config = LlamaConfig(vocab_size=30, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=10,
                         tie_word_embeddings=False, **fields)
    model = randomize(Llama(config), 5, scale=0.3).eval()
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == family
    ids = np.random.default_rng(5).integers(0, 30, (3, 8))
    with hugging_face_in_float64():
        theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64,
                                                                   attn_implementation="sdpa",
                                                                   experts_implementation="eager").eval()
        with torch.no_grad():
            expected = theirs(torch.from_numpy(ids)).logits.numpy()
    with no_grad():
        assert relative_difference(backend.to_numpy(model(ids)), expected) < RTOL
    back = Llama.from_pretrained(tmp_path)
    assert all(np.array_equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
    assert back.config == config.replace(head_dim=4, router_aux_loss_coef=back.config.router_aux_loss_coef)


@settings(max_examples=20, deadline=None)
@given(seed=seeds, layers=st.integers(1, 3), E=st.integers(1, 6), data=st.data())
def test_the_load_balancing_loss_and_its_gradient_equal_transformers_function(seed, layers, E, data):
    """minitf.moe.load_balancing_loss and its backward (through the softmax: d/dlogits) against transformers'
    load_balancing_loss_func and PyTorch's autograd of it, several layers' router logits, with an attention mask
    or without (float64: its float32 sums made float64 as above)."""
    torch, _ = _hf()
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    from minitf.layers import softmax, softmax_backward
    from minitf.moe import load_balancing_loss, load_balancing_loss_backward, top_k
    k = data.draw(st.integers(1, E))
    B, L = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 5))
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((layers, B * L, E)) * 2
    mask = None
    if data.draw(st.booleans()):
        mask = (rng.random((B, L)) < 0.7).astype(np.int64)
        mask[:, 0] = 1
    rows = None if mask is None else mask.reshape(-1).astype(float)
    stacked = backend.asarray(logits.reshape(-1, E))
    p = softmax(stacked)
    idx, _ = top_k(p, k)
    rows_all = None if rows is None else np.concatenate([rows] * layers)
    ours = load_balancing_loss(p, idx, E, rows_all)
    dlogits = softmax_backward(p, load_balancing_loss_backward(p, idx, E, rows_all))
    theirs_logits = tuple(torch.tensor(logits[i], requires_grad=True) for i in range(layers))
    with hugging_face_in_float64():
        from transformers.models.mixtral import modeling_mixtral
        theirs = modeling_mixtral.load_balancing_loss_func(theirs_logits, E, k,
                                                           None if mask is None else torch.from_numpy(mask))
        theirs.backward()
    assert load_balancing_loss_func is not None and theirs.dtype == torch.float64
    assert abs(ours - theirs.item()) <= 1e-12 * abs(theirs.item())
    expected = np.concatenate([t.grad.numpy() for t in theirs_logits])
    # a floor: where the gradient is 0 in exact arithmetic (k = E: every f_e is 1, the loss E sum_e P_e = E is
    # constant) theirs is rounding noise of 1e-16
    assert relative_difference(backend.to_numpy(dlogits), expected, floor=1e-4) < RTOL
