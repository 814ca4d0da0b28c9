"""A Llama-family model (SmolLM2-135M's shape) in minitf and in transformers: the training step (forward, loss,
backward, Adam) and greedy generation with the key/value cache, each framework in a process of its own.

    pip install -e ".[bench]"      # torch, transformers, safetensors: only for the comparison
    python benchmarks/llama_step.py --threads 2 --rounds 5 --json llama-2.json   # SmolLM2-135M's shape
    python benchmarks/llama_step.py --dry-run                                      # tiny shape, 1 round

The model: a random ``transformers.LlamaForCausalLM`` built from a ``LlamaConfig`` of SmolLM2-135M's shape
(``--shape smollm2``: 30 layers, d_model 576, 9 query heads, 3 key/value heads, d_ff 1536, vocabulary 49,152,
tied output, rope theta 100,000, RMSNorm eps 1e-5; minitf's ``smollm2-135m`` preset) with transformers' own
initialisation (std 576^-0.5, the preset's), saved with ``save_pretrained`` into a temporary folder in float32.
Both frameworks read that folder: transformers with ``LlamaForCausalLM.from_pretrained`` (its default attention,
named in the output), minitf with ``minitf.llama.Llama.from_pretrained`` (float32): the same weights on both
sides. ``--shape tiny`` is a small model for dry runs and tests.

Training step (``--part step``): a fixed batch of random ids, ``batch`` x ``block`` (4 x 256) inputs and the
next ids as targets. minitf: zero_grad, ``model(inputs)``, ``LabelSmoothedCrossEntropy(0.0)`` (plain
next-token cross-entropy), backward, ``minitf.Adam``; PyTorch: ``cross_entropy`` on the logits, autograd,
``torch.optim.AdamW`` (its default implementation). Same settings: lr 3e-4, betas (0.9, 0.95), eps 1e-8 and no
weight decay: minitf has no weight decay (its Adam is AdamW with ``weight_decay=0``, the same update), so
AdamW runs with ``weight_decay=0.0``; AdamW's default of 0.01 would add one pass over the parameters
(``p *= 1 - lr * wd``) to PyTorch's side only. No dropout (Llama has none), so the first step's losses agree
to float32 rounding (checked: relative 1e-4, printed). Memory: each step process reads its resident set after
the model is loaded, then resets its peak (``/proc/self/clear_refs``) and builds the optimizer; after the
timed steps its peak (VmHWM) less that resident set is the step's peak memory (gradients, the optimizer's
state, activations and temporaries) over the loaded model, in MiB. Both processes keep freed memory for reuse
from then on (``minitf.backend.keep_freed_memory``, as train.py runs; the same for both frameworks, as
``benchmarks/benchmark.py``): with glibc's default settings either one gives its step's memory back at the end
of each step and faults it in again in the next (PyTorch's step: 6.1 s with 335,000 page faults against 4.6 s
with none, on the 2-core host).

Generation (``--part generate``): ``prompts`` (8) random prompts of ``prompt_len`` (32) ids, ``new_tokens``
(64) new tokens each, greedy, no end token (both generate every token). minitf: ``minitf.sampling.generate(model,
prompts, n, temperature=0)`` (its key/value cache); transformers: ``generate(do_sample=False,
max_new_tokens=n, min_new_tokens=n, eos_token_id=None)`` under ``torch.inference_mode``. The new tokens are
compared prompt by prompt (printed; they are equal unless float32 rounding flips a near tie).

Method: each part starts two fresh processes, one per framework (this script with ``--worker``), so that
NumPy's OpenBLAS threads and PyTorch's OpenMP threads never share a process and each peak is its own; the
processes take turns, one step (or one whole generation) at a time, timed inside each process, after a warm-up
(the first step, or one generation); a short pause between turns lets the idle process's threads stop
spinning. ``--threads N`` sets both processes' threads (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
``MKL_NUM_THREADS``, ``MINITF_THREADS`` and ``torch.set_num_threads``); the default is this machine's cores.
Prints the machine, then per part the median and spread of each framework, the ratio of the medians and the
spread of the per-round ratios; ``--json OUT`` writes every number.
"""
import argparse
import gc
import json
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import minitf  # noqa: E402
from benchmarks.common import (MinitfLMStep, TorchLMStep, bench_arguments, bench_header, rate_table, run_pair,  # noqa: E402
                               serve_side, spread, step_report, summary)
from minitf.llama.config import PRESETS  # noqa: E402

np = minitf.backend.host

#: Model shapes (minitf.llama.config's fields) and the work of each part: ``smollm2`` is SmolLM2-135M's
#: (minitf's smollm2-135m preset); ``tiny`` is for dry runs and tests.
SHAPES = {
    "smollm2": dict(model=PRESETS["smollm2-135m"], batch=4, block=256, prompts=8, prompt_len=32, new_tokens=64),
    "tiny": dict(model=dict(vocab_size=512, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=128,
                            rope_theta=100000.0, max_position_embeddings=256, tie_word_embeddings=True,
                            initializer_range=0.125, bos_token_id=0, eos_token_id=0),
                 batch=2, block=32, prompts=3, prompt_len=8, new_tokens=16),
}
PARTS = ("step", "generate")


# --------------------------------------------------------------------------- #
# the folder, the batch and the prompts
# --------------------------------------------------------------------------- #
def make_folder(shape, folder, seed=0):
    """A random LlamaForCausalLM of ``shape`` saved in float32 (config.json, model.safetensors)."""
    import torch
    import transformers

    m = shape["model"]
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=m["vocab_size"], hidden_size=m["d_model"], num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_heads"], num_key_value_heads=m["num_kv_heads"], intermediate_size=m["d_ff"],
        hidden_act="silu", rms_norm_eps=m.get("rms_norm_eps", 1e-5),
        rope_parameters={"rope_type": "default", "rope_theta": m["rope_theta"]},
        max_position_embeddings=m["max_position_embeddings"], tie_word_embeddings=m["tie_word_embeddings"],
        initializer_range=m["initializer_range"], bos_token_id=m["bos_token_id"], eos_token_id=m["eos_token_id"],
        pad_token_id=None, attention_bias=False, mlp_bias=False, attention_dropout=0.0)
    transformers.LlamaForCausalLM(config).float().save_pretrained(folder)
    return folder


def step_batch(shape, seed=1):
    """Host int64 (inputs, targets), each (batch, block): random ids, the targets the next ids."""
    ids = np.random.default_rng(seed).integers(0, shape["model"]["vocab_size"], (shape["batch"], shape["block"] + 1))
    return ids[:, :-1].copy(), ids[:, 1:].copy()


def prompt_ids(shape, seed=2):
    """Host int64 (prompts, prompt_len) random ids (id 0, the end token, left out)."""
    rng = np.random.default_rng(seed)
    return rng.integers(1, shape["model"]["vocab_size"], (shape["prompts"], shape["prompt_len"]))


# --------------------------------------------------------------------------- #
# the worker: one framework, one part, in a process of its own
# --------------------------------------------------------------------------- #


class MinitfSide:
    """minitf's model of the folder (float32) and one part's work: ``run()`` -> {"seconds", "loss" or "tokens"}."""

    def __init__(self, folder, shape, part):
        from minitf.llama import Llama
        self.model = Llama.from_pretrained(folder, dtype="float32")
        self.parameters = self.model.num_parameters()
        self.shape, self.part = shape, part
        if part == "step":
            self.step = MinitfLMStep(self.model, step_batch(shape))
            self.baseline = self.step.baseline
        else:
            self.prompts = prompt_ids(shape)

    def run(self):
        if self.part == "step":
            return self.step.run()
        start = time.perf_counter()
        from minitf.sampling import generate
        ids = generate(self.model, self.prompts, self.shape["new_tokens"], temperature=0)
        return {"seconds": time.perf_counter() - start, "tokens": ids[:, self.prompts.shape[1]:].tolist()}


class TorchSide:
    """transformers' LlamaForCausalLM of the folder (float32) and the same work."""

    def __init__(self, folder, shape, part):
        import torch
        import transformers
        self.torch = torch
        self.model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self.attention = self.model.config._attn_implementation
        self.shape, self.part = shape, part
        if part == "step":
            self.step = TorchLMStep(self.model, step_batch(shape))
            self.baseline = self.step.baseline
        else:
            self.model.eval()
            self.prompts = torch.from_numpy(prompt_ids(shape))

    def run(self):
        if self.part == "step":
            return self.step.run()
        torch, start = self.torch, time.perf_counter()
        n = self.shape["new_tokens"]
        with torch.inference_mode():
            ids = self.model.generate(self.prompts, attention_mask=torch.ones_like(self.prompts), do_sample=False,
                                      max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=0)
        return {"seconds": time.perf_counter() - start, "tokens": ids[:, self.prompts.shape[1]:].tolist()}


def bench_step(folder, args):
    shape = SHAPES[args.shape]
    tokens = shape["batch"] * shape["block"]
    return step_report(__file__, folder, args, tokens,
                       f"Training step: batch {shape['batch']} x block {shape['block']} ({tokens:,} tokens), "
                       "next-token cross-entropy, Adam (minitf) / AdamW with weight_decay 0 (PyTorch)")


def bench_generate(folder, args):
    shape = SHAPES[args.shape]
    info, first, rounds, _ = run_pair(__file__, "generate", folder, args)
    result = summary(rounds)
    for name, answers in rounds.items():
        if any(a["tokens"] != first[name]["tokens"] for a in answers):
            raise SystemExit(f"llama_step.py: {name}'s greedy tokens changed from one round to the next")
    ours, theirs = first["minitf"]["tokens"], first["PyTorch"]["tokens"]
    equal = sum(a == b for a, b in zip(ours, theirs))
    new = shape["prompts"] * shape["new_tokens"]
    result |= {"prompts_equal": equal, "prompts": shape["prompts"], "tokens": {"minitf": ours, "transformers": theirs},
               "workers": info}
    print(f"\n## Greedy generation: {shape['prompts']} prompts of {shape['prompt_len']} ids, {shape['new_tokens']} new "
          f"tokens each ({new:,} in all), key/value cache; transformers' attention: {info['PyTorch']['attention']}")
    rate_table(result, new, "new tokens")
    print(f"\nminitf / transformers time: **{result['ratio']:.2f}x** (medians; per-round ratios "
          f"{spread(result['round_ratios'], 1, 2)}); new tokens equal token for token: {equal}/{shape['prompts']} "
          "prompts")
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = bench_arguments(parser, SHAPES, "smollm2", argv, parts=PARTS)
    if args.worker:
        side = MinitfSide if args.worker == "minitf" else TorchSide
        return serve_side(args, lambda: side(args.folder, SHAPES[args.shape], args.part))
    results = bench_header(parser, __file__, argv, args)
    shape = SHAPES[args.shape]
    m = shape["model"]
    print(f"- model ({args.shape}): random LlamaForCausalLM, {m['num_layers']} layers, d_model {m['d_model']}, "
          f"{m['num_heads']} query heads, {m['num_kv_heads']} key/value heads, d_ff {m['d_ff']}, vocabulary "
          f"{m['vocab_size']:,}, {'tied' if m['tie_word_embeddings'] else 'untied'} output, rope theta "
          f"{m['rope_theta']:g}; both read the same saved folder, float32")
    print(f"- method: a process per framework and part, taking turns, {args.rounds} timed rounds each after a "
          "warm-up")
    with tempfile.TemporaryDirectory(prefix="llama_step_") as tmp:
        folder = make_folder(shape, pathlib.Path(tmp) / "model")
        gc.collect()
        for part in (PARTS if args.part == "all" else (args.part,)):
            results[part] = (bench_step if part == "step" else bench_generate)(folder, args)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    if "step" in results and not results["step"]["losses_agree"]:
        print("llama_step.py: the first step's losses differ: the two models are not the same", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
