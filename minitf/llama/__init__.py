"""The Llama family (Llama 2 and 3, SmolLM2, Qwen2 and 2.5, Mistral without a sliding window) as a model kind:
:class:`minitf.llama.model.Llama` (pre-norm blocks of RMSNorm, grouped-query attention with rotary positions and
a SwiGLU feed-forward, each with its hand-written backward), its :class:`minitf.llama.config.LlamaConfig`, Hugging
Face folders in and out (:mod:`minitf.llama.hf`) and the kind the registry names (:mod:`minitf.llama.kind`)."""
from minitf.llama.config import PRESETS, LlamaConfig
from minitf.llama.model import Llama

__all__ = ["Llama", "LlamaConfig", "PRESETS"]
