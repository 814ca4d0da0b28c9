"""CPU (NumPy) against GPU (CuPy): one training step of the same seeded model.

    python scripts/compare_devices.py          (needs CuPy and a CUDA device; exit 1 on a mismatch)

Parameters are drawn on the host, so a seed gives the same model on both devices.
Dropout is off (0.0): NumPy's and CuPy's random streams differ, so masks would too.
For float64 and float32, the script compares the loss, the gradient of a few named
parameters and of the whole flat buffer, and the parameters after one Adam step (the
fused CuPy kernel on the GPU, the NumPy lines on the CPU); then greedy and beam
decoding of a few sentences (float64: the same tokens expected).

Tolerances: float64 1e-9 relative (only summation order differs); float32 1e-4 for
the loss and 2e-3 for gradients, relative to the largest entry (cuBLAS and OpenBLAS
sum in different orders). Adam normalises each entry by its own gradient, so an entry
whose gradient is near zero may move differently by up to about 2 lr: parameters are
compared with an absolute tolerance of 3 lr.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import minitf  # noqa: E402
from minitf import backend  # noqa: E402
from minitf.nmt.decode import beam_search, greedy_decode  # noqa: E402

np = backend.host
PAD, BOS, EOS = 0, 2, 3
LR = 1e-3
NAMES = ["src_embed.weight", "encoder.layers.0.self_attn.w_qkv", "encoder.layers.1.feed_forward.linear1.weight",
         "decoder.layers.0.cross_attn.w_qkv", "decoder.layers.1.ff_block.norm.gamma"]


def batch(V=60, B=6, S=9, T=8):
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(4, V, (B, S)), rng.integers(4, V, (B, T + 1))
    src[0, 6:] = PAD
    src[3, 4:] = PAD
    tgt[:, 0] = BOS
    tgt[1, 5] = EOS
    tgt[1, 6:] = PAD
    return src, tgt[:, :-1], tgt[:, 1:]


def one_step(device, dtype):
    """Loss, named gradients, flat gradient, parameters after Adam, decodes; all on the host."""
    backend.set_device(device)                         # also re-seeds
    with backend.default_dtype(dtype):
        model = minitf.Transformer(60, 60, d_model=32, num_heads=4, num_encoder_layers=2,
                                   num_decoder_layers=2, d_ff=64, dropout=0.0)
        loss_fn = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=PAD)
        optimizer = minitf.Adam(model.parameters(), lr=LR)
        src, tgt_in, tgt_out = batch()
        optimizer.zero_grad()
        loss = loss_fn(model(src, tgt_in), tgt_out)
        model.backward(loss_fn.backward())
        params = dict(model.named_parameters())
        grads = {name: backend.to_numpy(params[name].grad).copy() for name in NAMES}
        flat_grad = backend.to_numpy(optimizer.flat.grad).copy()
        optimizer.step()
        flat_data = backend.to_numpy(optimizer.flat.data).copy()
        greedy = greedy_decode(model, src, max_len=10)
        beam = beam_search(model, src, beam_size=4, max_len=10)
    backend.set_device("cpu")
    return dict(loss=loss, grads=grads, flat_grad=flat_grad, flat_data=flat_data, greedy=greedy, beam=beam)


def relative(a, b):
    scale = max(float(np.abs(a).max(initial=0)), float(np.abs(b).max(initial=0)), 1e-30)
    return float(np.abs(a - b).max(initial=0)) / scale


def main():
    if not backend.gpu_available():
        print("no GPU: CuPy is missing or sees no CUDA device; nothing to compare")
        return 1
    failures = []
    print("| dtype | quantity | max relative difference (CPU vs GPU) | tolerance | ok |")
    print("|---|---|---:|---:|---|")
    for dtype, tol_loss, tol_grad in (("float64", 1e-9, 1e-9), ("float32", 1e-4, 2e-3)):
        cpu, gpu = one_step("cpu", dtype), one_step("gpu", dtype)
        rows = [("loss", abs(cpu["loss"] - gpu["loss"]) / max(abs(cpu["loss"]), 1e-30), tol_loss)]
        rows += [(f"grad {name}", relative(cpu["grads"][name], gpu["grads"][name]), tol_grad) for name in NAMES]
        rows.append(("grad, whole flat buffer", relative(cpu["flat_grad"], gpu["flat_grad"]), tol_grad))
        params_diff = float(np.abs(cpu["flat_data"] - gpu["flat_data"]).max())
        rows.append(("parameters after Adam (absolute)", params_diff, 3 * LR))
        for quantity, value, tol in rows:
            ok = value <= tol
            print(f"| {dtype} | {quantity} | {value:.2e} | {tol:.0e} | {'yes' if ok else 'NO'} |")
            if not ok:
                failures.append(f"{dtype} {quantity}: {value:.2e} > {tol:.0e}")
        if dtype == "float64":
            for name in ("greedy", "beam"):
                same = cpu[name] == gpu[name]
                print(f"| {dtype} | {name} decoding: same tokens | {'-'} | exact | {'yes' if same else 'NO'} |")
                if not same:
                    failures.append(f"{dtype} {name} decoding differs: {cpu[name]} vs {gpu[name]}")
    print("\nall CPU/GPU comparisons within tolerance" if not failures else "\nMISMATCH:\n" + "\n".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
