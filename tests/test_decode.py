"""Greedy decoding and beam search: the key/value cache against re-running the
whole prefix, beam size 1 against greedy, beam search against exhaustive
enumeration and against a plain one-sentence reference, the length caps, early
stopping, padding invariance and the restored training mode.

Exact comparisons run in float64 (logits allclose at 1e-10)."""
import pytest
from hypothesis import given, settings, strategies as st

import minitf
from minitf import backend
from minitf.backend import xp
from minitf.nmt.decode import (HuggingFaceRules, beam_search, beam_search_nbest, greedy_decode, inference_mode,
                               length_penalty, reorder_cache, top_k_columns, translate_texts)
from tests.helpers import np, seeds

pytestmark = pytest.mark.usefixtures("float64")
PAD, UNK, BOS, EOS = 0, 1, 2, 3


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #
def tiny_model(V, seed, logit_bias=0.0):
    """A small random Transformer. ``logit_bias`` adds a fixed random vector (V,)
    to every output's logits (random inits are nearly deterministic repeaters;
    the bias spreads the choices). The wrapper is on ``decode``, which
    ``forward`` also calls, so teacher forcing sees the very same model."""
    backend.manual_seed(seed)
    model = minitf.Transformer(V, V, d_model=8, num_heads=2, num_encoder_layers=2, num_decoder_layers=2,
                               d_ff=16, dropout=0.1)
    if logit_bias:
        bias = backend.asarray(np.random.default_rng(seed).normal(0.0, logit_bias, V))
        add_to_logits(model, bias)
    return model


def add_to_logits(model, bias):
    """Wrap ``model.decode`` to add ``bias`` (V,) to its logits; returns a list
    that gets one entry per decode call."""
    original, calls = model.decode, []

    def decode(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs) + bias

    model.decode = decode
    return calls


def set_logits_by_position(model, table):
    """Replace the model's logits by ``table[position]`` (P, V): a model whose
    every distribution is chosen by hand, the same with and without the cache."""
    original = model.decode

    def decode(tgt_ids, memory, mask, cache=None, start=0):
        logits = original(tgt_ids, memory, mask, cache=cache, start=start)
        return 0 * logits + table[start:start + tgt_ids.shape[1]]

    model.decode = decode


def eos_bias(V, amount):
    bias = np.zeros(V)
    bias[EOS] = amount
    return backend.asarray(bias)


@st.composite
def sources(draw, V, max_batch=3, max_len=5):
    """(B, S) host ids, real tokens (never pad) first, then padding; every row has one real token or more."""
    B, S = draw(st.integers(1, max_batch)), draw(st.integers(1, max_len))
    rng = np.random.default_rng(draw(seeds))
    src = rng.integers(1, V, (B, S))
    for row in range(B):
        src[row, draw(st.integers(1, S)):] = PAD
    return src


def log_softmax(x):
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def full_tokens(hyp, max_len):
    """The scored sequence |Y|: the tokens plus eos, unless cut at ``max_len``."""
    return list(hyp) if len(hyp) >= max_len else list(hyp) + [EOS]


def teacher_forced_scores(model, src_row, sequences, alpha):
    """log P(Y | X) / lp(|Y|) of each full sequence Y (with its eos, if any), by one
    teacher-forced forward pass; the pad token is banned as in decoding."""
    T = max(len(y) for y in sequences)
    tgt_in = np.full((len(sequences), T), PAD)
    for i, y in enumerate(sequences):
        tgt_in[i, :len(y)] = [BOS] + y[:-1]
    src = np.repeat(src_row[None], len(sequences), axis=0)
    model.eval()
    with minitf.no_grad():
        logp = log_softmax(backend.to_numpy(model(src, tgt_in)))
    return np.array([logp[i, np.arange(len(y)), y].sum() / length_penalty(len(y), alpha)
                     for i, y in enumerate(sequences)])


def reference_beam_search(model, src_row, K, alpha, max_len):
    """One sentence, Python lists, no cache: the same rules as ``beam_search_nbest``
    written plainly. Returns (best tokens, best score, every finished (tokens, score))."""
    model.eval()
    with minitf.no_grad():
        memory, mask = model.encode(backend.asarray(src_row[None]))
        live, finished = [([], 0.0)], []
        for t in range(max_len):
            candidates = []
            for tokens, score in live:
                logits = model.decode(backend.asarray(np.array([[BOS] + tokens])), memory, mask)
                logp = log_softmax(backend.to_numpy(logits)[0, -1])
                logp[PAD] = -np.inf
                candidates += [(score + logp[v], tokens + [v]) for v in range(len(logp))]
            candidates.sort(key=lambda c: -c[0])
            top, last = candidates[:2 * K], t + 1 == max_len
            finished += [(tokens, score / length_penalty(t + 1, alpha)) for score, tokens in top[:K]
                         if (tokens[-1] == EOS or last) and score > -np.inf]
            live = [(tokens, score) for score, tokens in top if tokens[-1] != EOS][:K]
            if last:
                break
            best = max([s for _, s in finished], default=-np.inf)
            bound = max(s for _, s in live) / max(length_penalty(t + 2, alpha), length_penalty(max_len, alpha))
            if best >= bound:
                break
    tokens, score = max(finished, key=lambda f: f[1])
    return [v for v in tokens if v != EOS], score, finished


# --------------------------------------------------------------------------- #
# The cache
# --------------------------------------------------------------------------- #
@given(V=st.integers(5, 9), seed=seeds, data=st.data(), T=st.integers(1, 6))
def test_cached_step_logits_equal_full_prefix_logits_also_after_reordering(V, seed, data, T):
    model = tiny_model(V, seed).eval()
    src = data.draw(sources(V))
    B = src.shape[0]
    rng = np.random.default_rng(seed)
    tgt = np.concatenate([np.full((B, 1), BOS), rng.integers(1, V, (B, T))], axis=1)  # no pad inside
    order = rng.integers(0, B, B)  # a reordering with repeats, as beams do
    split = int(rng.integers(1, T + 1))
    with minitf.no_grad():
        memory, mask = model.encode(backend.asarray(src))
        cache, steps = {}, []
        for t in range(T + 1):
            if t == split:  # reorder mid-way: rows follow order from now on
                reorder_cache(cache, backend.asarray(order))
                memory, mask, tgt = memory[backend.asarray(order)], mask[backend.asarray(order)], tgt[order]
                steps = [s[order] for s in steps]
            steps.append(backend.to_numpy(model.decode(backend.asarray(tgt[:, t:t + 1]), memory, mask,
                                                       cache=cache, start=t))[:, 0])
        full = backend.to_numpy(model.decode(backend.asarray(tgt), memory, mask))
    np.testing.assert_allclose(np.stack(steps, axis=1), full, rtol=0, atol=1e-10)
    assert cache[0]["self"]["length"] == T + 1 and cache[0]["self"]["k_room"].shape[:1] == (B,)
    assert cache[1]["cross"]["k"].shape == (B, src.shape[1], 8)


@given(data=st.data(), N=st.integers(1, 4), V=st.integers(1, 3000), ties=st.booleans())
def test_top_k_columns_finds_each_rows_k_largest(data, N, V, ties):
    """The grouped search of the beam's candidates (groups' maxima, then their entries and the tail) gives
    each row's k largest entries, as a full sort does: distinct columns, the same values (ties: any of them);
    with few distinct values (many ties) and -inf entries (banned ids), k up to V, vocabularies too small
    for groups and with a tail after the last slice."""
    k = data.draw(st.integers(1, min(V, 12)), label="k")
    rng = np.random.default_rng(data.draw(seeds, label="seed"))
    scores = rng.integers(-3, 3, (N, V)).astype(float) if ties else rng.standard_normal((N, V))
    scores[rng.random((N, V)) < 0.1] = -np.inf
    columns = backend.to_numpy(top_k_columns(backend.asarray(scores), k))
    assert columns.shape == (N, k)
    for row, cols in zip(scores, columns):
        assert len(set(cols.tolist())) == k and cols.min() >= 0 and cols.max() < V
        assert np.array_equal(np.sort(row[cols]), np.sort(row)[V - k:])


def test_reorder_cache_names_only_touch_those_sub_caches():
    a = xp.arange(6).reshape(3, 2)
    cache = {0: {"self": {"k_room": a, "v_room": a + 10, "length": 1}, "cross": {"k": a, "v": a}}}
    index = backend.asarray(np.array([2, 2, 0]))
    assert reorder_cache(cache, index, names=("self",)) is cache
    assert backend.to_numpy(cache[0]["self"]["v_room"]).tolist() == [[14, 15], [14, 15], [10, 11]]
    assert cache[0]["self"]["length"] == 1 and cache[0]["cross"]["k"] is a
    reorder_cache(cache, index)
    assert backend.to_numpy(cache[0]["cross"]["k"]).tolist() == [[4, 5], [4, 5], [0, 1]]


@given(V=st.integers(5, 9), seed=seeds, data=st.data(), K=st.integers(1, 3), alpha=st.sampled_from([0.0, 0.6]),
       max_len=st.integers(1, 7))
def test_cached_and_uncached_decoding_give_the_same_results(V, seed, data, K, alpha, max_len):
    model = tiny_model(V, seed, logit_bias=1.0)
    src = data.draw(sources(V))
    assert greedy_decode(model, src, max_len=max_len) == greedy_decode(model, src, max_len=max_len, use_cache=False)
    cached = beam_search_nbest(model, src, beam_size=K, alpha=alpha, max_len=max_len)
    uncached = beam_search_nbest(model, src, beam_size=K, alpha=alpha, max_len=max_len, use_cache=False)
    assert [[h for h, _ in e] for e in cached] == [[h for h, _ in e] for e in uncached]
    np.testing.assert_allclose([[s for _, s in e] for e in cached], [[s for _, s in e] for e in uncached],
                               rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- #
# Beam search against greedy, brute force and the reference
# --------------------------------------------------------------------------- #
@given(V=st.integers(5, 9), seed=seeds, data=st.data(), max_len=st.integers(1, 8))
def test_beam_size_one_without_length_penalty_is_greedy(V, seed, data, max_len):
    # with alpha > 0 a beam of 1 may legitimately keep going for a longer, better-normalised hypothesis
    model = tiny_model(V, seed, logit_bias=1.0)
    src = data.draw(sources(V))
    beam = beam_search(model, src, beam_size=1, alpha=0.0, max_len=max_len)
    assert beam == greedy_decode(model, src, max_len=max_len)


@given(seed=seeds, data=st.data(), alpha=st.sampled_from([0.0, 0.6, 1.5, -0.5]), bias=st.sampled_from([0.0, 2.0]))
def test_a_large_beam_finds_the_brute_force_best_on_a_tiny_vocabulary(seed, data, alpha, bias):
    """V = 5 (pad banned: 4 choices a step), max_len 3: 1 + 3 + 9 + 27 = 40 sequences.
    K = 36 >= the finite candidates of any step, so the search is exhaustive."""
    V, max_len, K = 5, 3, 36
    model = tiny_model(V, seed, logit_bias=bias)
    src = data.draw(sources(V, max_batch=2, max_len=4))
    continuing = [v for v in range(1, V) if v != EOS]
    sequences = [[EOS]] + [[a, EOS] for a in continuing] + [[a, b, EOS] for a in continuing for b in continuing] \
        + [[a, b, c] for a in continuing for b in continuing for c in continuing]
    best_hyps, best_scores = beam_search(model, src, beam_size=K, alpha=alpha, max_len=max_len, return_scores=True)
    nbest = beam_search_nbest(model, src, beam_size=K, alpha=alpha, max_len=max_len)
    for row in range(src.shape[0]):
        exact = teacher_forced_scores(model, src[row], sequences, alpha)
        order = np.argsort(-exact, kind="stable")
        assert best_hyps[row] == [v for v in sequences[order[0]] if v != EOS]
        assert best_scores[row] == pytest.approx(exact[order[0]], rel=1e-10)
        # the n-best list is the exact top K, best first
        np.testing.assert_allclose([s for _, s in nbest[row]], exact[order[:K]], rtol=1e-10)
        assert [full_tokens(h, max_len) for h, _ in nbest[row]][:3] == [sequences[i] for i in order[:3]]


@given(V=st.integers(5, 8), seed=seeds, data=st.data(), K=st.integers(1, 3),
       alpha=st.sampled_from([0.0, 0.6, 1.0]), max_len=st.integers(1, 5), bias=st.sampled_from([1.0, 3.0]))
def test_batched_beam_search_matches_the_reference_and_never_drops_a_better_hypothesis(V, seed, data, K, alpha,
                                                                                       max_len, bias):
    model = tiny_model(V, seed, logit_bias=bias)
    src = data.draw(sources(V))
    hyps, scores = beam_search(model, src, beam_size=K, alpha=alpha, max_len=max_len, return_scores=True)
    nbest = beam_search_nbest(model, src, beam_size=K, alpha=alpha, max_len=max_len)
    for row in range(src.shape[0]):
        expected, expected_score, finished = reference_beam_search(model, src[row], K, alpha, max_len)
        assert hyps[row] == expected
        assert scores[row] == pytest.approx(expected_score, rel=1e-10)
        # never dropped: the returned score is the best of every hypothesis the search finished
        assert scores[row] >= max(s for _, s in finished) - 1e-12
        # the n-best list is sorted and its scores are the model's own (teacher-forced) ones
        listed = [s for _, s in nbest[row]]
        assert listed == sorted(listed, reverse=True) and len(listed) <= K
        assert nbest[row][0][0] == hyps[row]
        exact = teacher_forced_scores(model, src[row], [full_tokens(h, max_len) for h, _ in nbest[row]], alpha)
        np.testing.assert_allclose(listed, exact, rtol=1e-10)


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("K", [1, 2])
def test_the_stop_is_exact_a_longer_better_normalised_hypothesis_is_not_lost(K, use_cache):
    """Step 0: eos (log p -0.51) against token 4 (-0.91); afterwards 4 is almost
    certain. With alpha = 1.5, [4] * 6 (cut at max_len 6) scores -0.91 / lp(6) = -0.37,
    better than [] at -0.51; a stop that bounds the live beam by lp(t + 2) instead of
    lp(max_len) (-0.91 / lp(2) = -0.72 < -0.51) would quit at step 0 and return []."""
    V, max_len = 6, 6
    table = np.full((max_len, V), -50.0)
    table[0, [EOS, 4]] = 0.4, 0.0
    table[1:, [EOS, 4]] = -10.0, 0.0
    model = tiny_model(V, 0)
    set_logits_by_position(model, backend.asarray(table))
    src = np.array([[4, 5]])
    log_p4 = log_softmax(table[0])[4] + log_softmax(table[1])[4] * (max_len - 1)
    hyps, scores = beam_search(model, src, beam_size=K, alpha=1.5, max_len=max_len, use_cache=use_cache,
                               return_scores=True)
    assert hyps == [[4] * max_len] and scores[0] == pytest.approx(log_p4 / length_penalty(max_len, 1.5), rel=1e-12)
    assert greedy_decode(model, src, max_len=max_len, use_cache=use_cache) == [[]]
    assert beam_search(model, src, beam_size=K, alpha=0.0, max_len=max_len, use_cache=use_cache) == [[]]


# --------------------------------------------------------------------------- #
# Lengths, stopping, padding, modes, inputs
# --------------------------------------------------------------------------- #
@settings(max_examples=8)  # each runs ~55 steps
@given(V=st.integers(5, 9), seed=seeds, data=st.data())
def test_outputs_never_exceed_source_length_plus_50(V, seed, data):
    model = tiny_model(V, seed)
    add_to_logits(model, eos_bias(V, -1e9))  # eos never wins: every output runs to its cap
    src = data.draw(sources(V))
    caps = (src != PAD).sum(axis=1) + 50
    assert [len(h) for h in greedy_decode(model, src)] == caps.tolist()
    assert [len(h) for h in beam_search(model, src, beam_size=2)] == caps.tolist()
    assert [len(h) for h in greedy_decode(model, src, max_len=3)] == [3] * len(src)
    assert [len(h) for h in beam_search(model, src, max_len=[2] * len(src))] == [2] * len(src)
    assert [len(h) for h in greedy_decode(model, src, max_len_offset=1)] == (caps - 49).tolist()


@given(V=st.integers(5, 9), seed=seeds, data=st.data(), max_len=st.integers(1, 10))
def test_decoding_stops_as_soon_as_every_sentence_is_done(V, seed, data, max_len):
    model = tiny_model(V, seed)
    calls = add_to_logits(model, eos_bias(V, data.draw(st.sampled_from([0.0, 1.0, 3.0]))))
    src = data.draw(sources(V))
    hyps = greedy_decode(model, src, max_len=max_len)
    # a sentence takes len + 1 steps (its eos), or max_len when cut
    assert len(calls) == max(min(len(h) + 1, max_len) for h in hyps)
    forced = tiny_model(V, seed)
    calls = add_to_logits(forced, eos_bias(V, 1e9))  # eos always wins: one step, empty outputs
    assert greedy_decode(forced, src) == [[]] * len(src) and len(calls) == 1
    assert beam_search(forced, src) == [[]] * len(src) and len(calls) == 2


@given(V=st.integers(5, 9), seed=seeds, data=st.data(), K=st.integers(1, 3), extra=st.integers(1, 3))
def test_padding_and_batch_company_do_not_change_a_sentence_output(V, seed, data, K, extra):
    model = tiny_model(V, seed, logit_bias=1.0)
    src = data.draw(sources(V))
    padded = np.concatenate([src, np.zeros((len(src), extra), dtype=src.dtype)], axis=1)
    alone = [[int(v) for v in row if v != PAD] for row in src]
    for decode in (greedy_decode, lambda m, s: beam_search(m, s, beam_size=K)):
        batched = decode(model, padded)
        assert batched == decode(model, backend.asarray(src)) == decode(model, alone)  # device array, ragged lists
        assert batched == [decode(model, np.array([row]))[0] for row in alone]      # each on its own, unpadded


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_one_sentence_of_one_token_matches_a_plain_argmax_loop(seed):
    """The smallest input, against a reference that re-runs the whole prefix with
    teacher forcing and takes the argmax (pad excluded) until eos or 1 + 50 tokens."""
    model = tiny_model(7, seed, logit_bias=2.0)
    src = np.array([[5]])
    expected = []
    with minitf.no_grad():
        model.eval()
        while len(expected) < 51:
            logits = backend.to_numpy(model(src, np.array([[BOS] + expected])))[0, -1]
            logits[PAD] = -np.inf
            token = int(logits.argmax())
            if token == EOS:
                break
            expected.append(token)
    assert greedy_decode(model, src) == [expected]
    assert beam_search(model, src, beam_size=1, alpha=0.0) == [expected]


def test_training_mode_is_restored_and_dropout_is_off_while_decoding():
    model = tiny_model(8, 1)
    src = np.array([[4, 5, 6], [7, 0, 0]])
    model.eval()
    reference = greedy_decode(model, src, max_len=6), beam_search(model, src, max_len=6)
    assert not any(m.training for m in model.modules())
    model.train()
    model.encoder.training = False  # a mixed state is put back as it was
    assert (greedy_decode(model, src, max_len=6), beam_search(model, src, max_len=6)) == reference
    assert all(m.training for m in model.modules() if m is not model.encoder) and not model.encoder.training


def test_bad_arguments_are_refused():
    model = tiny_model(6, 0)
    src = np.array([[4, 5]])
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, beam_size=0)
    with pytest.raises(ValueError, match="n_best"):
        beam_search_nbest(model, src, beam_size=2, n_best=3)
    with pytest.raises(ValueError, match="max_len"):
        greedy_decode(model, src, max_len=0)
    with pytest.raises(ValueError, match="rank 2"):
        greedy_decode(model, np.array([4, 5]))
    with pytest.raises(ValueError, match=r"ids in \[0, 6\)"):
        beam_search(model, np.array([[4, 9]]))


@pytest.mark.usefixtures("float64")
@given(seed=seeds, B=st.integers(1, 3))
def test_min_len_forbids_the_empty_translation(seed, B):
    """A model that always prefers eos: min_len=0 gives empty outputs, min_len=1 exactly one token."""
    backend.manual_seed(seed)
    model = minitf.Transformer(7, 7, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=16)
    decode = model.decode

    def eos_loving_decode(*args, **kwargs):
        logits = decode(*args, **kwargs)
        logits[..., 3] += 100.0
        return logits

    model.decode = eos_loving_decode
    src = np.random.default_rng(seed).integers(4, 7, (B, 4))
    assert greedy_decode(model, src) == [[]] * B
    assert all(len(tokens) == 1 for tokens in greedy_decode(model, src, min_len=1))
    for entries in beam_search_nbest(model, src, beam_size=3, min_len=1):
        assert entries and all(len(tokens) == 1 for tokens, _ in entries)


# --------------------------------------------------------------------------- #
# Hugging Face's rules (a Marian folder's decoding), against a plain reference
# --------------------------------------------------------------------------- #
def hf_step_logprobs(model, memory, mask, tokens, t, rules, max_len):
    """One sentence's next-token log-probabilities as transformers' generate processes them: log-softmax,
    pad and the banned ids -inf, the eos forced at the last step (-inf elsewhere, 0 on eos), renormalized."""
    logits = model.decode(backend.asarray(np.array([[BOS] + tokens])), memory, mask)
    logp = log_softmax(backend.to_numpy(logits)[0, -1])
    logp[[PAD, *rules.banned_ids]] = -np.inf
    if rules.forced_eos and t + 1 == max_len:
        logp[:] = -np.inf
        logp[EOS] = 0.0
    if rules.renormalize:
        logp = log_softmax(logp)
    return logp


def reference_hf_beam_search(model, src_row, K, rules, max_len):
    """One sentence, Python lists, no cache: transformers' _beam_search (5.25) written plainly. Running beams
    by summed log-probability; the top 2K candidates; those of the top K ending in eos (or at max_len) score
    sum / |Y| ** length_penalty into the K best finished; the K best others run on. After each step, once K
    are finished: early_stopping True stops; otherwise the best running sum divided by L ** length_penalty,
    L its current length (or max_len for "never" with length_penalty > 0), stops it unless it beats the
    worst finished. Returns the best finished tokens (without eos)."""
    lp, early = rules.length_penalty, rules.early_stopping
    model.eval()
    with minitf.no_grad():
        memory, mask = model.encode(backend.asarray(src_row[None]))
        running, finished = [([], 0.0)], []
        for t in range(max_len):
            candidates = []
            for tokens, score in running:
                logp = hf_step_logprobs(model, memory, mask, tokens, t, rules, max_len)
                candidates += [(score + logp[v], tokens + [v]) for v in range(len(logp))]
            candidates.sort(key=lambda c: -c[0])
            top, last = candidates[:2 * K], t + 1 == max_len
            finished += [(score / (t + 1) ** lp, tokens) for score, tokens in top[:K]
                         if (tokens[-1] == EOS or last) and score > -np.inf]
            finished = sorted(finished, key=lambda f: -f[0])[:K]
            running = [(tokens, score) for score, tokens in top if tokens[-1] != EOS][:K]
            if last:
                break
            if len(finished) == K:
                length = max_len if early == "never" and lp > 0 else t + 1
                if early is True or running[0][1] / length ** lp <= finished[-1][0]:
                    break
    return [v for v in finished[0][1] if v != EOS]


hf_rules = st.builds(HuggingFaceRules, length_penalty=st.sampled_from([1.0, 0.6, 2.0, -0.5]),
                     early_stopping=st.sampled_from([False, True, "never"]), renormalize=st.booleans(),
                     forced_eos=st.booleans(), banned_ids=st.sampled_from([(), (4,)]))


@given(V=st.integers(7, 9), seed=seeds, data=st.data(), K=st.integers(1, 2), rules=hf_rules,
       max_len=st.integers(1, 6), bias=st.sampled_from([1.0, 3.0]))
def test_beam_search_with_hugging_face_rules_matches_their_plain_reference(V, seed, data, K, rules, max_len, bias):
    """Batched (with and without the cache) equals the one-sentence reference of transformers' rules, for every
    early_stopping, length penalties of both signs, with and without renormalizing, forced eos, banned ids.
    (test_marian_generate.py compares with transformers itself.)"""
    model = tiny_model(V, seed, logit_bias=bias)
    add_to_logits(model, eos_bias(V, data.draw(st.sampled_from([0.0, 1.5]))))
    src = data.draw(sources(V))
    for use_cache in (True, False):
        hyps = beam_search(model, src, beam_size=K, max_len=max_len, rules=rules, use_cache=use_cache)
        assert hyps == [reference_hf_beam_search(model, src[row], K, rules, max_len) for row in range(len(src))]


@given(V=st.integers(6, 9), seed=seeds, data=st.data(), rules=hf_rules, max_len=st.integers(1, 6))
def test_greedy_with_hugging_face_rules_is_the_argmax_of_their_log_probabilities(V, seed, data, rules, max_len):
    """Pad and banned ids never come; with forced_eos a sentence that reaches max_len ends in eos there, so it
    has max_len - 1 tokens (without: max_len)."""
    model = tiny_model(V, seed, logit_bias=2.0)
    src = data.draw(sources(V))
    model.eval()
    expected = []
    with minitf.no_grad():
        for row in src:
            memory, mask = model.encode(backend.asarray(row[None]))
            tokens = []
            for t in range(max_len):
                token = int(hf_step_logprobs(model, memory, mask, tokens, t, rules, max_len).argmax())
                if token == EOS:
                    break
                tokens.append(token)
            expected.append(tokens)
    assert greedy_decode(model, src, max_len=max_len, rules=rules) == expected
    if rules.forced_eos:
        assert all(len(tokens) < max_len for tokens in expected)


def test_the_hugging_face_stop_is_its_heuristic_not_the_exact_bound():
    """The model of test_the_stop_is_exact_...: eos first (log p -0.51), then [4] * 6 is better normalised
    at length_penalty 1.5. Hugging Face's heuristic divides the running beam by its current length, stops
    at step 0 with K = 1 and answers [], where the paper's exact rule finds [4] * 6; early_stopping "never"
    divides by max_len and finds it too."""
    V, max_len = 6, 6
    table = np.full((max_len, V), -50.0)
    table[0, [EOS, 4]] = 0.4, 0.0
    table[1:, [EOS, 4]] = -10.0, 0.0
    model = tiny_model(V, 0)
    set_logits_by_position(model, backend.asarray(table))
    src = np.array([[4, 5]])
    heuristic = HuggingFaceRules(length_penalty=1.5)
    assert beam_search(model, src, beam_size=1, max_len=max_len, rules=heuristic) == [[]]
    assert beam_search(model, src, beam_size=1, max_len=max_len, alpha=1.5) == [[4] * max_len]
    never = HuggingFaceRules(length_penalty=1.5, early_stopping="never")
    assert beam_search(model, src, beam_size=1, max_len=max_len, rules=never) == [[4] * max_len]


def test_the_start_eos_and_pad_ids_default_to_the_model_config():
    """A model whose config names its own start and end (a Marian model's: start = pad = the last id, eos 0)
    decodes from them without being told; explicit ids still win."""
    V = 7
    backend.manual_seed(0)
    model = minitf.Transformer(V, V, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=16,
                               pad_id=V - 1, decoder_start_id=V - 1, eos_id=0, mask_target_padding=False)
    seen = []
    original = model.decode
    model.decode = lambda tgt, *args, **kwargs: seen.append(backend.to_numpy(tgt)[:, 0].tolist()) or original(
        tgt, *args, **kwargs)
    add_to_logits(model, backend.asarray(np.where(np.arange(V) == 0, 1e9, 0.0)))  # eos (id 0) at once
    src = np.array([[1, 2, V - 1]])
    assert greedy_decode(model, src, max_len=4) == [[]] and seen[0] == [V - 1]
    assert beam_search(model, src, beam_size=2, max_len=4) == [[]]
    first = len(seen)
    assert greedy_decode(model, src, max_len=2, eos_id=3, bos_id=1) == [[0, 0]] and seen[first] == [1]


def test_hugging_face_early_stopping_true_stops_once_k_are_finished():
    """K = 2, length_penalty 1, logits by position: step 0 finishes [] (eos second best, -0.97), step 1
    finishes [4] ((-0.47 - 1.31) / 2 = -0.89) while [4, 5] (-0.79) runs on; step 2 would finish [4, 5] at
    about -0.26. early_stopping True stops at two finished and answers [4]; False's heuristic (-0.79 / 2
    beats the worst finished) goes on to [4, 5]."""
    V, max_len = 7, 6
    table = np.full((max_len, V), -50.0)
    table[0, [EOS, 4]] = 0.0, 0.5
    table[1, [EOS, 5]] = 0.0, 1.0
    table[2:, EOS] = 10.0
    model = tiny_model(V, 0)
    set_logits_by_position(model, backend.asarray(table))
    src = np.array([[4, 5]])
    assert beam_search(model, src, beam_size=2, max_len=max_len, rules=HuggingFaceRules(early_stopping=True)) == [[4]]
    assert beam_search(model, src, beam_size=2, max_len=max_len, rules=HuggingFaceRules()) == [[4, 5]]
    assert reference_hf_beam_search(model, src[0], 2, HuggingFaceRules(early_stopping=True), max_len) == [4]


# --------------------------------------------------------------------------- #
# A pad id inside a sentence
# --------------------------------------------------------------------------- #
def by_hand_greedy(model, row, masked, max_len):
    """Greedy decoding of one sentence written plainly: the encoder run with the key padding mask ``masked``
    (one bool a position) given by hand, then the argmax (pad excluded) of the whole prefix each step."""
    src, mask = backend.asarray(np.array([row])), backend.asarray(np.array([masked]))
    out = []
    with inference_mode(model):
        memory = model.encoder(model.positional(model.src_embed(src)), mask)
        while len(out) < max_len:
            logits = backend.to_numpy(model.decode(backend.asarray(np.array([[BOS] + out])), memory, mask))[0, -1]
            logits[PAD] = -np.inf
            token = int(logits.argmax())
            if token == EOS:
                break
            out.append(token)
    return out


class IdsTokenizer:
    """Text of space-separated ids, as a tokenizer that reads a written "<pad>" as the pad id gives them."""
    pad_id, bos_id, eos_id = PAD, BOS, EOS

    def encode(self, texts):
        return [[int(v) for v in text.split()] for text in texts]

    def decode(self, id_lists):
        return [" ".join(map(str, ids)) for ids in id_lists]


def test_a_pad_id_inside_a_sentence_is_attended_to_not_masked():
    """A sentence holding the pad id (a "<pad>" written in the text, which a Marian tokenizer reads as that id,
    as transformers' does) is read whole: the source mask comes from each sentence's length, as transformers'
    attention_mask does, not from its ids. Its output is the plain loop's with nothing masked, which differs
    from the loop with that position masked (the test can tell them apart); alone, or batched with longer
    sentences (padded after it) as an array or as lists, greedy, beam 1 without length penalty and
    translate_texts."""
    model = tiny_model(9, 6, logit_bias=1.0)  # seed 6: a model whose output the masked pad changes
    sentence = [5, PAD, 7, 4, EOS]
    attended = by_hand_greedy(model, sentence, [False] * 5, max_len=8)
    assert attended != by_hand_greedy(model, sentence, [False, True, False, False, False], max_len=8)
    longer = [[6, 4, 5, 7, 8, 6, EOS], [4, 4, 4, 5, 6, 7, 8, 6, EOS]]
    padded = np.full((3, 9), PAD)
    for i, row in enumerate([sentence] + longer):
        padded[i, :len(row)] = row
    for decode in (greedy_decode, lambda m, s, **kw: beam_search(m, s, beam_size=1, alpha=0.0, **kw)):
        assert decode(model, np.array([sentence]), max_len=8) == [attended]
        assert decode(model, padded, max_len=8)[0] == attended
        assert decode(model, [sentence] + longer, max_len=8)[0] == attended
    texts = [" ".join(map(str, row[:-1])) for row in longer + [sentence]]  # translate_texts adds the eos
    assert translate_texts(model, IdsTokenizer(), texts, beam_size=1, max_len=8)[2] == " ".join(map(str, attended))


# --------------------------------------------------------------------------- #
# The model's positions
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("beam", [1, 2])
def test_translate_texts_stays_within_the_models_positions(beam):
    """``DecodingSettings.max_positions`` P (10 here): a source of P tokens with its eos is translated, one of
    P + 1 is refused in one line naming the sentence and the limit (nothing is decoded); every output, with
    the start token, fits: at most P - 1 tokens counting the eos, also where ``max_len`` or the default
    (source length + 50) asks for more. None: no limit."""
    from minitf.nmt.decode import DecodingSettings
    from minitf.training.errors import DataError
    model = tiny_model(9, 0)
    calls = add_to_logits(model, eos_bias(9, -1e9))  # eos never wins: every output runs to its cap
    fits, longer = "4 5 6 7 8 4 5 6 7", "4 5 6 7 8 4 5 6 7 8"  # 9 and 10 tokens, then the eos
    for max_len in (None, 30):
        settings = DecodingSettings(beam_size=beam, max_len=max_len, max_positions=10)
        out = translate_texts(model, IdsTokenizer(), ["5", fits], settings=settings)
        assert [len(text.split()) for text in out] == [9, 9]
        unlimited = translate_texts(model, IdsTokenizer(), ["5", fits], settings=DecodingSettings(beam, max_len=max_len))
        assert [len(text.split()) for text in unlimited] == ([52, 60] if max_len is None else [30, 30])
        del calls[:]
        with pytest.raises(DataError) as refused:
            translate_texts(model, IdsTokenizer(), [fits, "5", longer], settings=settings)
        assert str(refused.value).startswith("sentence 3 has 11 tokens with its </s>, longer than the model's "
                                             "context of 10") and not calls
    cut = translate_texts(model, IdsTokenizer(), [longer], settings=DecodingSettings(beam, max_positions=10),
                          cut_long=True)
    assert cut == translate_texts(model, IdsTokenizer(), [fits], settings=DecodingSettings(beam, max_positions=10))


@pytest.mark.parametrize("beam", [1, 2])
def test_the_trainers_translations_stay_within_the_runs_max_len(beam):
    """The trainer's BLEU and end-of-run decoding (``translate_shared``) of a run of --max-len 10: an output
    never passes 9 tokens counting the eos (it was source length + 50), and a validation sentence longer
    than the run's positions is cut to them (the run cannot stop at its end), translated as its first 9
    tokens are."""
    import types

    from minitf.nmt.translation_trainer import TranslationTrainer
    trainer = TranslationTrainer.__new__(TranslationTrainer)  # only what translate_shared reads
    trainer.model = tiny_model(9, 0)
    add_to_logits(trainer.model, eos_bias(9, -1e9))
    trainer.tokenizer, trainer.world = IdsTokenizer(), types.SimpleNamespace(rank=0, size=1)
    trainer.config = types.SimpleNamespace(max_len=10, alpha=0.6, beam=beam)
    fits, longer = "4 5 6 7 8 4 5 6 7", "4 5 6 7 8 4 5 6 7 8 4 5"
    out = trainer.translate_shared(["5", fits, longer], beam)
    assert [len(text.split()) for text in out] == [9, 9, 9] and out[2] == out[1]
