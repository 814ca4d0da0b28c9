"""The mutation score per module (and, with --functions, per function) from mutmut's results in
mutants/, as the Markdown table of docs/testing.md:  python scripts/mutation/score.py [--functions]

score = (killed + timeout) / (killed + timeout + survived): mutants no test reaches ("no tests", among them a function
reached only through a child process) and mutants not yet run are counted apart, not as survivors.
"""
import collections
import json
import pathlib
import sys

# mutmut's exit codes (mutmut/stats.py)
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", None: "not run",
          36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout"}
COLUMNS = ["killed", "survived", "timeout", "no tests", "not run"]


def rows(by_function):
    counts = collections.defaultdict(collections.Counter)
    for meta in sorted(pathlib.Path("mutants").rglob("*.py.meta")):
        module = meta.relative_to("mutants").as_posix()[:-len(".meta")]
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            function = name.rpartition(".")[2].split("__mutmut_")[0].replace("xǁ", "").replace("ǁ", ".")
            key = f"{module}: {function.removeprefix('x_')}" if by_function else module
            counts[key][STATUS.get(code, "other")] += 1
    return counts


def main():
    counts = rows("--functions" in sys.argv)
    print("| module | mutants | " + " | ".join(COLUMNS) + " | score |")
    print("|---|---:|" + "---:|" * len(COLUMNS) + "---:|")
    total = collections.Counter()
    for key, c in sorted(counts.items()):
        total.update(c)
        caught = c["killed"] + c["timeout"]
        score = f"{100 * caught / (caught + c['survived']):.0f}%" if caught + c["survived"] else "-"
        print(f"| {key} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in COLUMNS) + f" | {score} |")
    caught = total["killed"] + total["timeout"]
    print(f"| all | {sum(total.values())} | " + " | ".join(str(total[k]) for k in COLUMNS)
          + f" | {100 * caught / max(caught + total['survived'], 1):.0f}% |")


if __name__ == "__main__":
    main()
