"""Labelled lines for a sequence classifier (``train.py --model bert --train-tsv T --valid-tsv V [--test-tsv F]``):
each line ``text TAB label``, UTF-8. The label names are the training file's, in sorted order (the run's
``labels``, an exported folder's ``id2label``); a validation or test line's label must be one of them. Every bad
line is refused naming the file and the line, before anything is written."""
from minitf.training.errors import DataError, UsageError
from minitf.training.text import read_text

#: The classifier's files (``--train-tsv`` ...).
TSV_SPLITS = ("train", "valid", "test")


def read_tsv(path, flag):
    """(texts, labels, line numbers) of the TSV ``path`` (``flag`` names it: "--train-tsv"); blank lines are
    skipped. A DataError for a missing, empty or non-UTF-8 file (:func:`minitf.training.text.read_text`), a line
    without a TAB or with more than one, an empty text or label."""
    lines = read_text(path, flag).split("\n")
    texts, labels, numbers = [], [], []
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        tabs = line.count("\t")
        if tabs != 1:
            what = "no TAB" if tabs == 0 else f"{tabs} TABs"
            raise DataError(f"{flag} {path}:{number} has {what}; expected one text TAB its label a line")
        text, label = (part.strip() for part in line.split("\t"))
        if not text or not label:
            raise DataError(f"{flag} {path}:{number} has an empty {'text' if not text else 'label'}; expected one "
                            "text TAB its label a line")
        texts.append(text)
        labels.append(label)
        numbers.append(number)
    if not texts:
        raise DataError(f"{flag} {path} has no labelled line; expected one text TAB its label a line")
    return texts, labels, numbers


def tsv_paths(args):
    """{"train_tsv": path, "valid_tsv": ..., "test_tsv": path or None} of the command line, or None when no TSV
    is given; one line for a TSV without the training file, without --valid-tsv, or beside --train-text."""
    given = {f"{split}_tsv": getattr(args, f"{split}_tsv") for split in TSV_SPLITS}
    if all(path is None for path in given.values()):
        return None
    texts = [f"--{split}-text" for split in TSV_SPLITS if getattr(args, f"{split}_text", None) is not None]
    if texts:
        raise UsageError(f"{', '.join(texts)} and --train-tsv cannot go together: a --model bert run trains the masked "
                         "LM on text or a classifier on labelled lines (text TAB label), not both")
    if given["train_tsv"] is None:
        raise UsageError("--valid-tsv and --test-tsv go with --train-tsv FILE (text TAB label a line)")
    if given["valid_tsv"] is None:
        raise UsageError("--train-tsv needs --valid-tsv FILE too (validation loss and accuracy are measured on it)")
    return {key: (str(path.resolve()) if path is not None else None) for key, path in given.items()}


def read_labelled(paths, labels=None):
    """({split: (texts, label ids)}, label names) of the TSV files ``paths`` (:func:`tsv_paths`'s, or a run's
    config.data): the label names are ``labels`` (a resumed run's) or the training file's, sorted; a validation or
    test line with another label is refused naming it, the file and the line, as is a training file of one label."""
    splits, found = {}, {}
    for split in TSV_SPLITS:
        path = paths.get(f"{split}_tsv")
        if path is not None:
            found[split] = read_tsv(path, f"--{split}-tsv")
    names = sorted(set(found["train"][1]))
    if labels is None and len(names) < 2:
        raise DataError(f"--train-tsv {paths['train_tsv']} has one label ({names[0]!r}); a classifier needs at least "
                        "two")
    if labels is not None and names != list(labels):
        raise DataError(f"--train-tsv {paths['train_tsv']} now has the labels {names}, the run was started with "
                        f"{list(labels)}; restore the run's training file or start a new run")
    index = {name: i for i, name in enumerate(names)}
    for split, (texts, split_labels, numbers) in found.items():
        for label, number in zip(split_labels, numbers):
            if label not in index:
                raise DataError(f"--{split}-tsv {paths[f'{split}_tsv']}:{number} has the label {label!r}, which the "
                                f"training file does not have (its labels: {', '.join(names)}); a classifier predicts "
                                "the labels it was trained on")
        splits[split] = (texts, [index[label] for label in split_labels])
    return splits, names
