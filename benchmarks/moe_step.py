"""A mixture of experts at SmolLM2-135M's width and depth: the training step of minitf's sparse model, of transformers'
(its eager expert loop) and of minitf's dense model with the same active parameters, each in a process of its own,
taking turns.

    pip install -e ".[bench]"      # torch, transformers, safetensors: only for the comparison
    python benchmarks/moe_step.py --threads 2 --rounds 5 --json moe-2.json   # SmolLM2-135M's shape, 8 experts
    python benchmarks/moe_step.py --dry-run                                    # tiny shape, 1 round

The sparse model: a random ``transformers.MixtralForCausalLM`` built from a ``MixtralConfig`` of SmolLM2-135M's
width and depth (``--shape smollm2``: 30 layers, d_model 576, 9 query heads, 3 key/value heads, vocabulary 49,152,
tied output, rope theta 100,000, RMSNorm eps 1e-5, no sliding window) whose every feed-forward is 8 SwiGLU experts,
each a quarter of SmolLM2's d_ff 1536 (``intermediate_size`` 384), 2 per token (the top 2 of the router's softmax,
renormalised: Mixtral's router), with transformers' own initialisation (std 576^-0.5), saved with
``save_pretrained`` into a temporary folder in float32. Mixtral is the Llama block with the sparse feed-forward and
nothing else (Qwen3-MoE adds q/k norms). Both sparse sides read that folder: transformers with
``MixtralForCausalLM.from_pretrained(folder, experts_implementation="eager")``, minitf with
``minitf.llama.Llama.from_pretrained`` (float32). transformers 5 computes the experts by the implementation its
config names (``transformers.integrations.moe``): "grouped_mm" by default (``torch._grouped_mm``), "batched_mm",
or "eager", the experts class's own forward: a Python loop over the experts that were hit, each gathering its
tokens (``torch.where`` of a one-hot mask), one product of the stacked gate/up matrix, SiLU, one down product,
the routing weight, ``index_add_`` back. The eager loop is the form minitf's block has (a loop over experts, the
tokens grouped), so it is the one timed here: the worker asks for it and the output names the implementation
that ran (its ``config._experts_implementation``). Its attention is transformers' default (named too).

The dense model: minitf's Llama of the same shape with one SwiGLU of d_ff 768 per block, 2 x 384: the same
active parameters per token as the sparse model's two experts (the router's 8 x 576 aside), built in minitf with
the same initialisation (its first-step loss is its own: another model).

The step (benchmarks/common.py's ``MinitfLMStep`` and ``TorchLMStep``): a fixed batch of random ids, ``batch`` x
``block`` (4 x 256, 1,024 tokens: a step a 2-core CPU takes in seconds) inputs and the next ids as targets. minitf:
zero_grad, ``model(inputs)``, ``LabelSmoothedCrossEntropy(0.0)`` (plain next-token cross-entropy), backward,
``minitf.Adam``; PyTorch: ``cross_entropy`` on the logits, autograd, ``torch.optim.AdamW`` with
``weight_decay=0.0`` (minitf's Adam is AdamW without weight decay). lr 3e-4, betas (0.9, 0.95), eps 1e-8. The
next-token loss only: no auxiliary load-balancing loss on either side (Mixtral's ``output_router_logits`` is off;
minitf's step asks for none). No dropout, so the sparse sides' first losses agree to float32 rounding (checked:
relative 1e-4, printed; a routing choice that float32 rounding flips at a near tie changes it by far less).
Memory: as benchmarks/llama_step.py measures it (each process's peak over its loaded model, after the timed
steps).

Method (benchmarks/common.py's ``run_pair`` with three workers: its ``Worker`` and ``take_turns``): three fresh
processes (this script with ``--worker``), so that NumPy's OpenBLAS threads and PyTorch's OpenMP threads never
share a process; they take turns, one step at a time, timed inside each process, after a warm-up step; a short
pause between turns. ``--threads N`` sets every process's threads; the default is this machine's cores. Prints
the machine, the median and spread of each, and two ratios of the medians with their targets (issue 52): minitf
sparse / transformers sparse (at most 0.6) and minitf sparse / minitf dense (at most 1.3), with the spread of the
per-round ratios; ``--json OUT`` writes every number.
"""
import argparse
import gc
import os
import pathlib
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import minitf  # noqa: E402
from benchmarks.common import (MinitfLMStep, TorchLMStep, bench_arguments, bench_header, finish_step,  # noqa: E402
                               serve_side, spread, step_report)
from minitf.llama.config import PRESETS  # noqa: E402

np = minitf.backend.host

#: Model shapes (minitf.llama.config's fields, ``d_ff`` the dense model's width that the experts split) with the
#: experts and the batch: ``smollm2`` is SmolLM2-135M's width and depth; ``tiny`` is for dry runs and tests.
SHAPES = {
    "smollm2": dict(model=PRESETS["smollm2-135m"], experts=8, per_token=2, expert_share=4, batch=4, block=256),
    "tiny": dict(model=dict(vocab_size=512, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=128,
                            rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=256,
                            tie_word_embeddings=True, initializer_range=0.125, bos_token_id=0, eos_token_id=0),
                 experts=8, per_token=2, expert_share=4, batch=2, block=32),
}
#: the three workers, in their order of turns: minitf's sparse model, transformers', minitf's dense one
WORKERS = ("minitf", "PyTorch", "dense")
#: issue 52's targets for the ratios of the median step times
TARGETS = {"transformers": 0.6, "dense": 1.3}
EXPERTS_IMPLEMENTATION = "eager"                # transformers' expert loop, the form minitf's block has


def widths(shape):
    """(an expert's width, the dense model's of the same active parameters): d_ff / expert_share, per_token x it."""
    expert = shape["model"]["d_ff"] // shape["expert_share"]
    return expert, shape["per_token"] * expert


def make_folder(shape, folder, seed=0):
    """A random MixtralForCausalLM of ``shape`` saved in float32 (config.json, model.safetensors)."""
    import torch
    import transformers

    m = shape["model"]
    torch.manual_seed(seed)
    config = transformers.MixtralConfig(
        vocab_size=m["vocab_size"], hidden_size=m["d_model"], num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_heads"], num_key_value_heads=m["num_kv_heads"],
        head_dim=m["d_model"] // m["num_heads"], intermediate_size=widths(shape)[0],
        num_local_experts=shape["experts"], num_experts_per_tok=shape["per_token"], hidden_act="silu",
        rms_norm_eps=m["rms_norm_eps"], rope_parameters={"rope_type": "default", "rope_theta": m["rope_theta"]},
        max_position_embeddings=m["max_position_embeddings"], tie_word_embeddings=m["tie_word_embeddings"],
        initializer_range=m["initializer_range"], bos_token_id=m["bos_token_id"], eos_token_id=m["eos_token_id"],
        pad_token_id=None, sliding_window=None, attention_dropout=0.0, output_router_logits=False,
        router_jitter_noise=0.0)
    transformers.MixtralForCausalLM(config).float().save_pretrained(folder)
    return folder


def step_batch(shape, seed=1):
    """Host int64 (inputs, targets), each (batch, block): random ids, the targets the next ids."""
    ids = np.random.default_rng(seed).integers(0, shape["model"]["vocab_size"], (shape["batch"], shape["block"] + 1))
    return ids[:, :-1].copy(), ids[:, 1:].copy()


# --------------------------------------------------------------------------- #
# the workers: one model each, in a process of its own
# --------------------------------------------------------------------------- #
def minitf_side(folder, shape):
    """minitf's sparse model of the folder (float32) and its step."""
    from minitf.llama import Llama
    step = MinitfLMStep(Llama.from_pretrained(folder, dtype="float32"), step_batch(shape))
    step.info = {"sparse_layers": len(step.model.sparse_blocks())}
    return step


def dense_side(folder, shape):
    """minitf's dense model of the same shape, d_ff = per_token x the experts' width (seed 0), and its step."""
    from minitf.llama import Llama, LlamaConfig
    minitf.manual_seed(0)
    model = Llama(LlamaConfig(**(shape["model"] | {"d_ff": widths(shape)[1]})))
    step = MinitfLMStep(model, step_batch(shape))
    step.info = {"d_ff": model.config.d_ff}
    return step


def torch_side(folder, shape):
    """transformers' MixtralForCausalLM of the folder (float32), its experts computed by the eager loop, and the
    same step."""
    import torch
    import transformers
    model = transformers.MixtralForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                            experts_implementation=EXPERTS_IMPLEMENTATION)
    step = TorchLMStep(model, step_batch(shape))
    step.info = {"experts": model.config._experts_implementation}
    return step


SIDES = {"minitf": minitf_side, "PyTorch": torch_side, "dense": dense_side}


def ratio_line(result, over, name, target):
    """The ratio of minitf sparse's median over ``over``'s, the spread of the per-round ratios, and the target:
    (the line, the numbers)."""
    times = result["times"]
    ratio = result["median"]["minitf"] / result["median"][over]
    rounds = [a / b for a, b in zip(times["minitf"], times[over])]
    met = ratio <= target
    line = (f"minitf sparse / {name}: **{ratio:.2f}x** (medians; per-round ratios {spread(rounds, 1, 2)}); target "
            f"<= {target:g}: {'met' if met else 'NOT met'}")
    return line, {"ratio": ratio, "round_ratios": rounds, "target": target, "met": met}


def bench_step(folder, args):
    shape = SHAPES[args.shape]
    dense = widths(shape)[1]
    tokens = shape["batch"] * shape["block"]
    labels = {"minitf": "minitf sparse", "PyTorch": f"transformers sparse ({EXPERTS_IMPLEMENTATION} experts)",
              "dense": f"minitf dense (d_ff {dense})"}
    result = step_report(__file__, folder, args, tokens,
                         f"Training step: batch {shape['batch']} x block {shape['block']} ({tokens:,} tokens), "
                         "next-token cross-entropy, Adam (minitf) / AdamW with weight_decay 0 (PyTorch)",
                         names=WORKERS, labels=labels)
    ran = result["workers"]["PyTorch"]["experts"]
    print(f"\ntransformers' experts implementation that ran: {ran}; attention: "
          f"{result['workers']['PyTorch']['attention']}")
    result["ratios"] = {}
    for over, name in (("PyTorch", "transformers sparse"), ("dense", f"minitf dense (d_ff {dense})")):
        key = "transformers" if over == "PyTorch" else "dense"
        line, result["ratios"][key] = ratio_line(result, over, name, TARGETS[key])
        print(line)
    memory = result["peak_mib"]
    print(f"peak memory: minitf sparse / minitf dense **{memory['minitf'] / memory['dense']:.2f}x**")
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = bench_arguments(parser, SHAPES, "smollm2", argv, workers=WORKERS)
    if args.worker:
        return serve_side(args, lambda: SIDES[args.worker](args.folder, SHAPES[args.shape]))
    results = bench_header(parser, __file__, argv, args)
    shape = SHAPES[args.shape]
    m = shape["model"]
    expert, dense = widths(shape)
    print(f"- model ({args.shape}): random MixtralForCausalLM, {m['num_layers']} layers, d_model {m['d_model']}, "
          f"{m['num_heads']} query heads, {m['num_kv_heads']} key/value heads, {shape['experts']} experts of d_ff "
          f"{expert} ({m['d_ff']} / {shape['expert_share']}), {shape['per_token']} per token, vocabulary "
          f"{m['vocab_size']:,}, {'tied' if m['tie_word_embeddings'] else 'untied'} output, rope theta "
          f"{m['rope_theta']:g}; both sparse sides read the same saved folder, float32; the dense model: minitf's "
          f"Llama of the same shape with d_ff {dense} ({shape['per_token']} x {expert}: the same active parameters)")
    print(f"- method: a process per model, taking turns, {args.rounds} timed rounds each after a warm-up")
    with tempfile.TemporaryDirectory(prefix="moe_step_") as tmp:
        folder = make_folder(shape, pathlib.Path(tmp) / "model")
        gc.collect()
        results["step"] = bench_step(folder, args)
    return finish_step(__file__, args, results, "the two sparse models")

if __name__ == "__main__":
    raise SystemExit(main())
