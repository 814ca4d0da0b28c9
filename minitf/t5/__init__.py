"""T5 as a model kind: :class:`minitf.t5.model.T5` (the encoder-decoder of RMSNorm, unscaled attention with a
relative position bias, and a ReLU or gated-GELU feed-forward, each with its hand-written backward), its
:class:`minitf.t5.config.T5Config`, and Hugging Face T5 and mT5 folders in and out (:mod:`minitf.t5.hf`)."""
from minitf.t5.config import T5Config
from minitf.t5.model import T5

__all__ = ["T5", "T5Config"]
