"""Reprint the shown outputs of docs pages: every ```text output-of: COMMAND block of the pages given is replaced by
what COMMAND prints now (run from the repository's root), as tests/test_docs.py checks them. For after a change that
moves a quoted line or changes a printed number: ``python scripts/reprint_outputs.py docs/llama.md docs/walk.md``."""
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(```text output-of: (?P<command>python -m [^\n]+)\n)(?P<body>.*?)(\n```)", re.S)


def reprint(page):
    """Rewrite ``page``'s output-of blocks of ``python -m`` commands; returns how many changed."""
    text = page.read_text(encoding="utf-8")
    changed = 0

    def run(match):
        nonlocal changed
        if "..." in match["body"].splitlines():   # an abridged block (a '...' line marks a gap): left to the writer
            print(f"{page}: {match['command']}: abridged block left as it is; check it with tests/test_docs.py")
            return match.group(0)
        args = shlex.split(match["command"])
        done = subprocess.run([sys.executable, *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"{page}: {match['command']} failed: {done.stderr.strip().splitlines()[-1:]}")
        body = done.stdout.rstrip("\n")
        changed += body != match["body"]
        return match.group(1) + body + match.group(4)

    page.write_text(BLOCK.sub(run, text), encoding="utf-8")
    return changed


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(f"{name}: {reprint(ROOT / name)} block(s) reprinted")
