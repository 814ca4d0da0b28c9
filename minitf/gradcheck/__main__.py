"""``python -m minitf.gradcheck LAYER``: see :mod:`minitf.gradcheck.command`."""
from minitf.gradcheck.command import main
from minitf.study.tools import run_tool

if __name__ == "__main__":
    raise SystemExit(run_tool(main))
