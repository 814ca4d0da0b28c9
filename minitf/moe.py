"""Mixtures of experts: the sparse feed-forward block (Mixtral's, Qwen2-MoE's, Qwen3-MoE's, OLMoE's) and its two
auxiliary losses, each forward beside its backward (docs/moe.md derives the router's backward).

    logits = x W_router                  (N, E)  a linear router without bias
    p = softmax(logits)                  (N, E)  over all E experts
    idx = top-k of p                     (N, k)  the chosen experts (not differentiable: a choice)
    w = p[idx] (/ sum p[idx])            (N, k)  renormalised to sum 1 where norm_topk_prob says so
    y = sum_j w_j expert_idx_j(x)  (+ sigmoid(x w_s) shared(x), Qwen2-MoE's shared expert)

Each expert is a SwiGLU ``down(silu(x gate) * (x up))``; the E experts' matrices are stored stacked:
``gate_proj`` and ``up_proj`` (E, D, F), ``down_proj`` (E, F, D) (minitf's (in, out) layout per expert).

The N * k (token, slot) assignments are sorted by expert (one argsort), the tokens gathered in that order, so each
expert's tokens are one contiguous group: its three products run on that group alone, and the work grows with k,
not with E. The results are scattered back to their (token, slot) places and summed over the k slots.

Shapes: N tokens (every leading axis flattened), D d_model, E experts, k experts per token, F an expert's width,
M = N * k assignments.
"""
from minitf import backend
from minitf.backend import xp
from minitf.layers import Linear, SiLU, SwiGLU, init_array, sigmoid, softmax, softmax_backward
from minitf.module import Module, Parameter, is_grad_enabled

#: the auxiliary losses a sparse model reports, by name (:func:`load_balancing_loss`, :func:`router_z_loss`)
AUX_LOSSES = ("load_balancing", "router_z")
#: the metrics.jsonl key of each training step's tokens per expert, a list of E counts per sparse layer (written by
#: the Llama kind's trainer, drawn by the inspection page)
LOAD_RECORD = "expert_load"


class Experts(Module):
    """E SwiGLU experts, their matrices stacked: ``gate_proj``, ``up_proj`` (E, D, F), ``down_proj`` (E, F, D).

    ``forward(xs, counts)``: xs (M, D) the gathered tokens, sorted by expert, ``counts`` (E,) host integers (how
    many rows of xs each expert takes, in order) -> ys (M, D), row m the output of the expert whose group holds it.
    """

    def __init__(self, num_experts, d_model, d_ff):
        rng = backend.init_rng()
        E, D, F = num_experts, d_model, d_ff
        self.gate_proj = Parameter(init_array(rng.normal(0.0, 0.02, (E, D, F))))
        self.up_proj = Parameter(init_array(rng.normal(0.0, 0.02, (E, D, F))))
        self.down_proj = Parameter(init_array(rng.normal(0.0, 0.02, (E, F, D))))
        self.act = SiLU()

    @staticmethod
    def groups(counts):
        """[(expert, start, end)] of the non-empty groups of rows, from the host counts (E,)."""
        ends = backend.host.cumsum(counts)
        return [(e, int(end - n), int(end)) for e, (n, end) in enumerate(zip(counts, ends)) if n]

    def forward(self, xs, counts):
        M, D = xs.shape
        F = self.gate_proj.shape[-1]
        g, u = xp.empty((M, F), dtype=xs.dtype), xp.empty((M, F), dtype=xs.dtype)
        groups = self.groups(counts)
        # One loop over the experts (E iterations at most, never over tokens): each product is one matrix product
        # on the contiguous rows of that expert's tokens, so the work is M rows whatever E is.
        for e, a, b in groups:
            g[a:b] = xs[a:b] @ self.gate_proj.data[e]                # g = x W_gate[e]  (rows a:b, F)
            u[a:b] = xs[a:b] @ self.up_proj.data[e]                  # u = x W_up[e]  (rows a:b, F)
        act = self.act(g)                                            # silu(g)  (M, F)
        h = backend.by_rows(xp.multiply, act, u)                     # h = silu(g) * u, on blocks of rows  (M, F)
        ys = xp.empty((M, D), dtype=xs.dtype)
        for e, a, b in groups:
            ys[a:b] = h[a:b] @ self.down_proj.data[e]                # y = h W_down[e]  (rows a:b, D)
        self.save_for_backward(xs=xs, act=act, u=u, h=h, groups=groups)
        return ys

    def backward(self, dys):
        """dys (M, D) -> dxs (M, D); adds into each expert's three gradients its own tokens' part only (an expert
        that took no token gets nothing)."""
        s = self.saved_tensors()
        dh = xp.empty_like(s.h)
        for e, a, b in s.groups:
            # y = h W_down[e] on rows a:b  =>  dW_down[e] = h^T dy over those rows, dh = dy W_down[e]^T
            self.down_proj.grad[e] += s.h[a:b].T @ dys[a:b]
            dh[a:b] = dys[a:b] @ self.down_proj.data[e].T
        # h = silu(g) * u  =>  d silu(g) = dh * u,  du = dh * silu(g)  (the product rule), on blocks of rows
        dact, du = backend.by_rows(lambda dh, u, act: (dh * u, dh * act), dh, s.u, s.act)
        dg = self.act.backward(dact)                                 # g -> silu(g): SiLU's backward
        dxs = xp.empty_like(s.xs)
        for e, a, b in s.groups:
            # g = x W_gate[e], u = x W_up[e] on rows a:b  =>  dW = x^T dg, x^T du; dx = dg W_gate^T + du W_up^T
            self.gate_proj.grad[e] += s.xs[a:b].T @ dg[a:b]
            self.up_proj.grad[e] += s.xs[a:b].T @ du[a:b]
            dxs[a:b] = dg[a:b] @ self.gate_proj.data[e].T + du[a:b] @ self.up_proj.data[e].T
        return dxs


def stable_argsort(a, axis=-1):
    """``argsort`` keeping equal values in their order: NumPy's kind="stable" (CuPy's argsort is always stable and
    takes no other kind)."""
    return xp.argsort(a, axis=axis) if backend.get_device() == "gpu" else xp.argsort(a, axis=axis, kind="stable")


def put_rows(target, idx, values):
    """``target[n, idx[n, j]] = values[n, j]`` for target (N, E), idx and values (N, k): NumPy's put_along_axis on
    the last axis, as one indexed assignment (CuPy has it too)."""
    target[xp.arange(idx.shape[0])[:, None], idx] = values


def top_k(probs, k):
    """(idx, chosen) of probs (N, E): the k largest of each row, largest first (ties: the lower index first, as
    ``torch.topk`` on distinct values), idx (N, k) integers and chosen = probs[idx] (N, k)."""
    idx = stable_argsort(-probs)[:, :k]                              # (N, k)
    return idx, xp.take_along_axis(probs, idx, axis=-1)


class SparseMoE(Module):
    """The sparse feed-forward block: a router ``gate`` (Linear D -> E, no bias), the softmax over all E experts,
    the top ``top_k``, their probabilities renormalised to sum 1 when ``norm_topk_prob``, and ``experts`` (an
    :class:`Experts` of width ``d_ff``); with ``shared_d_ff``, Qwen2-MoE's ``shared_expert`` (a SwiGLU of that
    width, every token) scaled by ``sigmoid(x shared_expert_gate)`` (Linear D -> 1, no bias). x, y (..., D).

    After a forward, :attr:`routing` holds that forward's (logits (N, E), probs (N, E), idx (N, k)) for the
    auxiliary losses and the expert load, and :attr:`routing_weights` its weights w (N, k) (:meth:`choices`);
    :meth:`add_router_gradient` parks a gradient with respect to the router logits that the next :meth:`backward`
    adds to the one from y (the auxiliary losses' way in).
    """

    def __init__(self, d_model, d_ff, num_experts, top_k, norm_topk_prob=True, shared_d_ff=None):
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be between 1 and num_experts {num_experts}, got {top_k}")
        self.num_experts, self.top_k, self.norm_topk_prob = num_experts, top_k, norm_topk_prob
        self.gate = Linear(d_model, num_experts, bias=False)
        self.experts = Experts(num_experts, d_model, d_ff)
        if shared_d_ff:
            self.shared_expert = SwiGLU(d_model, shared_d_ff)
            self.shared_expert_gate = Linear(d_model, 1, bias=False)
        else:
            self.shared_expert = self.shared_expert_gate = None
        self.routing = self.routing_weights = None
        self.router_gradient = None

    def forward(self, x):
        shape = x.shape
        N, k = x.size // shape[-1], self.top_k
        x = x.reshape(N, shape[-1])                                  # (N, D)
        logits = self.gate(x)                                        # router logits = x W_router  (N, E)
        probs = softmax(logits)                                      # p = softmax over all experts  (N, E)
        idx, chosen = top_k(probs, k)                                # the k chosen experts, p of them  (N, k)
        total = chosen.sum(axis=-1, keepdims=True)                   # (N, 1)
        weights = chosen / total if self.norm_topk_prob else chosen  # w = p[idx] / sum p[idx]  (N, k)
        # group the M = N k (token, slot) assignments by expert: one stable sort of their experts
        flat = idx.reshape(-1)                                       # expert of assignment m = n k + j  (M,)
        order = stable_argsort(flat)                                 # assignments, expert by expert  (M,)
        token = order // k                                           # the token of each sorted assignment  (M,)
        counts = backend.to_numpy(xp.bincount(flat, minlength=self.num_experts))  # tokens per expert (host, E)
        xs = x[token]                                                # gathered, grouped by expert  (M, D)
        ys = self.experts(xs, counts)                                # each group through its expert  (M, D)
        w_sorted = weights.reshape(-1)[order]                        # each assignment's weight  (M,)
        # scatter back to (token, slot) order and sum the k slots: y_n = sum_j w_nj expert_nj(x_n)
        out = xp.empty_like(ys)
        out[order] = ys * w_sorted[:, None]                          # (M, D), assignment m = n k + j
        y = out.reshape(N, k, -1).sum(axis=1)                        # (N, k, D) -> (N, D)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)                           # shared(x)  (N, D)
            s = sigmoid(self.shared_expert_gate(x))                  # sigmoid(x w_s)  (N, 1)
            y = y + s * shared                                       # y += sigmoid(x w_s) shared(x)
            self.save_for_backward(probs=probs, idx=idx, chosen=chosen, total=total, weights=weights, order=order,
                                   token=token, ys=ys, w_sorted=w_sorted, shape=shape, shared=shared, s=s)
        else:
            self.save_for_backward(probs=probs, idx=idx, chosen=chosen, total=total, weights=weights, order=order,
                                   token=token, ys=ys, w_sorted=w_sorted, shape=shape)
        self.routing, self.routing_weights = (logits, probs, idx), weights
        self.router_gradient = None
        return y.reshape(shape)                                      # (..., D)

    def add_router_gradient(self, dlogits):
        """Park ``dlogits`` (N, E), a gradient with respect to the last forward's router logits (an auxiliary
        loss's), for the next :meth:`backward` to add to the router's (it reaches W_router and x there)."""
        if self.routing is None or not is_grad_enabled():
            raise RuntimeError("add_router_gradient needs a forward run with gradients on first")
        self.router_gradient = dlogits if self.router_gradient is None else self.router_gradient + dlogits

    def backward(self, dy):
        """dy (..., D) -> dx (..., D); adds the experts', the router's (and the shared expert's) gradients."""
        s = self.saved_tensors()
        N, k = s.probs.shape[0], self.top_k
        dy = dy.reshape(N, -1)                                       # (N, D)
        dx = xp.zeros_like(dy)
        if self.shared_expert is not None:
            # y += s * shared, s = sigmoid(g), g = x w_s  =>  dshared = dy s,  dg = sum(dy * shared) s (1 - s)
            dx += self.shared_expert.backward(dy * s.s)
            dgate = (dy * s.shared).sum(axis=-1, keepdims=True) * s.s * (1.0 - s.s)   # (N, 1)
            dx += self.shared_expert_gate.backward(dgate)
        # y_n = sum_j w_nj ys_(nk+j)  =>  each sorted assignment m gets dy of its token: dys_m = dy_token(m) w_m,
        # and dw_m = dy_token(m) . ys_m
        dy_sorted = dy[s.token]                                      # (M, D)
        dw_sorted = (dy_sorted * s.ys).sum(axis=-1)                  # (M,)
        dxs = self.experts.backward(dy_sorted * s.w_sorted[:, None])  # (M, D)
        # xs = x[token]  =>  dx_n = the sum of dxs over the k assignments of token n (scatter back, sum the slots)
        back = xp.empty_like(dxs)
        back[s.order] = dxs                                          # (M, D), assignment m = n k + j
        dx += back.reshape(N, k, -1).sum(axis=1)                     # (N, k, D) -> (N, D)
        dweights = xp.empty_like(dw_sorted)
        dweights[s.order] = dw_sorted
        dweights = dweights.reshape(N, k)                            # (N, k)
        if self.norm_topk_prob:
            # w_j = c_j / t, t = sum_i c_i  =>  dc_j = (dw_j - sum_i dw_i w_i) / t  (the renormalisation's Jacobian)
            dchosen = (dweights - (dweights * s.weights).sum(axis=-1, keepdims=True)) / s.total
        else:
            dchosen = dweights                                       # w = c
        # chosen = probs[idx]: the gradient goes to the chosen entries only (top-k is a choice, not a function
        # of p with a derivative: it is locally constant); the unchosen probabilities get 0 from y
        dprobs = xp.zeros_like(s.probs)
        put_rows(dprobs, s.idx, dchosen)                             # (N, E)
        dlogits = softmax_backward(s.probs, dprobs)                  # p = softmax(logits): over all E
        if self.router_gradient is not None:                         # an auxiliary loss's, parked before
            dlogits = dlogits + self.router_gradient
            self.router_gradient = None
        dx += self.gate.backward(dlogits)                            # logits = x W_router
        return dx.reshape(s.shape)                                   # (N, D) -> (..., D)

    def choices(self):
        """What the router chose in the last forward, host arrays: (idx (N, k) the experts of each token, its first
        choice first; weights (N, k) the weight each one's output was summed with; probs (N, E) the router's
        probabilities over all E experts)."""
        _, probs, idx = self.routing
        return tuple(backend.to_numpy(a) for a in (idx, self.routing_weights, probs))

    def load(self):
        """Tokens per expert of the last forward: host integers (E,) (the k assignments of every token counted)."""
        _, _, idx = self.routing
        return backend.to_numpy(xp.bincount(idx.reshape(-1), minlength=self.num_experts))


# --------------------------------------------------------------------------- #
# Auxiliary losses, each a function of the router's outputs with its own backward
# --------------------------------------------------------------------------- #
def _row_weights(n, row_weights, dtype):
    """(row weights (n, 1), their sum): 1 per row, or ``row_weights`` (n,) (0 for padding)."""
    if row_weights is None:
        return xp.ones((n, 1), dtype=dtype), float(n)
    r = xp.asarray(row_weights, dtype=dtype).reshape(n, 1)
    return r, float(r.sum())


def load_balancing_loss(probs, idx, num_experts, row_weights=None):
    """Switch Transformer's load-balancing loss (transformers' ``load_balancing_loss_func``):
    ``E * sum_e f_e P_e``, f_e = (assignments to e) / R, the fraction routed (its k slots summed: sum_e f_e = k),
    P_e = sum_n p_ne / R, the mean router probability; R rows (``row_weights`` (R,) weighs them, 0 for padding:
    transformers' attention mask). probs (R, E), idx (R, k): every sparse layer's rows stacked, as transformers
    concatenates its layers' router logits. -> a float."""
    R = probs.shape[0]
    r, total = _row_weights(R, row_weights, probs.dtype)
    routed = xp.zeros((R, num_experts), dtype=probs.dtype)
    put_rows(routed, idx, 1.0)                     # one-hot of the k choices  (R, E)
    f = (routed * r).sum(axis=0) / total                             # fraction routed  (E,)
    P = (probs * r).sum(axis=0) / total                              # mean probability  (E,)
    return float(num_experts * (f * P).sum())


def load_balancing_loss_backward(probs, idx, num_experts, row_weights=None):
    """d :func:`load_balancing_loss` / d probs -> (R, E): ``E f_e r_n / R_total``. The fraction routed f is a
    count of top-k choices, constant under a small change of p (a choice flips only at a tie), so it carries no
    gradient: the loss reaches the router through P alone."""
    R = probs.shape[0]
    r, total = _row_weights(R, row_weights, probs.dtype)
    routed = xp.zeros((R, num_experts), dtype=probs.dtype)
    put_rows(routed, idx, 1.0)
    f = (routed * r).sum(axis=0) / total                             # (E,)
    # loss = E sum_e f_e P_e, P_e = sum_n r_n p_ne / R_total  =>  dloss/dp_ne = E f_e r_n / R_total
    return num_experts * f[None, :] * r / total                      # (R, E)


def logsumexp(logits):
    """log sum_e exp(logits_e) of each row (R, E) -> (R,), shifted by the row's max."""
    m = logits.max(axis=-1, keepdims=True)
    return (m + xp.log(xp.exp(logits - m).sum(axis=-1, keepdims=True)))[:, 0]


def router_z_loss(logits, row_weights=None):
    """ST-MoE's router z-loss: the mean over rows of (logsumexp of the row's router logits)^2 (``row_weights`` as
    :func:`load_balancing_loss`'s). logits (R, E) -> a float."""
    r, total = _row_weights(logits.shape[0], row_weights, logits.dtype)
    z = logsumexp(logits)                                            # (R,)
    return float((r[:, 0] * z * z).sum() / total)


def router_z_loss_backward(logits, row_weights=None):
    """d :func:`router_z_loss` / d logits -> (R, E): ``2 z_n softmax(logits_n) r_n / R_total`` (d logsumexp =
    softmax)."""
    r, total = _row_weights(logits.shape[0], row_weights, logits.dtype)
    z = logsumexp(logits)[:, None]                                   # (R, 1)
    return 2.0 * z * softmax(logits) * r / total                     # (R, E)


def aux_losses(blocks, coefficients, row_weights=None):
    """{name: (value, coefficient)} of the auxiliary losses over ``blocks`` (SparseMoE, each after a forward),
    their rows stacked; ``coefficients`` {name: float} (names of :data:`AUX_LOSSES`; a name left out: not
    computed); ``row_weights`` (N,) for each block's N rows (0 for padding)."""
    blocks = list(blocks)
    if not blocks or not coefficients:
        return {}
    logits, probs, idx, rows = _stacked(blocks, row_weights)
    losses = {}
    if "load_balancing" in coefficients:
        losses["load_balancing"] = (load_balancing_loss(probs, idx, blocks[0].num_experts, rows),
                                    coefficients["load_balancing"])
    if "router_z" in coefficients:
        losses["router_z"] = (router_z_loss(logits, rows), coefficients["router_z"])
    return losses


def backward_aux(blocks, weights, row_weights=None):
    """Park in each block of ``blocks`` (after their forward, before their backward) the gradient of
    ``sum_name weights[name] * loss_name`` with respect to its router logits (:meth:`SparseMoE.add_router_gradient`):
    the load-balancing loss's through the softmax (d/dp, then p = softmax(logits)), the z-loss's directly."""
    blocks = list(blocks)
    unknown = sorted(set(weights) - set(AUX_LOSSES))
    if unknown:
        raise ValueError(f"no auxiliary loss {unknown}; the sparse blocks have {', '.join(AUX_LOSSES)}")
    if not blocks:
        return
    logits, probs, idx, rows = _stacked(blocks, row_weights)
    dlogits = xp.zeros_like(logits)
    if weights.get("load_balancing"):
        dprobs = load_balancing_loss_backward(probs, idx, blocks[0].num_experts, rows)
        dlogits += weights["load_balancing"] * softmax_backward(probs, dprobs)
    if weights.get("router_z"):
        dlogits += weights["router_z"] * router_z_loss_backward(logits, rows)
    start = 0
    for block in blocks:
        n = block.routing[0].shape[0]
        block.add_router_gradient(dlogits[start:start + n])         # this block's rows  (n, E)
        start += n


def _stacked(blocks, row_weights):
    """(logits, probs, idx, row weights or None) of every block's last routing, rows stacked block after block."""
    routings = [block.routing for block in blocks]
    if any(r is None for r in routings):
        raise RuntimeError("the auxiliary losses need a forward first (no routing recorded)")
    logits, probs, idx = (xp.concatenate([r[i] for r in routings], axis=0) for i in range(3))
    rows = None
    if row_weights is not None:
        rows = xp.concatenate([xp.asarray(row_weights, dtype=logits.dtype).reshape(-1)] * len(blocks))
    return logits, probs, idx, rows
