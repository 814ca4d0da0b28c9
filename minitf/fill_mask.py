"""``python -m minitf.fill_mask``: the BERT kind's command, kept at this short name; the code lives in
:mod:`minitf.bert.fill_mask`."""
import sys

from minitf.bert.fill_mask import main

if __name__ == "__main__":
    sys.exit(main())
