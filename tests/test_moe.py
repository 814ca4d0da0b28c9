"""The sparse feed-forward block (minitf.moe): its forward against the plain definition (a loop over tokens and
their chosen experts, written here), its gradients against float64 central differences (inputs, router, every
expert, the shared expert; rtol 1e-6 as every layer's, with the top-k choices kept away from ties so that the
differences of h = 1e-6 never flip one), the unchosen experts' zero gradient, and the auxiliary losses alone
(value against their definitions, gradient against central differences)."""
import pytest
from hypothesis import assume, given, settings, strategies as st

from minitf import backend
from minitf.module import no_grad
from minitf.moe import (SparseMoE, aux_losses, backward_aux, load_balancing_loss, load_balancing_loss_backward,
                        router_z_loss, router_z_loss_backward)
from minitf.layers import softmax
from tests.helpers import assert_gradients_match, np, random_array, randomize, seeds

pytestmark = pytest.mark.usefixtures("float64")

#: the smallest gap between the k-th and the (k+1)-th router probability the gradient tests accept: a central
#: difference of h = 1e-6 moves a probability by about 1e-6 |W_router|, far less
GAP = 1e-4


def routing_gap(block, x):
    """The smallest gap, over the tokens, between the k-th and (k+1)-th largest router probability (inf: k = E)."""
    with no_grad():
        p = backend.to_numpy(softmax(x.reshape(-1, x.shape[-1]) @ block.gate.weight.data))
    if block.top_k == block.num_experts:
        return np.inf
    s = -np.sort(-p, axis=-1)
    return float((s[:, block.top_k - 1] - s[:, block.top_k]).min())


@st.composite
def blocks(draw):
    E = draw(st.integers(1, 5))
    k = draw(st.integers(1, E))
    D, F = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    shared = draw(st.sampled_from([None, draw(st.integers(1, 3))]))
    seed = draw(seeds)
    block = randomize(SparseMoE(D, F, E, k, norm_topk_prob=draw(st.booleans()), shared_d_ff=shared), seed,
                      scale=1.0)
    x = random_array(seed + 7, (draw(st.integers(1, 3)), draw(st.integers(1, 4)), D))
    return block, x, seed


def plain_forward(block, x):
    """The definition, token by token, expert by expert (no grouping)."""
    N, D = x.size // x.shape[-1], x.shape[-1]
    x = backend.to_numpy(x).reshape(N, D)
    W = {n: backend.to_numpy(p.data) for n, p in block.named_parameters()}
    logits = x @ W["gate.weight"]
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = np.zeros_like(x)
    silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
    for n in range(N):
        chosen = np.argsort(-p[n], kind="stable")[:block.top_k]
        w = p[n, chosen] / (p[n, chosen].sum() if block.norm_topk_prob else 1.0)
        for j, e in enumerate(chosen):
            h = silu(x[n] @ W["experts.gate_proj"][e]) * (x[n] @ W["experts.up_proj"][e])
            y[n] += w[j] * (h @ W["experts.down_proj"][e])
        if block.shared_expert is not None:
            h = silu(x[n] @ W["shared_expert.gate_proj.weight"]) * (x[n] @ W["shared_expert.up_proj.weight"])
            y[n] += (h @ W["shared_expert.down_proj.weight"]) / (1 + np.exp(-(x[n] @ W["shared_expert_gate.weight"])))
    return y


@settings(max_examples=40)
@given(case=blocks())
def test_the_grouped_forward_is_the_plain_definition(case):
    block, x, _ = case
    with no_grad():
        y = backend.to_numpy(block(x))
    assert y.shape == x.shape
    assert np.allclose(y.reshape(-1, x.shape[-1]), plain_forward(block, x), rtol=1e-12, atol=1e-13)


@settings(max_examples=40)
@given(case=blocks())
def test_sparse_block_gradients(case):
    """dx, the router's, every expert's and the shared expert's gradients against central differences."""
    block, x, seed = case
    assume(routing_gap(block, x) > GAP)
    assert_gradients_match(block, x, seed=seed)


def test_an_expert_no_token_chose_gets_no_gradient_and_chosen_ones_do():
    backend.manual_seed(0)
    block = randomize(SparseMoE(4, 3, 6, 2), 1)
    x = random_array(2, (1, 3, 4))                       # 3 tokens x 2 slots: at most 6 of 6 experts, here fewer
    y = block(x)
    load = block.load()
    block.backward(backend.asarray(np.ones_like(backend.to_numpy(y))))
    grads = backend.to_numpy(block.experts.gate_proj.grad)
    assert load.sum() == 6 and (load == 0).any() and (load > 0).any()
    for e in range(6):
        assert (np.abs(grads[e]).max() > 0) == (load[e] > 0), (e, load)
    assert np.abs(backend.to_numpy(block.gate.weight.grad)).max() > 0   # the router learns through the weights


@given(k=st.integers(1, 3), norm=st.booleans(), seed=seeds)
def test_which_router_logits_the_main_loss_reaches(k, norm, seed):
    """Without renormalisation (Qwen2-MoE, OLMoE) the softmax over all experts couples them: an unchosen expert's
    logit gets -p_e <dp, p>, nonzero. With it (Mixtral) the renormalised top-k of a softmax over all E is the
    softmax of the k chosen logits alone: the renormalisation's Jacobian cancels the coupling and the unchosen
    logits get exactly 0; with k = 1 the weight is always 1 and no logit gets anything (docs/moe.md)."""
    block = randomize(SparseMoE(3, 2, 4, k, norm_topk_prob=norm), seed)
    seen = []
    backward = block.gate.backward
    block.gate.backward = lambda dlogits: seen.append(backend.to_numpy(dlogits)) or backward(dlogits)
    y = block(random_array(seed, (5, 3)))
    _, p, idx = block.routing
    block.backward(backend.asarray(random_array(seed + 1, tuple(y.shape))))
    (dlogits,) = seen
    chosen = np.zeros(dlogits.shape, bool)
    np.put_along_axis(chosen, backend.to_numpy(idx), True, axis=-1)
    scale = np.abs(dlogits).max()
    if norm:
        assert np.abs(dlogits[~chosen]).max() <= 1e-15 * max(scale, 1.0)
        assert (scale > 1e-8) == (k > 1)
    else:
        assert np.abs(dlogits[~chosen]).max() > 1e-8 * scale > 0


# --------------------------------------------------------------------------- #
# The auxiliary losses alone
# --------------------------------------------------------------------------- #
@st.composite
def routings(draw):
    E = draw(st.integers(1, 6))
    k = draw(st.integers(1, E))
    R = draw(st.integers(1, 8))
    seed = draw(seeds)
    logits = random_array(seed, (R, E), 2.0)
    p = backend.to_numpy(softmax(logits))
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    rows = draw(st.sampled_from([None, (np.random.default_rng(seed).random(R) < 0.7).astype(float)]))
    if rows is not None:
        rows[0] = 1.0
    return logits, idx, E, rows, seed


@given(case=routings())
def test_the_load_balancing_loss_is_its_definition_and_its_gradient_goes_through_p_only(case):
    logits, idx, E, rows, seed = case
    p = softmax(logits)
    r = np.ones(len(idx)) if rows is None else rows
    counts = np.zeros((len(idx), E))
    np.put_along_axis(counts, idx, 1.0, axis=-1)
    f = (counts * r[:, None]).sum(0) / r.sum()
    P = (backend.to_numpy(p) * r[:, None]).sum(0) / r.sum()
    assert load_balancing_loss(p, idx, E, rows) == pytest.approx(E * (f * P).sum(), rel=1e-12)
    # the gradient with respect to p, the choices held fixed (they are: f is constant where no tie flips)
    assert_gradients_match(lambda p: backend.asarray(load_balancing_loss(p, idx, E, rows)),
                           lambda g: (float(g) * load_balancing_loss_backward(p, idx, E, rows),), {"p": p},
                           seed=seed)


@given(case=routings())
def test_the_router_z_loss_and_its_gradient(case):
    logits, _, _, rows, seed = case
    r = np.ones(logits.shape[0]) if rows is None else rows
    lse = np.log(np.exp(backend.to_numpy(logits)).sum(-1))
    assert router_z_loss(logits, rows) == pytest.approx((r * lse ** 2).sum() / r.sum(), rel=1e-12)
    assert_gradients_match(lambda z: backend.asarray(router_z_loss(z, rows)),
                           lambda g: (float(g) * router_z_loss_backward(logits, rows),), {"z": logits}, seed=seed)


@settings(max_examples=25)
@given(case=blocks(), lb=st.floats(0.0, 2.0), z=st.floats(0.0, 2.0))
def test_the_auxiliary_losses_gradient_through_the_block_reaches_router_and_input(case, lb, z):
    """backward_aux between the forward and the backward (with a zero dy): the gradient of lb * load balancing
    + z * z-loss with respect to x and the router against central differences of the losses (the experts get
    none)."""
    block, x, seed = case
    assume(routing_gap(block, x) > GAP)
    coefficients = {"load_balancing": lb, "router_z": z}
    params = dict(block.named_parameters())

    # the function form: the losses' sum is the one output; dy = 0, so the block's backward carries theirs alone
    def loss(x):
        y = block(x)
        value = sum(v * c for v, c in aux_losses([block], coefficients).values())
        loss.y = y
        return backend.asarray(value)

    def loss_backward(g):
        backward_aux([block], {name: float(g) * c for name, c in coefficients.items()})
        return (block.backward(xp_zeros(loss.y.shape)),)

    assert_gradients_match(loss, loss_backward, {"x": x}, params, seed=seed, caches=False)
    for name in ("experts.gate_proj", "experts.up_proj", "experts.down_proj"):
        assert not np.any(backend.to_numpy(params[name].grad))


def xp_zeros(shape):
    return backend.asarray(np.zeros(shape))


def test_the_block_on_a_cupy_like_strict_backend_one_host_copy_a_forward_no_float64():
    """On tests/strict_xp.py's stand-in: no implicit host conversion, no host array mixed in; one device-to-host
    copy per forward (the tokens per expert, which the loop over the experts needs on the host) and none in the
    backward; a float32 block makes no float64 array; the numbers are NumPy's bit for bit."""
    from tests import strict_xp
    with backend.default_dtype("float32"):
        block = randomize(SparseMoE(6, 4, 5, 2, shared_d_ff=3), 3)
        x = random_array(4, (2, 3, 6)).astype(np.float32)
        dy = random_array(5, (2, 3, 6)).astype(np.float32)
        expected_y = backend.to_numpy(block(x))
        expected_dx = backend.to_numpy(block.backward(dy))
        expected_grads = {n: backend.to_numpy(p.grad).copy() for n, p in block.named_parameters()}
        block.zero_grad()
        with strict_xp.active() as counts:
            for p in block.parameters():
                p.data, p.grad = backend.asarray(backend.to_numpy(p.data)), backend.asarray(backend.to_numpy(p.grad))
            xs, dys = backend.asarray(x), backend.asarray(dy)
            counts.reset()
            counts.watch_float64 = True
            y = block(xs)
            assert counts.to_host == 1
            dx = block.backward(dys)
            assert counts.to_host == 1 and counts.float64_results == 0
            got = {n: backend.to_numpy(p.grad) for n, p in block.named_parameters()}
            assert np.array_equal(backend.to_numpy(y), expected_y) and np.array_equal(backend.to_numpy(dx), expected_dx)
        assert all(np.array_equal(got[n], expected_grads[n]) for n in got)
