"""Do two revisions train bit for bit alike? ``python scripts/same_runs.py --baseline REV`` runs the same short runs
(translation, Marian fine-tuning, GPT, Llama; one rank and two through mpiexec) with ``train.py`` of this tree and
of a git worktree of REV, and compares the last checkpoint's model.npz and Adam moments (sha256) and every logged
training loss. For a refactor of the shared machinery that must change no number (the update, the run config).

The data and folders are made once by this tree's test helpers (tests/); the runs take a few minutes on two cores.
Exit status 0 when every run agrees, 1 otherwise (each disagreement printed)."""
import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout
from minitf.training.errors import add_renamed  # noqa: E402
TINY = ["--d-model", "16", "--num-heads", "2", "--num-layers", "1", "--d-ff", "32", "--vocab-size", "40",
        "--max-tokens", "120", "--warmup", "20", "--bleu-sentences", "4", "--beam", "2"]
LM = ["--tokenizer", "char", "--d-model", "24", "--num-heads", "4", "--num-layers", "2", "--d-ff", "48",
      "--block-size", "24", "--max-tokens", "192", "--warmup", "10"]


def make_inputs(folder):
    """{name: train.py flags} of each run, over data and folders made in ``folder`` by the tests' helpers."""
    sys.path.insert(0, str(ROOT))
    from tests.marian_files import make_marian_folder
    from tests.runs import make_corpus
    from tests.test_lm_train import make_text
    from tests.test_llama import make_folder
    (folder / "nmt").mkdir()
    (folder / "lm").mkdir()
    corpus, text = make_corpus(folder / "nmt"), make_text(folder / "lm")
    marian = make_marian_folder(folder / "marian")
    llama = make_folder(folder / "llama")
    return {"translation": corpus + TINY,
            "marian": corpus + ["--init-from", str(marian), "--max-tokens", "150", "--warmup", "10", "--max-len", "60",
                                "--bleu-sentences", "4"],
            "gpt": text + ["--model", "gpt"] + LM,
            "llama": text + ["--model", "llama", "--num-kv-heads", "2"] + LM,
            "llama-folder": text + ["--model", "llama", "--init-from", str(llama), "--block-size", "32",
                                    "--max-tokens", "256", "--warmup", "5"]}


def run(tree, flags, out, ranks, steps):
    """train.py of ``tree`` with ``flags`` on ``ranks`` processes; (sha256 of model.npz, of optimizer.npz, the
    training losses) of its last checkpoint."""
    env = dict(os.environ, PYTHONPATH=str(tree), MINITF_RANKS=str(ranks))
    argv = [sys.executable, str(tree / "train.py"), *flags, "--max-steps", str(steps), "--eval-every", "1000",
            "--save-every", str(steps), "--no-progress", "--seed", "3", "--out", str(out)]
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return ("failed", done.stderr.strip().splitlines()[-1:] or ["(no output)"])
    checkpoint = out / "checkpoints" / f"step-{steps:08d}"
    digests = [hashlib.sha256((checkpoint / name).read_bytes()).hexdigest()[:16]
               for name in ("model.npz", "optimizer.npz")]
    losses = [record["loss"] for record in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if record["kind"] == "train"]
    return (*digests, losses)


def show(result):
    """One run's result in a line: its failure, or its digests and last three losses."""
    return " ".join(result[1]) if result[0] == "failed" else f"model {result[0]} adam {result[1]} {result[2][-3:]}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_renamed(p, "--baseline", "--ref", required=True, metavar="REV",
                help="the revision to compare with (a git worktree of it is made)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--runs", nargs="*", help="only these runs (translation, marian, gpt, llama, llama-folder)")
    p.add_argument("--ranks", type=int, nargs="*", default=[1, 2])
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        ref = tmp / "ref"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(ref), args.baseline], cwd=ROOT, check=True)
        try:
            (tmp / "data").mkdir()
            inputs = make_inputs(tmp / "data")
            bad = 0
            for name, flags in inputs.items():
                if args.runs and name not in args.runs:
                    continue
                for ranks in args.ranks:
                    ours = run(ROOT, flags, tmp / f"ours-{name}-{ranks}", ranks, args.steps)
                    theirs = run(ref, flags, tmp / f"ref-{name}-{ranks}", ranks, args.steps)
                    same = ours == theirs and ours[0] != "failed"
                    bad += not same
                    print(f"{name:13s} {ranks} rank(s): {'same' if same else 'DIFFERENT'}  "
                          + ("  ".join(map(str, ours[:2])) + f"  last loss {ours[2][-1]}" if same else
                             f"\n    ref:  {show(theirs)}\n    ours: {show(ours)}"), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(ref)], cwd=ROOT)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
