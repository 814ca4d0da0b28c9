"""The registry of model kinds: one line per kind, its ``train.py --model`` name and the module of its package
that describes it (a :class:`minitf.training.kind.Kind`). The shared machinery (``minitf.training``), the ``train.py``
command, the one loader (:func:`minitf.loader.load`) and the study tools find every kind here and contain no
branch on a kind: adding a kind is its package plus one line below (docs/architecture.md, "Four change plans").

A kind's module is imported when it is first asked for (by name, so the registry imports no kind and the import
graph keeps its one direction: kinds import the shared machinery, never the other way)."""
import importlib

#: ``--model`` name -> the module whose ``KIND`` describes it; the first is ``train.py``'s default.
KINDS = {
    "transformer": "minitf.nmt.kind",   # the paper's encoder-decoder; Hugging Face Marian (opus-mt) folders
    "gpt": "minitf.lm.kind",            # the decoder-only GPT; Hugging Face GPT-2 folders
    "llama": "minitf.llama.kind",       # the Llama family; Hugging Face Llama, Qwen2 and Mistral folders
    "bert": "minitf.bert.kind",         # the encoder line; Hugging Face BERT, DistilBERT and RoBERTa folders
    "t5": "minitf.t5.kind",             # T5's encoder-decoder; Hugging Face T5 and mT5 folders
}


def names():
    """Every kind's ``--model`` name, the default first."""
    return tuple(KINDS)


def get(name):
    """The :class:`minitf.training.kind.Kind` called ``name``; a ValueError naming the known ones for any other."""
    if name not in KINDS:
        raise ValueError(f"no model kind {name!r}; minitf has {', '.join(KINDS)}")
    return importlib.import_module(KINDS[name]).KIND


def every():
    """Every kind, the default first."""
    return [get(name) for name in KINDS]


def for_model_type(model_type):
    """The kind that reads Hugging Face folders of ``model_type`` (config.json's), or None."""
    return next((kind for kind in every() if model_type in kind.hf_model_types), None)


def hf_model_types():
    """Every Hugging Face ``model_type`` some kind reads, in the registry's order."""
    return [t for kind in every() for t in kind.hf_model_types]
