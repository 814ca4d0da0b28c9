"""``python -m minitf.translate``: the translation command of the application,
kept at this short name; the code lives in :mod:`minitf.nmt.translate`."""
import sys

from minitf.nmt.translate import main

if __name__ == "__main__":
    sys.exit(main())
