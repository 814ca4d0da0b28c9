"""Sampling from a model that continues text, one token at a time with the key/value cache: :func:`generate`
(greedy, temperature, top-k, nucleus, a repetition penalty), the sampler :func:`choose_tokens`, and the refusal
of logits that hold NaN or infinity (:func:`check_logits`, :func:`nonfinite_rows`), which the translation decoders
(:mod:`minitf.nmt.decode`) use too. Any model with the interface :func:`generate` names samples here: the GPT
(:mod:`minitf.gpt`) and the Llama family (:mod:`minitf.llama.model`).

Shapes: B batch, L prompt length, V vocabulary size.
"""
from minitf import backend
from minitf.module import no_grad
from minitf.transformer import check_ids

np = backend.host  # sampling works on the host: one (B, V) row of logits per step


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None, eos_id=None,
             return_logits=False, repetition_penalty=1.0):
    """Continue ``prompt`` (B, L) token ids by ``max_new_tokens`` tokens, one at a time.

    The prompt runs once; then each step runs the model on the one new token only, its
    self-attention reading the keys and values of every earlier position from a cache (the
    translation decoder's, ``MultiHeadAttention``'s ``cache``), so a step costs one position, not
    the whole sequence. ``temperature`` 0 is greedy (the most likely token); otherwise the token
    is drawn from softmax(logits / temperature), restricted to the ``top_k`` most likely tokens
    and to the smallest set of most likely tokens whose probability reaches ``top_p`` (nucleus
    sampling), by a host generator seeded with ``seed``; ``repetition_penalty`` (1: none) first scales the logits
    of every id the row holds so far, prompt included (:func:`penalize_repetition`, greedy too, as transformers'
    generate applies it). A row that produced ``eos_id`` (an id, or a list of
    ids: Llama 3 has several) repeats it; generation stops when every row has. Runs in eval mode under no_grad
    (the model's mode is restored). Returns ids (B, L + n), and with ``return_logits`` also the logits (B, n, V)
    each new token was chosen from.

    Any model with this interface generates here: ``model(ids, cache=dict, start=position)`` -> logits
    (B, L, V), ``vocab_size``, ``position_limit`` (the positions it has, or None), ``training``, ``eval()``
    and ``train(mode)`` (:class:`minitf.gpt.GPT`, :class:`minitf.llama.model.Llama`).
    """
    prompt = backend.to_numpy(check_ids(prompt, "prompt", model.vocab_size))
    B, L = prompt.shape
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")
    if not repetition_penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0 (1: none), got {repetition_penalty!r}")
    fed = L + max_new_tokens - 1  # the last new token is never fed back
    limit = model.position_limit
    if limit is not None and fed > limit:
        raise ValueError(f"a prompt of {L} tokens and {max_new_tokens} new tokens need {fed} positions, the model "
                         f"has {limit}; ask for at most {limit - L + 1} new tokens")
    eos_ids = None if eos_id is None else np.asarray([eos_id] if np.ndim(eos_id) == 0 else list(eos_id))
    rng = np.random.default_rng(seed)
    ids, steps, done = [prompt], [], np.zeros(B, dtype=bool)
    training = model.training
    model.eval()
    try:
        with no_grad():
            cache = {}
            logits = model(prompt, cache=cache)[:, -1]                       # the prompt once  (B, V)
            for step in range(max_new_tokens):
                row = backend.to_numpy(logits).astype(np.float64)           # (B, V) on the host
                check_logits(row, step, "generation")                       # no NaN reaches the sampler
                steps.append(row)
                seen = np.concatenate(ids, axis=1) if repetition_penalty != 1 else None  # (B, L + step)
                token = choose_tokens(row, temperature, top_k, top_p, rng, repetition_penalty, seen)  # (B,)
                if eos_ids is not None:
                    token = np.where(done, eos_ids[0], token)               # a finished row repeats eos
                    done |= np.isin(token, eos_ids)
                ids.append(token[:, None])
                if step + 1 == max_new_tokens or done.all():
                    break
                logits = model(token[:, None], cache=cache, start=L + step)[:, -1]  # one position
    finally:
        model.train(training)
    ids = np.concatenate(ids, axis=1)
    if return_logits:
        V = model.vocab_size
        return ids, (np.stack(steps, axis=1) if steps else np.zeros((B, 0, V)))
    return ids


def nonfinite_rows(logits):
    """(N,) bool, on the logits' own device (no host sync): which rows of ``logits`` (N, V) hold NaN or infinity.
    No token can be chosen from such a row (argmax and the sampler's CDF would both answer id 0, over and over).
    A row's sum is NaN or infinite when one of its entries is (one matrix-vector product, a pass over the
    logits; entries beyond 1e33, themselves an overflow, count too)."""
    module = np if isinstance(logits, np.ndarray) else backend.xp
    with np.errstate(invalid="ignore", over="ignore"):          # NaN and infinity are what it looks for
        return ~module.isfinite(logits @ module.ones(logits.shape[-1], dtype=logits.dtype))


def non_finite_logits_error(step, what):
    """The one-line FloatingPointError for non-finite logits: ``what`` ("generation", "translation") and the
    new token (``step`` from 0)."""
    return FloatingPointError(f"{what}: the model's logits for new token {step + 1} hold NaN or infinity, so no "
                              "token can be chosen; its weights are damaged or its arithmetic overflowed "
                              "(float16: use float32): check the model it was loaded from")


def check_logits(logits, step, what):
    """Refuse host ``logits`` (N, V) that hold NaN or infinity (:func:`nonfinite_rows`). The translation decoders,
    whose logits live on the device, carry the rows' flags in the copy they make each step instead."""
    if nonfinite_rows(logits).any():
        raise non_finite_logits_error(step, what)


def penalize_repetition(logits, seen, penalty):
    """``logits`` (B, V) with the entry of every id in ``seen`` (B, T) (each row its own ids) divided by
    ``penalty`` where positive and multiplied by it where negative: below 1 less likely for penalty > 1
    (transformers' ``RepetitionPenaltyLogitsProcessor``, CTRL's penalty). Returns a new (B, V) array."""
    B, V = logits.shape
    hit = np.zeros((B, V), dtype=bool)
    np.put_along_axis(hit, np.asarray(seen), True, axis=-1)               # the ids each row holds  (B, V)
    penalized = np.where(logits < 0, logits * penalty, logits / penalty)
    return np.where(hit, penalized, logits)


def choose_tokens(logits, temperature=1.0, top_k=None, top_p=None, rng=None, repetition_penalty=1.0, seen=None):
    """One token id per row of host ``logits`` (B, V): greedy at temperature 0, else a draw from
    softmax(logits / temperature) cut to the top_k most likely tokens and to the nucleus of
    probability top_p (the most likely token always stays); with ``repetition_penalty`` other than 1 the
    logits of the ids in ``seen`` (B, T) are penalized first (:func:`penalize_repetition`). Returns (B,) int64."""
    if repetition_penalty != 1:
        logits = penalize_repetition(logits, seen, repetition_penalty)
    if temperature == 0:
        return logits.argmax(axis=-1)
    B, V = logits.shape
    z = logits / temperature
    if top_k is not None and top_k < V:
        kth = np.partition(z, V - top_k, axis=-1)[:, V - top_k, None]     # the k-th largest  (B, 1)
        z = np.where(z >= kth, z, -np.inf)

    def softmax_rows(z):                                                 # a block of rows' softmax
        p = np.exp(z - z.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        return p
    p = backend.by_rows(softmax_rows, z)                                 # softmax (B, V), rows on threads
    if top_p is not None and top_p < 1:
        order = np.argsort(-p, axis=-1, kind="stable")                   # most likely first
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p                 # mass of the more likely tokens
        keep = np.zeros_like(p, dtype=bool)
        np.put_along_axis(keep, order, before < top_p, axis=-1)          # the nucleus, in vocabulary order
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    cdf = np.cumsum(p, axis=-1)
    u = (rng if rng is not None else np.random.default_rng()).random((B, 1)) * cdf[:, -1:]  # in [0, total)
    # inverse CDF: token i when cdf[i-1] <= u < cdf[i] (a token of probability 0 is never chosen)
    return (cdf <= u).sum(axis=-1)
