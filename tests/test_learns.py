"""It learns: a small model learns to reverse random sequences to near-zero
loss on the CPU through the real forward, backward, Adam and warmup schedule.
(How fast is for benchmarks/benchmark.py, not for a test.)"""
import minitf
from minitf import backend

np = backend.host
PAD, BOS, EOS, FIRST_SYMBOL, VOCAB = 0, 2, 3, 4, 14


def reversal_batch(rng, batch_size, length):
    symbols = rng.integers(FIRST_SYMBOL, VOCAB, (batch_size, length))
    target = symbols[:, ::-1]
    tgt_in = np.concatenate([np.full((batch_size, 1), BOS), target], axis=1)
    tgt_out = np.concatenate([target, np.full((batch_size, 1), EOS)], axis=1)
    return symbols, tgt_in, tgt_out


def test_small_model_learns_to_reverse_sequences():
    backend.manual_seed(0)
    model = minitf.Transformer(VOCAB, VOCAB, d_model=32, num_heads=4, num_encoder_layers=2,
                               num_decoder_layers=2, d_ff=64, dropout=0.0, pad_id=PAD)
    loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing=0.0, ignore_index=PAD)
    optimizer = minitf.Adam(model.parameters(), lr=minitf.WarmupSchedule(32, warmup=100, scale=2.0))
    rng = np.random.default_rng(0)
    losses = []
    for step in range(800):
        src, tgt_in, tgt_out = reversal_batch(rng, 32, 6)
        optimizer.zero_grad()
        losses.append(loss_fn(model(src, tgt_in), tgt_out))
        model.backward(loss_fn.backward())
        optimizer.step()
    assert losses[0] > 2.0, losses[0]                 # starts near log(14) = 2.6
    assert np.mean(losses[-20:]) < 0.05, losses[-20:]
    # and it really reverses unseen sequences (teacher-forced argmax)
    model.eval()
    src, tgt_in, tgt_out = reversal_batch(np.random.default_rng(123), 64, 6)
    with minitf.no_grad():
        prediction = backend.to_numpy(model(src, tgt_in)).argmax(-1)
    assert (prediction == tgt_out).mean() > 0.97
