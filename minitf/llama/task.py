"""``train.py --model llama``: the Llama block trained by the language model's task and trainer. The data, the
tokenizer (BPE or characters), the blocks, the loss, validation and the end of the run are the GPT's
(:class:`minitf.lm.task.LanguageModelTask`, :class:`minitf.lm.trainer.LanguageModelTrainer`: this kind extends the
language-model kind); what differs is the model (:class:`minitf.llama.model.Llama`, built from the run's
RunConfig by :func:`minitf.llama.config.run_model_config`) and its own flags (``--num-kv-heads``,
``--rope-theta``). No ``--init-from`` yet: a Llama-family folder is read and sampled, not fine-tuned."""
from minitf.llama.config import RUN_PRESETS, run_model_config
from minitf.llama.model import Llama
from minitf.lm.task import LanguageModelTask
from minitf.lm.trainer import LanguageModelTrainer
from minitf.training.errors import positive


class LlamaTrainer(LanguageModelTrainer):
    """A run of ``python train.py --model llama``: the language model's trainer with the Llama block."""

    def build_model(self):
        return Llama(run_model_config(self.config, self.tokenizer.vocab_size))


class LlamaTask(LanguageModelTask):
    name = "llama"
    title = "the Llama-family model"
    description = ("a decoder-only language model of Llama's blocks (RMSNorm, rotary positions, SwiGLU, grouped-query "
                   "attention) on the same text")
    summary = "the Llama block (minitf.llama) on the language model's data: --train-text, or the World English Bible"
    presets_help = f"--model llama: {', '.join(RUN_PRESETS)}"
    trainer = LlamaTrainer
    config_flags = LanguageModelTask.config_flags + ("num_kv_heads", "rope_theta")
    resume_fixed = LanguageModelTask.resume_fixed + ("num_kv_heads", "rope_theta")
    pretrained = None  # a Llama-family folder is read and sampled (minitf.load, generate), not fine-tuned yet
    init_from_help = ""

    def add_arguments(self, parser):
        """Only its own flags: the data flags are the language model's (its task adds them to the parser)."""
        g = parser.add_argument_group("the Llama block (--model llama)")
        g.add_argument("--num-kv-heads", type=positive(int),
                       help="key/value heads of grouped-query attention, a divisor of --num-heads (default: the "
                            f"preset's, {RUN_PRESETS['tiny']['num_kv_heads']} for tiny)")
        g.add_argument("--rope-theta", type=positive(float),
                       help=f"the rotary positions' base (default: {RUN_PRESETS['tiny']['rope_theta']:g})")

    def given_flags(self, args):
        return super().given_flags(args) + [flag for flag, given in (
            ("--num-kv-heads", args.num_kv_heads is not None), ("--rope-theta", args.rope_theta is not None)) if given]
