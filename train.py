#!/usr/bin/env python3
"""Train a Transformer translation model, or (``--model gpt``) a decoder-only language model:
``python train.py --help``.

With no arguments: fetches the Ding German-English dictionary (via apt, or over
HTTPS from Debian's archive, once), trains the tiny preset on the CPU within 14
minutes for the whole command, reports
validation and test BLEU, and leaves a checkpoint for ``python -m minitf.translate``.
"""
import sys
import time

STARTED = time.time()  # the whole command's wall time and --max-minutes count from here, before the imports

from minitf.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(started=STARTED))
