"""Greedy decoding and beam search (paper 6.1: beam 4, length penalty alpha 0.6, outputs up to input length
+ 50), with their settings as one value (:class:`DecodingSettings`), and translating text (BLEU is
:mod:`minitf.nmt.bleu`).

Both decoders are batched: each step runs the decoder once on all live rows (B sentences or B * K beams), one
position with the key/value cache, and finished sentences leave the batch. ``src_ids`` is a host or device
int array (B, S), ``pad_id`` after the real tokens, or a list of id lists; the source mask comes from each
sentence's length (a pad id inside a sentence is attended to, as in transformers). A hypothesis has no bos and
no final eos; its ``|Y|`` counts the eos. ``max_len`` caps its tokens counting eos (default: each sentence's
source length + ``max_len_offset``, 50); one reaching it without eos is kept. pad is never generated
(-inf after the log-softmax, so other scores are the model's log-probabilities) unless Hugging Face rules say it
may be (T5's: ``HuggingFaceRules.generates_pad``). The model runs in eval mode under no_grad; every module's
training flag is restored afterwards. The start token, eos and pad default to the model's (``model.config``:
``decoder_start_id``, ``eos_id``, ``pad_id``; a Marian or T5 model's start is its pad), else minitf's tokenizer's.

``rules=HuggingFaceRules(...)`` decodes as transformers' ``generate`` does, for a model read from a Hugging Face
(Marian) folder (:class:`HuggingFaceRules` lists the differences; each is one branch in this file, marked
"Hugging Face"); without it, the paper's rules.
Shapes: B batch, S source length, K beam size, V vocabulary, D d_model, L cached positions.
"""
import contextlib
import dataclasses

from minitf import backend
from minitf.backend import xp
from minitf.sampling import non_finite_logits_error, nonfinite_rows
from minitf.module import no_grad
from minitf.nmt.data import pad_batch
from minitf.training.errors import DataError
from minitf.training.tokenizer import BOS_ID, EOS_ID, PAD_ID
from minitf.transformer import check_ids


def length_penalty(length, alpha):
    """GNMT length penalty (Wu et al. 2016), used by the paper: ``lp(Y) = ((5 + |Y|) / 6) ** alpha`` with
    ``|Y|`` counting the eos; a hypothesis scores ``log P(Y) / lp(Y)`` (alpha 0: plain log-probability)."""
    return ((5.0 + length) / 6.0) ** alpha


@dataclasses.dataclass(frozen=True)
class HuggingFaceRules:
    """How transformers' ``generate`` (5.25: generation/utils.py ``_beam_search``, ``_update_finished_beams``,
    ``_check_early_stop_heuristic``; generation/logits_process.py) decodes, where it differs from the paper's
    rules of this file; the fields are a folder's generation_config.json's
    (:func:`minitf.nmt.marian_tokenizer.read_generation_config`):

    - a finished hypothesis scores ``log P(Y) / |Y| ** length_penalty`` (``|Y|`` counts the eos and not the
      start token), not ``log P(Y) / ((5 + |Y|) / 6) ** alpha`` (GNMT's);
    - a sentence stops once it has ``K`` finished hypotheses and ``early_stopping`` says no live beam can beat
      the worst of them: False (the default), a heuristic: the best live beam's log-probability divided by its
      current length ``** length_penalty``; "never": divided by the largest length when ``length_penalty > 0``;
      True: at once. The paper's rule is exact: the ``n_best``-th finished against the best any continuation
      may reach;
    - ``banned_ids`` (``bad_words_ids`` of single tokens; Marian's ``[[pad]]``) are -inf, and with
      ``forced_eos`` (``forced_eos_token_id``) a sentence's last step (``max_len``) can only give eos, with
      log-probability 0, before ``renormalize`` (``renormalize_logits``) makes the log-probabilities sum to one
      again (as masking them before the softmax would);
    - ``generates_pad``: pad may be chosen like any token (T5's: its pad is its decoder start, id 0, and
      ``generate`` bans nothing); False (Marian's, and the paper's rules): pad is never generated;
    - running beams are ranked by their log-probability, as in the paper's rules (no difference there).
    Greedy decoding (``beam_size`` 1) is the argmax under the same banned ids and forced eos.
    """
    length_penalty: float = 1.0
    early_stopping: object = False  # False, True or "never"
    renormalize: bool = False
    forced_eos: bool = False
    banned_ids: tuple = ()
    generates_pad: bool = False

    def __post_init__(self):
        if self.early_stopping not in (False, True, "never"):
            raise ValueError(f"early_stopping must be False, True or 'never', got {self.early_stopping!r}")


@dataclasses.dataclass(frozen=True)
class DecodingSettings:
    """How a model translates, as one value: built once from a run (the paper's rules, section 6.1: beam 4,
    alpha 0.6, at most input length + 50 tokens) or from a Marian folder's generation_config.json (its beam size,
    length limit, length penalty and :class:`HuggingFaceRules`), then passed whole to :func:`translate_texts`
    by ``translate``, the trainer's end of run and ``inspect``. ``beam_size`` 1 is greedy; ``max_len`` None is
    each sentence's source length + 50; ``min_len`` 1 (minitf's runs): a weak model may rank the empty output
    first, never a translation of a sentence. ``max_positions``: the model's context (``minitf.load``'s
    ``Loaded.context``: a Marian folder's max_position_embeddings, a run's --max-len): a source with its eos
    must fit (:func:`translate_texts` refuses a longer one), and an output with its start token always fits
    (at most ``max_positions - 1`` tokens counting the eos, whatever ``max_len`` says); None: no limit."""
    beam_size: int = 4
    alpha: float = 0.6
    max_len: int | None = None
    min_len: int = 1
    rules: HuggingFaceRules | None = None
    max_positions: int | None = None

    def with_flags(self, beam=None, alpha=None, max_len=None):
        """These settings with the user's flags (None: not given) in place of the model's."""
        changed = {}
        if beam is not None:
            changed["beam_size"] = beam
        if alpha is not None:
            changed["alpha"] = alpha
            if self.rules is not None:  # Hugging Face's length_penalty
                changed["rules"] = dataclasses.replace(self.rules, length_penalty=alpha)
        if max_len is not None:
            changed["max_len"] = max_len
        return dataclasses.replace(self, **changed)


def _finished_penalty(length, alpha, rules):
    """The divisor of a hypothesis of ``length`` tokens (counting eos) finished with log-probability s: it
    scores s / this. The paper's GNMT ``lp``; Hugging Face: ``length ** length_penalty``."""
    if rules is None:
        return length_penalty(length, alpha)
    return float(length) ** rules.length_penalty  # Hugging Face: _update_finished_beams


def _stop_divisor(t, max_lens, alpha, rules):
    """(n,) host: a sentence whose best live beam (log-probability s <= 0) is at step ``t`` stops when its
    last kept finished hypothesis scores at least s / this. The paper's: exact, the largest lp any
    continuation can reach (``t + 2`` tokens up to ``max_len``); Hugging Face's: its heuristic
    (_check_early_stop_heuristic), the current length ``t + 1`` (or ``max_len`` for "never")."""
    if rules is None:
        return backend.host.maximum(length_penalty(max_lens.astype(float), alpha), length_penalty(t + 2.0, alpha))
    if rules.early_stopping == "never" and rules.length_penalty > 0:
        return max_lens.astype(float) ** rules.length_penalty
    return backend.host.full(len(max_lens), float(t + 1) ** rules.length_penalty)


def _special_ids(model, bos_id, eos_id, pad_id):
    """The start, eos and pad ids: those given, else the model's (``model.config``), else minitf's tokenizer's."""
    config = getattr(model, "config", None)
    pick = (lambda given, key, default: given if given is not None else
            getattr(config, key, None) if getattr(config, key, None) is not None else default)
    return pick(bos_id, "decoder_start_id", BOS_ID), pick(eos_id, "eos_id", EOS_ID), pick(pad_id, "pad_id", PAD_ID)


def reorder_cache(cache, index, names=None):
    """Keep rows ``index`` (M,) (repeats allowed) of every array of a decoder cache, in place, and return it:
    ``{layer: {"self": {"k_room": (N, capacity, D), "v_room": ..., "length": L}, "cross": {"k": (N, S, D),
    "v": ...}}}`` as ``model.decode(..., cache=cache)`` fills it (minitf.attention.append_to_cache);
    ``names`` (e.g. ``("self",)``) limits it to those sub-caches."""
    for key, value in cache.items():
        if isinstance(value, dict):
            if isinstance(key, str) and names is not None and key not in names:
                continue  # a sub-cache that was not asked for
            # layer indices pass the filter down; below "self"/"cross" take everything
            reorder_cache(value, index, None if isinstance(key, str) else names)
        elif key != "length":                                    # the filled length is the same for every row
            cache[key] = value[index]
    return cache


@contextlib.contextmanager
def inference_mode(model):
    """Eval mode and no_grad for the block; every module's own training flag is restored afterwards."""
    previous = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with no_grad():
            yield
    finally:
        for module, training in previous:
            module.training = training


def _prepare(model, src_ids, max_len, max_len_offset, pad_id):
    """The checked source on the device (B, S), its key padding mask (B, S) and each output's most tokens
    counting eos (host, (B,)). The mask comes from each sentence's length, as transformers' attention_mask
    does, not from its ids: a list's own length; an array row's up to its last token that is not pad (the
    pads after it are the padding). A pad id inside a sentence (a "<pad>" written in its text) is read."""
    lengths = None
    if isinstance(src_ids, (list, tuple)):  # ragged token lists: pad them here
        rows = [list(map(int, row)) for row in src_ids]
        lengths = backend.host.array([len(row) for row in rows], dtype=backend.host.int64)
        padded = backend.host.full((len(rows), max([len(row) for row in rows] + [1])), pad_id,
                                   dtype=backend.host.int64)
        for i, row in enumerate(rows):
            padded[i, :len(row)] = row
        src_ids = padded
    src = check_ids(src_ids, "src_ids", model.config.src_vocab_size)
    B, S = src.shape
    if lengths is not None:
        src_mask = backend.asarray(backend.host.arange(S)[None, :] >= lengths[:, None])
    else:  # a position is padding when no token but pad is at or after it
        src_mask = xp.cumsum((src != pad_id)[:, ::-1], axis=1)[:, ::-1] == 0
        if max_len is None:  # one small copy to the host: the caps drive the host-side loop
            lengths = backend.to_numpy(S - src_mask.sum(axis=1)).astype(backend.host.int64)
    if max_len is None:
        max_lens = lengths + int(max_len_offset)
    else:
        max_lens = backend.host.broadcast_to(backend.host.asarray(max_len, dtype=backend.host.int64), (B,)).copy()
    if (max_lens < 1).any():
        raise ValueError(f"max_len must be at least 1 for every sentence, got {max_lens.tolist()}")
    return src, src_mask, max_lens


def _step_logits(model, tokens, prefix, memory, src_mask, cache, t):
    """Logits (N, V) of the next token, a fresh array no one else holds (safe to write): with ``cache`` only
    ``tokens`` (N, 1) at position ``t`` run, without it the whole ``prefix`` (N, t + 1). Also (N,) device
    bool: the rows holding NaN or infinity, which the caller checks in the host copy it makes each step."""
    if cache is not None:
        logits = model.decode(tokens, memory, src_mask, cache=cache, start=t)[:, -1]
    else:
        logits = model.decode(prefix, memory, src_mask)[:, -1]
    return logits, nonfinite_rows(logits)  # NaN or infinity: one line, not a translation of id 0s (no sync here)


def _banned_ids(t, pad_id, eos_id, min_len, rules):
    """The ids that may not come next: pad (never generated, unless Hugging Face ``rules`` say it may be), eos
    before ``min_len`` tokens (a weak model likes the empty output), and ``rules``' banned ids
    (NoBadWordsLogitsProcessor)."""
    pad = [] if rules is not None and rules.generates_pad else [pad_id]
    return pad + ([eos_id] if t < min_len else []) + list(rules.banned_ids if rules is not None else ())


def _ban(logits, banned, eos_id, forced):
    """-inf, in place, on the ``banned`` ids; and in the rows ``forced`` ((N,) device bool, or None) on
    everything but eos, which gets 0 (Hugging Face's forced eos). Returns the logits."""
    logits[:, banned] = -xp.inf
    if forced is not None:                                       # Hugging Face: ForcedEOSTokenLogitsProcessor
        eos_only = xp.full(logits.shape[-1], -xp.inf, dtype=logits.dtype)
        eos_only[eos_id] = 0
        logits = xp.where(forced[:, None], eos_only, logits)     # (N, V)
    return logits


def row_sums(x):
    """(N,) the sums of the rows of ``x`` (N, V) as one matrix-vector product (BLAS reads a long row several
    times faster than NumPy's pairwise sum). NaN or infinity in a row makes its sum NaN or infinite."""
    return x @ xp.ones(x.shape[-1], dtype=x.dtype)


def _exp_shifted_in_place(logits, row_max):
    """``logits = exp(logits - row_max)`` in place, for a block of rows (for backend.by_rows: returns nothing)."""
    logits -= row_max
    xp.exp(logits, out=logits)


def shifted_exp_sums(logits, row_max):
    """(N,) each row's sum of exp(logits - row_max), the normalizer of a log-softmax shifted by ``row_max``
    (N, 1); overwrites ``logits`` (N, V) with exp(logits - row_max) (the caller needs the logits no more). The
    shift and the exp, a pass over the vocabulary each, run on blocks of rows (threads: the same numbers as
    the plain lines); the sums are one matrix-vector product (:func:`row_sums`, on BLAS's threads)."""
    # logits -= row_max; xp.exp(logits, out=logits): on blocks of rows (threads)
    backend.by_rows(_exp_shifted_in_place, logits, row_max)
    return row_sums(logits)


def top_k_columns(scores, k):
    """(N, k) column indices of the ``k`` largest entries of each row of ``scores`` (N, V), in no order: the
    set ``argpartition`` would give (up to ties), for about one pass over (N, V) instead of a partition of it.
    The first R * C columns are viewed as R slices of C columns; entry j of every slice forms group j (R
    entries), and the k groups with the largest maxima hold the k largest entries (a group with one of them
    has a max at least as large, and at most k groups do), so only their k * R entries and the V - R * C
    columns after the last slice are partitioned."""
    N, V = scores.shape
    R = max(1, int((V / k) ** 0.5))                              # slices: balances C groups against k * R entries
    C = V // R                                                   # columns per slice
    if C <= k:                                                   # too few groups to gain anything
        return xp.argpartition(scores, V - k, axis=1)[:, V - k:]
    group_max = scores[:, :R * C].reshape(N, R, C).max(axis=1)    # (N, C) one elementwise max of R slices
    groups = xp.argpartition(group_max, C - k, axis=1)[:, C - k:]  # (N, k) the k best groups
    columns = (groups[:, :, None] + C * xp.arange(R)).reshape(N, k * R)  # (N, k * R) their entries' columns
    columns = xp.concatenate([columns, xp.broadcast_to(xp.arange(R * C, V), (N, V - R * C))], axis=1)
    best = xp.argpartition(xp.take_along_axis(scores, columns, axis=1), columns.shape[1] - k, axis=1)
    return xp.take_along_axis(columns, best[:, columns.shape[1] - k:], axis=1)  # (N, k)


def _step_top_logprobs(model, tokens, prefix, memory, src_mask, cache, t, k, pad_id, eos_id, min_len=0, rules=None,
                       forced=None):
    """The ``k`` most probable next tokens of each row, (N, k) ids, their (N, k) log-probabilities (in no
    order), and the (N,) non-finite rows (:func:`_step_logits`). The same numbers as the top k of the full
    (N, V) log-softmax with the banned ids at -inf (:func:`_ban`), without building it: a log-softmax
    subtracts one number from a whole row, so a row's top k are its logits' top k, and only those k are
    shifted. The normalizer counts every id (the paper's rules: pad banned after the softmax), or with Hugging
    Face's ``renormalize`` only those left after the bans (LogitNormalization); a forced row's eos gets 0."""
    logits, nonfinite = _step_logits(model, tokens, prefix, memory, src_mask, cache, t)
    banned = _banned_ids(t, pad_id, eos_id, min_len, rules)
    renormalize = rules is not None and rules.renormalize
    banned_logits = logits[:, banned]                            # (N, b) unbanned: the paper's normalizer counts them
    logits = _ban(logits, banned, eos_id, forced)
    ids = top_k_columns(logits, k)                               # (N, k)
    top = xp.take_along_axis(logits, ids, axis=1)                # (N, k) their logits
    # log_softmax(x) = (x - max) - log(sum(exp(x - max))), shifted by the max for stability
    row_max = top.max(axis=1, keepdims=True)                     # (N, 1) the row's largest logit is in its top k
    counted = not renormalize and len(banned) > 0                # banned ids whose exp the normalizer counts
    if counted:
        row_max = xp.maximum(row_max, banned_logits.max(axis=1, keepdims=True))
    sum_exp = shifted_exp_sums(logits, row_max)                  # (N,) the banned ids' exp(-inf) add 0
    if counted:
        sum_exp += row_sums(xp.exp(banned_logits - row_max))     # the paper's rules: they count
    log_sum = xp.log(sum_exp)[:, None]                           # (N, 1)
    if forced is not None:                                       # a forced row: eos at log-probability 0
        row_max, log_sum = xp.where(forced[:, None], 0, row_max), xp.where(forced[:, None], 0, log_sum)
    return ids, (top - row_max) - log_sum, nonfinite


def _forced(rules, last, repeat=1):
    """The rows whose eos is forced (Hugging Face's forced_eos at each sentence's last step): ``last`` (n,)
    host bool, each sentence's rows ``repeat`` times, as a device bool array; None when none is."""
    if rules is None or not rules.forced_eos or not last.any():
        return None
    return backend.asarray(backend.host.repeat(last, repeat))


def greedy_decode(model, src_ids, max_len=None, max_len_offset=50, bos_id=None, eos_id=None, pad_id=None,
                  use_cache=True, min_len=0, rules=None):
    """The B outputs (id lists without bos and eos), taking the most probable token each step. ``max_len``: an
    int or (B,) array; ``use_cache=False`` re-runs the decoder on the whole prefix (reference and benchmark);
    ``min_len``: fewest tokens before eos (translating uses 1: no empty translations); ``rules``:
    :class:`HuggingFaceRules` (``generate(num_beams=1)``), or None."""
    bos_id, eos_id, pad_id = _special_ids(model, bos_id, eos_id, pad_id)
    with inference_mode(model):
        src, src_mask, max_lens = _prepare(model, src_ids, max_len, max_len_offset, pad_id)
        B, steps = src.shape[0], int(max_lens.max())
        memory, src_mask = model.encode(src, src_mask)           # (B, S, D), (B, S)
        cache = {} if use_cache else None
        out = backend.host.full((B, steps), eos_id, dtype=backend.host.int64)
        lengths = backend.host.zeros(B, dtype=backend.host.int64)
        active = backend.host.arange(B)                          # sentence of each live row
        tokens = xp.full((B, 1), bos_id, dtype=src.dtype)        # (n, 1) input at position t
        prefix = tokens                                          # (n, t + 1) for use_cache=False
        for t in range(steps):
            forced = _forced(rules, t + 1 >= max_lens[active])   # Hugging Face: eos at the last step
            logits, nonfinite = _step_logits(model, tokens, prefix, memory, src_mask, cache, t)
            # a log-softmax subtracts one number from a whole row: the argmax of the logits is the same
            scores = _ban(logits, _banned_ids(t, pad_id, eos_id, min_len, rules), eos_id, forced)
            next_tokens = xp.where(nonfinite, -1, scores.argmax(axis=-1))  # (n,) -1: no token can be chosen
            chosen = backend.to_numpy(next_tokens)               # host copy: who is done
            if (chosen < 0).any():
                raise non_finite_logits_error(t, "translation")
            out[active, t] = chosen
            ended = chosen == eos_id
            finished = ended | (t + 1 >= max_lens[active])
            lengths[active[finished]] = t + 1 - ended[finished]  # the eos is not output
            if finished.all():
                break
            tokens = next_tokens[:, None].astype(src.dtype)
            if finished.any():
                # drop finished sentences from every row-indexed array
                keep = backend.asarray(backend.host.flatnonzero(~finished))
                active = active[~finished]
                memory, src_mask, tokens, prefix = memory[keep], src_mask[keep], tokens[keep], prefix[keep]
                if cache is not None:
                    reorder_cache(cache, keep)
            if cache is None:
                prefix = xp.concatenate([prefix, tokens], axis=1)
        return [out[b, :lengths[b]].tolist() for b in range(B)]


def beam_search_nbest(model, src_ids, beam_size=4, n_best=None, alpha=0.6, max_len_offset=50, max_len=None,
                      bos_id=None, eos_id=None, pad_id=None, use_cache=True, min_len=0, rules=None):
    """Beam search with the GNMT length penalty: per sentence its ``n_best`` (1 to K; None: K) best ``(tokens,
    score)``, best first, ``score = log P(Y | X) / lp(|Y|)``; fewer only when fewer exist within ``max_len``.
    Each step extends the K live beams by every token and takes the top 2K: those in the top K ending in eos
    finish (all of the top K at the last step), the best K others live on; at step 0 only beam 0 is live. A
    sentence stops when its ``n_best``-th finished beats every continuation: a live beam of log-probability
    ``s <= 0`` can score at most ``s / max(lp(t + 2), lp(max_len))``, so the stop never loses a better one.
    With Hugging Face ``rules`` (:class:`HuggingFaceRules`), its score and stop instead (``alpha`` unused), and
    ``K`` finished hypotheses are kept whatever ``n_best``, as its stop counts them."""
    K = int(beam_size)
    nb = K if n_best is None else int(n_best)
    if K < 1 or not 1 <= nb <= K:
        raise ValueError(f"need beam_size >= 1 and 1 <= n_best <= beam_size, got {beam_size} and {n_best}")
    nf = nb if rules is None else K                              # finished hypotheses kept per sentence
    bos_id, eos_id, pad_id = _special_ids(model, bos_id, eos_id, pad_id)
    with inference_mode(model):
        src, src_mask, max_lens = _prepare(model, src_ids, max_len, max_len_offset, pad_id)
        B, steps = src.shape[0], int(max_lens.max())
        memory, src_mask = model.encode(src, src_mask)           # (B, S, D), (B, S): the K beams of a
        dtype = memory.dtype                                     # sentence attend to its one memory
        cache = {} if use_cache else None
        width = steps + 1                                        # bos + up to max_len tokens
        # live state of the n active sentences (device)
        seqs = xp.full((B, K, width), pad_id, dtype=src.dtype)   # bos, tokens so far, then pad
        seqs[:, :, 0] = bos_id
        live = xp.full((B, K), -xp.inf, dtype=dtype)             # log P of each live beam
        live[:, 0] = 0                                           # only beam 0 at step 0: no K copies
        tokens = seqs[:, :, :1].reshape(B * K, 1)
        # finished hypotheses of all B sentences, best first (device)
        fin_score = xp.full((B, nf), -xp.inf, dtype=dtype)
        fin_len = xp.zeros((B, nf), dtype=xp.int64)
        fin_seqs = xp.full((B, nf, width), pad_id, dtype=src.dtype)
        active = backend.host.arange(B)
        rank = xp.arange(2 * K)[None, :]                         # (1, 2K)
        V = model.config.tgt_vocab_size
        for t in range(steps):
            n = len(active)
            prefix = None if cache is not None else seqs[:, :, :t + 1].reshape(n * K, t + 1)
            last_host = t + 1 >= max_lens[active]                # (n,) this is the sentence's final step
            # each row's top k are enough: a sentence's top 2K of its K * V candidates (beam score + token
            # log-probability) are among its beams' top 2K each (at most 2K candidates beat any of them)
            k = min(2 * K, V)
            ids, logp, nonfinite = _step_top_logprobs(model, tokens, prefix, memory, src_mask, cache, t, k, pad_id,
                                                      eos_id, min_len, rules, _forced(rules, last_host, K))
            cand = (live[:, :, None] + logp.reshape(n, K, k)).reshape(n, K * k)  # (n, K * k)
            # top 2K per sentence, best first: at most K end in eos, so >= K remain to go on
            top = xp.argsort(-cand, axis=1)[:, :2 * K]
            top_score = xp.take_along_axis(cand, top, axis=1)
            beam, token = top // k, xp.take_along_axis(ids.reshape(n, K * k), top, axis=1)  # (n, 2K) each
            # candidate sequences: the parent's tokens plus the new one
            sent = xp.arange(n)[:, None]                         # (n, 1) row of each sentence
            cand_seqs = seqs[sent, beam]                         # (n, 2K, width)
            cand_seqs[:, :, t + 1] = token
            is_eos = token == eos_id
            last = backend.asarray(last_host)                    # (n,)
            # finish: eos among the top K, or anything of the top K at the final step
            finish = (rank < K) & (is_eos | last[:, None]) & (top_score > -xp.inf)
            score = xp.where(finish, top_score / _finished_penalty(t + 1, alpha, rules), -xp.inf)
            # merge into the n-best so far: keep the nf best normalised scores
            act = backend.asarray(active)
            all_score = xp.concatenate([fin_score[act], score], axis=1)
            keep = xp.argsort(-all_score, axis=1)[:, :nf]
            all_len = xp.concatenate([fin_len[act], xp.full((n, 2 * K), t + 1, dtype=fin_len.dtype)], axis=1)
            all_seqs = xp.concatenate([fin_seqs[act], cand_seqs], axis=1)
            fin_score[act] = xp.take_along_axis(all_score, keep, axis=1)
            fin_len[act] = xp.take_along_axis(all_len, keep, axis=1)
            fin_seqs[act] = all_seqs[sent, keep]
            # next live beams: the K best candidates not ending in eos (ranks sorted, eos last)
            pick = xp.argsort(rank + 2 * K * is_eos, axis=1)[:, :K]
            live = xp.take_along_axis(top_score, pick, axis=1)
            parent = xp.take_along_axis(beam, pick, axis=1)
            seqs = cand_seqs[sent, pick]
            # stop: the nf-th finished beats every possible continuation (the paper: exactly; Hugging Face: by
            # its heuristic, or at once with early_stopping True)
            kept = fin_score[act][:, nf - 1]                     # (n,) the last kept finished score
            if rules is not None and rules.early_stopping is True:
                stop = kept > -xp.inf
            else:
                divisor = _stop_divisor(t, max_lens[active], alpha, rules)
                stop = kept >= live.max(axis=1) / backend.asarray(divisor, dtype=dtype)
            done, nonfinite = backend.to_numpy(xp.stack([last | stop, nonfinite.reshape(n, K).any(axis=1)]))
            if nonfinite.any():                                  # one host copy per step carries both
                raise non_finite_logits_error(t, "translation")
            if done.all():
                break
            go_on = ~done
            rows = sent * K + parent                             # (n, K) parent row of each new beam
            if not go_on.all():
                # some sentences are done: drop their rows everywhere
                keep_sent = backend.asarray(backend.host.flatnonzero(go_on))
                rows = rows[keep_sent]
                memory, src_mask = memory[keep_sent], src_mask[keep_sent]
                if cache is not None:
                    reorder_cache(cache, keep_sent, names=("cross",))  # one memory per sentence
                live, seqs = live[keep_sent], seqs[keep_sent]
                active = active[go_on]
            if cache is not None:
                reorder_cache(cache, rows.reshape(-1), names=("self",))  # each new beam: its parent's cache
            tokens = seqs[:, :, t + 1].reshape(-1, 1)
        scores, lens, hyps = (backend.to_numpy(a) for a in (fin_score, fin_len, fin_seqs))
    results = []
    for b in range(B):  # host-side: turn the arrays into Python lists
        entries = []
        for j in range(nb):                                     # the n_best of the nf kept
            if scores[b, j] == -backend.host.inf:
                break
            toks = hyps[b, j, 1:1 + lens[b, j]].tolist()
            if toks and toks[-1] == eos_id:
                toks = toks[:-1]
            entries.append((toks, float(scores[b, j])))
        results.append(entries)
    return results


def beam_search(model, src_ids, beam_size=4, alpha=0.6, max_len_offset=50, max_len=None, bos_id=None, eos_id=None,
                pad_id=None, use_cache=True, return_scores=False, min_len=0, rules=None):
    """The best hypothesis of :func:`beam_search_nbest` per sentence (B lists of ids); with
    ``return_scores``, also their B scores."""
    nbest = beam_search_nbest(model, src_ids, beam_size=beam_size, n_best=1, alpha=alpha,
                              max_len_offset=max_len_offset, max_len=max_len, bos_id=bos_id, eos_id=eos_id,
                              pad_id=pad_id, use_cache=use_cache, min_len=min_len, rules=rules)
    hyps = [entries[0][0] if entries else [] for entries in nbest]
    if return_scores:
        return hyps, [entries[0][1] if entries else float("-inf") for entries in nbest]
    return hyps


def too_long(where, tokens, positions, why):
    """The one-line DataError of a source of ``tokens`` tokens (with its eos) longer than the model's
    ``positions`` (``why``: where the limit comes from)."""
    return DataError(f"{where} has {tokens} tokens with its </s>, longer than the model's context of {positions}"
                     f"{f' ({why})' if why else ''}; shorten it or split it into sentences")


class DecodingOutOfMemory(MemoryError):
    """Decoding a batch ran out of memory. Its arrays grow with sentences x beams x output tokens; ``driver``
    names the one of those whose value drove them, far above its usual size ("max_len": the output cap against
    the default of source length + 50; "beam": against 4; "batch_size": sentences against 64), or None when
    none stands out; the message says the numbers."""

    def __init__(self, error, sentences, beam, steps, source):
        ratios = {"max_len": steps / (source + 50), "beam": beam / 4, "batch_size": sentences / 64}
        driver = max(ratios, key=ratios.get)
        self.driver = driver if ratios[driver] > 2 else None
        self.sentences, self.beam, self.steps = sentences, beam, steps
        super().__init__(f"{error or 'MemoryError'}; decoding {sentences} sentence{'s' if sentences > 1 else ''} "
                         f"of up to {source} tokens with beam {beam} and outputs of up to {steps} tokens")


def translate_texts(model, tokenizer, texts, beam_size=4, alpha=0.6, batch_size=64, max_len=None, min_len=1,
                    rules=None, settings=None, where=None, cut_long=False, why=""):
    """Translate a list of sentences; batches of similar length, output in input order. The source ends in
    the tokenizer's eos; the decoder starts from the model's start token, else the tokenizer's bos.
    ``settings`` (a :class:`DecodingSettings`, as the commands pass them) replaces the five keywords before it
    (``beam_size``, ``alpha``, ``max_len``, ``min_len``, ``rules``: the same fields one by one). With
    ``settings.max_positions``, a source longer than them (with its eos) is refused before anything is
    decoded: a DataError naming it (``where(i)``, default "sentence i + 1"; ``why``: where the limit comes
    from), or with ``cut_long`` cut to fit (the trainer's validation, which cannot stop at the end of a run);
    and no output passes ``max_positions - 1`` tokens counting the eos (the start token takes one)."""
    if settings is None:
        settings = DecodingSettings(beam_size, alpha, max_len, min_len, rules)
    beam_size, alpha, max_len, min_len, rules = (settings.beam_size, settings.alpha, settings.max_len,
                                                 settings.min_len, settings.rules)
    positions = settings.max_positions
    ids = tokenizer.encode(list(texts))
    if positions is not None:
        for i, row in enumerate(ids):
            if len(row) + 1 > positions and not cut_long:
                raise too_long(where(i) if where else f"sentence {i + 1}", len(row) + 1, positions, why)
        ids = [row[:positions - 1] for row in ids]               # room for the eos
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))   # little padding per batch
    outputs = [None] * len(ids)
    config = model.config
    own = lambda key, fallback: getattr(config, key) if getattr(config, key) is not None else fallback  # noqa: E731
    special = dict(bos_id=own("decoder_start_id", tokenizer.bos_id), eos_id=own("eos_id", tokenizer.eos_id),
                   pad_id=tokenizer.pad_id)
    with inference_mode(model):
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            src = pad_batch([ids[i] for i in chunk], tokenizer.pad_id, eos_id=tokenizer.eos_id)
            # each output's most tokens counting eos: the settings' (default source length + 50), within positions
            caps = backend.host.array([len(ids[i]) + 1 + 50 if max_len is None else max_len for i in chunk])
            if positions is not None:
                caps = backend.host.minimum(caps, positions - 1)
            try:
                if beam_size == 1:
                    tokens = greedy_decode(model, src, max_len=caps, min_len=min_len, rules=rules, **special)
                else:
                    tokens = beam_search(model, src, beam_size=beam_size, alpha=alpha, max_len=caps,
                                         min_len=min_len, rules=rules, **special)
            except MemoryError as error:  # which setting drove it, for the one line (DecodingOutOfMemory.driver)
                raise DecodingOutOfMemory(error, len(chunk), beam_size, int(caps.max()), src.shape[1]) from None
            for i, t in zip(chunk, tokens):
                outputs[i] = t
    return tokenizer.decode(outputs)
