"""``python -m minitf.generate``: the sampling command of the application, kept at this
short name; the code lives in :mod:`minitf.lm.generate`."""
import sys

from minitf.lm.generate import main

if __name__ == "__main__":
    sys.exit(main())
