"""The Llama family's sparse and Qwen3 models (minitf.llama with minitf.moe): the whole model's gradient of the
next-token loss plus its auxiliary losses against float64 central differences (sparse and dense layers mixed, q/k
norms per head or over the projection, a shared expert, padding), with every top-k choice kept away from ties; the
parameter count; the key/value cache; the config's refusals."""
import pytest
from hypothesis import assume, given, settings, strategies as st

import minitf
from minitf import backend
from minitf.llama import Llama, LlamaConfig
from minitf.llama.config import folder_fields, from_folder_fields
from minitf.module import no_grad
from tests.helpers import LN_RTOL, assert_gradients_match, np, randomize, seeds
from tests.test_llama import decoded_in_steps

pytestmark = pytest.mark.usefixtures("float64")
GAP = 1e-4  # the smallest gap between a token's k-th and (k+1)-th router probability the gradient test accepts


@st.composite
def sparse_llamas(draw):
    E = draw(st.integers(1, 4))
    layers = draw(st.integers(1, 3))
    config = LlamaConfig(vocab_size=draw(st.integers(2, 7)), d_model=draw(st.integers(2, 4)), num_layers=layers,
                         num_heads=2, num_kv_heads=draw(st.sampled_from([1, 2])), head_dim=2,
                         d_ff=draw(st.integers(1, 3)), max_position_embeddings=16,
                         tie_word_embeddings=draw(st.booleans()), attention_bias=draw(st.booleans()),
                         qk_norm=draw(st.sampled_from([None, "head", "projection"])), num_experts=E,
                         num_experts_per_tok=draw(st.integers(1, E)), moe_d_ff=draw(st.sampled_from([None, 2])),
                         shared_expert_d_ff=draw(st.sampled_from([None, 2])), norm_topk_prob=draw(st.booleans()),
                         decoder_sparse_step=draw(st.integers(1, 2)),
                         mlp_only_layers=tuple(draw(st.sets(st.integers(0, layers - 1), max_size=1))),
                         router_aux_loss_coef=draw(st.sampled_from([0.0, 0.5])),
                         router_z_loss_coef=draw(st.sampled_from([0.0, 0.3])))
    seed = draw(seeds)
    ids = np.random.default_rng(seed).integers(0, config.vocab_size, (draw(st.integers(1, 2)),
                                                                      draw(st.integers(2, 4))))
    return config, ids, seed


def smallest_gap(model):
    """The smallest gap between the k-th and (k+1)-th router probability over every sparse layer's tokens."""
    gaps = [np.inf]
    for block in model.sparse_blocks():
        if block.top_k < block.num_experts:
            p = -np.sort(-backend.to_numpy(block.routing[1]), axis=-1)
            gaps.append(float((p[:, block.top_k - 1] - p[:, block.top_k]).min()))
    return min(gaps)


@settings(max_examples=15, deadline=None)
@given(case=sparse_llamas(), pad=st.booleans())
def test_whole_sparse_model_gradient_of_the_loss_and_its_auxiliary_losses(case, pad):
    """loss = next-token loss + sum coefficient x auxiliary loss; the gradient: backward_aux(coefficients), then
    backward(dlogits); every parameter against central differences."""
    config, ids, seed = case
    model = randomize(Llama(config), seed)
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    mask = None
    if pad:
        mask = np.random.default_rng(seed + 1).random(inputs.shape) < 0.4
        mask[:, 0] = False
        mask = backend.asarray(mask)
    with no_grad():
        model(inputs, key_padding_mask=mask)
    assume(smallest_gap(model) > GAP)

    def loss():
        main = loss_fn(model(inputs, key_padding_mask=mask), targets)
        return backend.asarray(main + sum(v * c for v, c in model.aux_losses().values()))

    def backward(g):
        model.backward_aux({name: float(g) * c for name, (_, c) in model.aux_losses().items()})
        model.backward(loss_fn.backward(float(g)))

    assert_gradients_match(loss, backward, {}, dict(model.named_parameters()), seed=seed, rtol=LN_RTOL)


def test_backward_alone_is_the_main_losss_gradient_and_backward_aux_adds_the_rest():
    """backward(dlogits) without backward_aux: no auxiliary gradient; with it: the sum of the two separate runs."""
    config = LlamaConfig(vocab_size=11, d_model=8, num_layers=2, num_heads=2, num_kv_heads=1, d_ff=5, num_experts=4,
                         num_experts_per_tok=2, router_aux_loss_coef=0.3, router_z_loss_coef=0.2)
    model = randomize(Llama(config), 3)
    ids = np.random.default_rng(3).integers(0, 11, (2, 6))
    dlogits = backend.asarray(np.random.default_rng(4).standard_normal((2, 6, 11)))
    weights = {"load_balancing": 0.3, "router_z": 0.2}

    def grads(main, aux):
        model.zero_grad()
        model(ids)
        if aux:
            model.backward_aux(weights)
        model.backward(dlogits if main else dlogits * 0)
        return {n: backend.to_numpy(p.grad).copy() for n, p in model.named_parameters()}

    main, aux, both = grads(True, False), grads(False, True), grads(True, True)
    assert all(np.allclose(main[n] + aux[n], both[n], rtol=1e-12, atol=1e-15) for n in both)
    assert np.abs(aux["layers.0.mlp.gate.weight"]).max() > 0 and np.abs(aux["embed_tokens.weight"]).max() > 0
    assert not np.any(aux["layers.1.mlp.experts.down_proj"])  # the aux losses do not reach the experts' output
    with pytest.raises(ValueError, match=r"no auxiliary loss \['balance'\]"):
        model(ids)
        model.backward_aux({"balance": 1.0})
    model.clear_saved()


def test_the_parameter_count_and_a_dense_first_layer():
    config = LlamaConfig(vocab_size=50, d_model=16, num_layers=4, num_heads=4, num_kv_heads=2, d_ff=24, num_experts=8,
                         num_experts_per_tok=2, moe_d_ff=6, shared_expert_d_ff=12, mlp_only_layers=(0,),
                         decoder_sparse_step=1, qk_norm="projection", tie_word_embeddings=False)
    model = Llama(config)
    assert model.num_parameters() == model.num_parameters_of_shape()
    assert [type(layer.mlp).__name__ for layer in model.layers] == ["SwiGLU", "SparseMoE", "SparseMoE", "SparseMoE"]
    every_other = Llama(config.replace(mlp_only_layers=(), decoder_sparse_step=2))
    assert [type(layer.mlp).__name__ for layer in every_other.layers] == ["SwiGLU", "SparseMoE"] * 2
    assert from_folder_fields(folder_fields(config)) == config
    old = {k: v for k, v in folder_fields(config.replace(num_experts=0, qk_norm=None)).items()
           if k not in ("num_experts", "qk_norm", "mlp_only_layers", "moe_d_ff")}
    assert from_folder_fields(old).num_experts == 0  # a run saved before the experts reads as dense


@settings(max_examples=8, deadline=None)
@given(case=sparse_llamas(), steps=st.lists(st.integers(1, 2), min_size=1, max_size=3))
def test_decoding_a_sparse_model_through_the_cache_equals_the_full_forward(case, steps):
    config, _, seed = case
    model = randomize(Llama(config.replace(max_position_embeddings=16)), seed).eval()
    ids = np.random.default_rng(seed).integers(0, config.vocab_size, (2, sum(steps)))
    full, decoded, _ = decoded_in_steps(model, ids, steps)
    assert np.allclose(decoded, full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("fields, words", [
    (dict(num_experts=4, num_experts_per_tok=5), "num_experts_per_tok 5 is more than the 4 experts"),
    (dict(num_experts=4, mlp_only_layers=(3,)), r"mlp_only_layers must be a tuple of layer numbers in \[0, 1\)"),
    (dict(qk_norm="layer"), "qk_norm must be None, 'head' or 'projection'"),
    (dict(num_experts=-1), "num_experts must be an integer >= 0"),
    (dict(router_aux_loss_coef=-0.1), "router_aux_loss_coef must be a number >= 0"),
])
def test_a_sparse_config_that_does_not_fit_is_refused_naming_the_field(fields, words):
    with pytest.raises(ValueError, match=words):
        LlamaConfig(**(dict(vocab_size=50, d_model=8, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=8) | fields))


def test_the_walk_of_a_sparse_llama_is_made_of_the_real_gradients_and_names_its_lines():
    """The trace example with a sparse feed-forward (3 experts, top 2, a shared expert, q/k norms per head): every
    recorded upstream gradient and parameter gradient agrees with central differences (tests/test_trace.py's
    checks), the walk's sparse steps are the records of the experts and the router, and each names its line."""
    import pathlib
    from minitf import kinds
    from minitf.llama.study import build_trace_model
    from minitf.study import walk
    from minitf.study.tracer import run_next_token
    from tests.test_trace import analytic_and_numeric, llama_loss, upstream_gradients_checked
    root = pathlib.Path(__file__).resolve().parents[1]
    with backend.default_dtype("float64"):
        tracer, model, _ = run_next_token(build_trace_model(num_experts=3, num_experts_per_tok=2, qk_norm="head",
                                                            shared_expert_d_ff=4))
        assert smallest_gap(model) > GAP
        assert upstream_gradients_checked(tracer, model, llama_loss) >= 20
        analytic, numeric = analytic_and_numeric(model, llama_loss)
    assert np.abs(analytic - numeric).max() <= 1e-6 * np.abs(numeric).max() + 1e-8
    steps = [s for s in kinds.get("llama").walk(tracer, model).steps if not isinstance(s, str)]
    sparse = {s.label.split(":")[0]: s for s in steps if "layers.0.mlp" in s.label}
    router = [r for r in tracer.records if r.name == "layers.0.mlp.gate" and r.kind == "backward"]
    assert np.array_equal(sparse["layers.0.mlp.gate"].array, dict(router[0].inputs)["dy"])
    for step in steps:
        if step.code is not None:
            path, number = walk.source_line(*step.code)[0].split(":")
            line = (root / path).read_text(encoding="utf-8").splitlines()[int(number) - 1]
            assert line.strip().startswith(walk.source_line(*step.code)[1]), (step.label, line)


def test_a_sparse_llama_learns_with_its_auxiliary_loss_and_keeps_its_experts_in_use():
    """float32, Adam, 60 steps on a fixed batch of random text: the next-token loss falls, the load-balancing
    loss stays near its balanced value (k: the expert load spread) and every expert keeps some tokens; the step is
    the one the trainer should run: forward, aux_losses, backward_aux, backward, step."""
    with backend.default_dtype("float32"):
        backend.manual_seed(0)
        config = LlamaConfig(vocab_size=32, d_model=16, num_layers=2, num_heads=2, num_kv_heads=1, d_ff=16,
                             num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.05, router_z_loss_coef=1e-3)
        model = Llama(config)
        optimizer = minitf.Adam(model.parameters(), lr=3e-3)
        loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
        ids = np.random.default_rng(0).integers(0, 32, (4, 17))
        losses, balance = [], []
        for _ in range(60):
            model.zero_grad()
            loss = loss_fn(model(ids[:, :-1]), ids[:, 1:])
            aux = model.aux_losses()
            model.backward_aux({name: c for name, (_, c) in aux.items()})
            model.backward(loss_fn.backward())
            optimizer.step()
            losses.append(loss)
            balance.append(aux["load_balancing"][0])
        loads = model.expert_load()
    assert losses[-1] < 0.5 * losses[0], losses
    assert max(balance) < 1.5 * config.num_experts_per_tok, balance  # k when perfectly balanced
    assert all((load > 0).all() and load.sum() == 4 * 16 * 2 for load in loads), loads
