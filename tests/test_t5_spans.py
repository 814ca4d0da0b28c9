"""T5's span corruption (minitf.t5.spans): 15% of a sequence's tokens in spans of mean length 3, the count and the
spans as T5's random_spans_noise_mask makes them, drawn from (seed, step, item) only; the inputs and targets put back
together give the sequence again."""
from hypothesis import given, strategies as st

from minitf.backend import host as np
from minitf.t5.spans import corrupt, noise_mask, span_corruption

SENTINELS = 100


def sentinel(n):
    """T5's <extra_id_n> in a vocabulary of 1,000 ids."""
    assert 0 <= n < SENTINELS
    return 999 - n


def restore(inputs, targets):
    """The sequence again: each sentinel of the inputs replaced by what follows it in the targets."""
    spans, current = {}, None
    for token in targets:
        if token >= 1000 - SENTINELS:
            current = spans.setdefault(token, [])
        else:
            current.append(token)
    return [t for token in inputs for t in (spans[token] if token >= 1000 - SENTINELS else [token])]


@given(st.integers(2, 300), st.integers(0, 2 ** 40), st.integers(0, 10 ** 6), st.integers(0, 10 ** 4))
def test_the_noise_is_15_percent_in_spans_of_mean_length_3(length, seed, step, item):
    mask = noise_mask(length, seed, step, item)
    noise = min(max(round(length * 0.15), 1), length - 1)
    spans = max(min(round(noise / 3), noise, length - noise), 1)
    starts = mask & ~np.concatenate([[False], mask[:-1]])
    assert mask.shape == (length,) and mask.sum() == noise and starts.sum() == spans
    assert not mask[0] and mask[-1]  # T5's: a run of other tokens first, a noise span last
    assert np.array_equal(mask, noise_mask(length, seed, step, item))  # a function of (seed, step, item) only


def test_the_draw_changes_with_the_seed_the_step_and_the_item():
    base = noise_mask(200, 1, 5, 7)
    for other in (noise_mask(200, 2, 5, 7), noise_mask(200, 1, 6, 7), noise_mask(200, 1, 5, 8)):
        assert not np.array_equal(base, other)


@given(st.lists(st.integers(3, 899), min_size=1, max_size=120), st.integers(0, 100))
def test_inputs_and_targets_put_together_give_the_sequence(ids, step):
    (inputs,), (targets,) = span_corruption([ids], [4], seed=0, step=step, sentinel=sentinel)
    assert restore(inputs, targets) == ids
    mask = noise_mask(len(ids), 0, step, 4)
    spans = int((mask & ~np.concatenate([[False], mask[:-1]])).sum())
    assert [t for t in inputs if t >= 900] == [sentinel(n) for n in range(spans)]  # one sentinel a span, in order
    assert len(inputs) == len(ids) - mask.sum() + spans and len(targets) == mask.sum() + spans
    assert targets[:1] == ([sentinel(0)] if mask.any() else [])


def test_a_hand_example():
    """"Thank you for inviting me to your party last week": 'for inviting' and 'last' are noise."""
    ids = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    mask = np.array([0, 0, 1, 1, 0, 0, 0, 0, 1, 0], dtype=bool)
    assert corrupt(ids, mask, sentinel) == ([10, 11, 999, 14, 15, 16, 17, 998, 19], [999, 12, 13, 998, 18])
