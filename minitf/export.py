"""``python -m minitf.export RUN FOLDER``: the export command of the application, kept at this
short name; the code lives in :mod:`minitf.nmt.export`."""
import sys

from minitf.nmt.export import main

if __name__ == "__main__":
    sys.exit(main())
