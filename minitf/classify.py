"""``python -m minitf.classify``: the BERT kind's command, kept at this short name; the code lives in
:mod:`minitf.bert.classify`."""
import sys

from minitf.bert.classify import main

if __name__ == "__main__":
    sys.exit(main())
