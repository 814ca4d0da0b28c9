"""Print the recipe-arms table (Markdown) from the run folders of scripts/recipe_arms.sh.

    python scripts/arms_table.py runs/arms [ARM ...]
"""
import json
import pathlib
import sys


def records(run):
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def row(run):
    rs = records(run)
    valid = [r for r in rs if r["kind"] == "valid" and "model" not in r]
    final = [r for r in rs if r["kind"] == "valid" and "model" in r]
    test = [r for r in rs if r["kind"] == "test"]
    train = [r for r in rs if r["kind"] == "train"]
    curve = " / ".join(f"{r['bleu']:.2f}" for r in valid if "bleu" in r)
    ppl = " / ".join(f"{r['ppl']:.1f}" for r in valid)
    best = max(final, key=lambda r: r.get("bleu", 0)) if final else None
    return (f"| {run.name} | {train[-1]['step'] if train else 0} | {curve} | {ppl} | "
            + (f"{best['bleu']:.2f} ({best['model']}) | " if best else "- | ")
            + (f"{test[-1]['bleu']:.2f} |" if test else "- |"))


def main():
    out = pathlib.Path(sys.argv[1])
    names = sys.argv[2:] or sorted(p.name for p in out.iterdir() if p.is_dir())
    print("| arm | steps | validation BLEU per --eval-every steps (500 sentences, greedy) | validation perplexity "
          "per --eval-every steps | end: validation BLEU of the chosen model | test BLEU (beam 4) |")
    print("|---|---|---|---|---|---|")
    for name in names:
        print(row(out / name))


if __name__ == "__main__":
    main()
