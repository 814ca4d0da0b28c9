"""Translating as one types: ``python -m minitf.translate --checkpoint RUN`` on a
terminal answers each line when Enter is pressed (a pipe or a file is still
translated in batches), and the few everyday sentences the end of
``train.py`` shows."""
import sys

from minitf.nmt.data import decode_lines
from minitf.nmt.errors import DataError
from minitf.nmt.evaluate import translate_texts

#: Short everyday German sentences shown at the end of a German-English run.
EVERYDAY_GERMAN = ("Ich habe Hunger.", "Die Tür ist geschlossen.", "Das Wetter ist heute schön.",
                   "Wo ist der Bahnhof?", "Kannst du mir helfen?")


def translate_interactively(model, tokenizer, beam, alpha, stdin=None, stdout=None, stderr=None):
    """Read lines from a terminal and write each translation as soon as its line ends.

    An empty line gives an empty line; a line that is not UTF-8 gives a one-line
    error on stderr and the session goes on. Ctrl-D (end of input) or Ctrl-C ends
    it with status 0.
    """
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    print("Type a sentence and press Enter; Ctrl-D ends.", file=stderr, flush=True)
    reader = getattr(stdin, "buffer", stdin)
    try:
        for raw in iter(reader.readline, b""):
            try:
                lines = decode_lines(raw, "that line")
            except DataError as error:
                print(f"error: {error}", file=stderr, flush=True)
                continue
            text = lines[0] if lines else ""
            answer = translate_texts(model, tokenizer, [text], beam, alpha, batch_size=1)[0] if text else ""
            stdout.write(answer + "\n")
            stdout.flush()
    except KeyboardInterrupt:
        print(file=stderr)
    return 0


def show_examples(model, tokenizer, run_dir, src_lang, beam, alpha, log):
    """Log the translate command and, for a German source, a few everyday sentences through it."""
    log(f"translate with: python -m minitf.translate --checkpoint {run_dir}")
    if src_lang != "de":
        return
    outputs = translate_texts(model, tokenizer, list(EVERYDAY_GERMAN), beam, alpha)
    width = max(map(len, EVERYDAY_GERMAN))
    log("for example:\n" + "\n".join(f"  {src:<{width}}  ->  {out}" for src, out in zip(EVERYDAY_GERMAN, outputs)))
