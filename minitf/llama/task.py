"""``train.py --model llama``: the Llama block trained by the language model's task and trainer. The data, the
tokenizer (BPE or characters), the blocks, the loss, validation and the end of the run are the GPT's
(:class:`minitf.lm.task.LanguageModelTask`, :class:`minitf.lm.trainer.LanguageModelTrainer`: this kind extends the
language-model kind); what differs is the model (:class:`minitf.llama.model.Llama`, built from the run's
RunConfig by :func:`minitf.llama.config.run_model_config`) and its own flags (``--num-kv-heads``,
``--rope-theta``, a mixture of experts' ``--num-experts`` and the rest). ``--init-from FOLDER`` fine-tunes a
Hugging Face Llama, Qwen2, Mistral, Qwen3, Qwen3-MoE, Qwen2-MoE, Mixtral or OLMoE folder
(:mod:`minitf.llama.moe_hf`): its model's config is kept in the run (``llama``), its weights are the start and its
tokenizer.json the run's tokenizer.

A mixture of experts trains with its auxiliary losses (the trainer's hooks: the load-balancing loss, the router
z-loss where its coefficient is above 0, each logged as ``aux_NAME``), each step's metrics.jsonl record holds the
tokens each expert got in every sparse layer (``expert_load``), and a layer sending more than
:data:`IMBALANCE` of its tokens to one expert is one warning line in the log, once per layer and validation
interval. A dense model has none of this: its runs are those of before, bit for bit."""
import importlib.util
import pathlib
import sys

from minitf.backend import host as np
from minitf.llama import hf, moe_hf
from minitf.llama.config import RUN_PRESETS, folder_fields, run_model_config
from minitf.llama.model import Llama
from minitf.llama.tokenizer import LlamaTokenizer, read_tokenizer
from minitf.lm.data import TextCorpus, load_tokenizer
from minitf.lm.task import FINE_TUNE_LR_SCALE, PRETRAINED_FIXED, LanguageModelTask, new_text_data, read_texts
from minitf.lm.trainer import LanguageModelTrainer
from minitf.moe import LOAD_RECORD
from minitf.pretrained import weights_path
from minitf.training.errors import DataError, UsageError
from minitf.training.task import RunData, before_training, refuse_with_init_from


#: the share of a sparse layer's tokens routed to one expert above which the log warns (the router collapsing)
IMBALANCE = 0.9


class LlamaTrainer(LanguageModelTrainer):
    """A run of ``python train.py --model llama``: the language model's trainer with the Llama block, and a mixture
    of experts' auxiliary losses and expert load (the trainer's hooks; none for a dense block)."""
    expert_tokens = None      # (sparse layers, E) tokens per expert of this update's micro-batches on this rank
    imbalance_said = ()       # (validation interval, the sparse layers warned of in it)

    def build_model(self):
        return Llama(run_model_config(self.config, self.tokenizer.vocab_size))

    def read_pretrained(self):
        return moe_hf.read_pretrained_state(self.config.init_from, self.model.config)

    def auxiliary_coefficients(self):
        return self.model.aux_coefficients()  # {} for a dense model: its update is the plain one

    def update(self, batches, lengths):
        self.expert_tokens = None  # counted afresh for each update (a skipped one's too)
        return super().update(batches, lengths)

    def auxiliary_losses(self):
        load = np.stack(self.model.expert_load())                       # (sparse layers, E)
        self.expert_tokens = load if self.expert_tokens is None else self.expert_tokens + load
        return {name: float(value) for name, (value, _) in self.model.aux_losses().items()}

    def backward_auxiliary(self, scale):
        self.model.backward_aux({name: c * scale for name, c in self.auxiliary_coefficients().items()})

    def train_record(self):
        """``expert_load``: the tokens each expert got in this update (every rank's micro-batches), a list of E per
        sparse layer; a layer above :data:`IMBALANCE` of its tokens on one expert is warned of (:meth:`warn_imbalance`)."""
        if self.expert_tokens is None:
            return {}
        load = self.expert_tokens
        if self.world.size > 1:  # every rank writes this step's record: the sum is a collective they all reach
            load = self.world.sum_host(load.reshape(-1)).reshape(load.shape)
        self.warn_imbalance(load)
        return {LOAD_RECORD: [[int(n) for n in layer] for layer in load]}

    def warn_imbalance(self, load):
        """One warning line for each sparse layer whose busiest expert got more than :data:`IMBALANCE` of the
        layer's tokens (each token is routed to k experts: the share is that expert's count over the tokens), said
        once per layer and validation interval."""
        config = self.model.config
        interval = (self.step - 1) // self.config.eval_every
        if not self.imbalance_said or self.imbalance_said[0] != interval:
            self.imbalance_said = (interval, set())
        layers = [i for i in range(config.num_layers) if config.is_sparse(i)]
        for layer, counts in zip(layers, load):
            tokens = counts.sum() / config.num_experts_per_tok
            share = counts.max() / max(tokens, 1)
            if share > IMBALANCE and layer not in self.imbalance_said[1]:
                self.imbalance_said[1].add(layer)
                self.log(f"warning: step {self.step}: sparse layer {layer} routed {share:.0%} of its tokens to "
                         f"expert {int(counts.argmax())} of {config.num_experts} (the router collapsing onto it; "
                         f"a larger --router-aux-loss-coef than {config.router_aux_loss_coef:g} balances the load)")


def load_run_tokenizer(path):
    """A ``--model llama`` run's tokenizer.model: a fine-tuning run's folder tokenizer, or the language model's."""
    path = pathlib.Path(path)
    data = path.read_bytes() if path.is_file() else b""
    return LlamaTokenizer.from_bytes(data, str(path)) if LlamaTokenizer.written(data) else load_tokenizer(path)


def read_init_tokenizer(config):
    """The tokenizer.json of --init-from's folder, ending text at the model's end-of-text ids; refused where it
    has more ids than the model's vocabulary."""
    model = run_model_config(config, config.vocab_size)
    tokenizer = read_tokenizer(config.init_from, model.eos_ids)
    if tokenizer.vocab_size > model.vocab_size:
        raise DataError(f"--init-from {config.init_from}: its tokenizer has {tokenizer.vocab_size} tokens and its "
                        f"model {model.vocab_size}; they do not belong together: copy the model's own tokenizer")
    return tokenizer


class LlamaTask(LanguageModelTask):
    name = "llama"
    title = "the Llama-family model"
    description = ("a decoder-only language model of Llama's blocks (RMSNorm, rotary positions, SwiGLU, grouped-query "
                   "attention) on the same text")
    summary = "the Llama block (minitf.llama) on the language model's data: --train-text, or the World English Bible"
    presets_help = f"--model llama: {', '.join(RUN_PRESETS)}"
    trainer = LlamaTrainer
    pretrained = "Llama, Qwen2, Mistral, Qwen3, Qwen3-MoE, Qwen2-MoE, Mixtral or OLMoE"
    init_from_help = ("fine-tune a Hugging Face Llama, Qwen2, Mistral, Qwen3, Qwen3-MoE, Qwen2-MoE, Mixtral or "
                      "OLMoE folder (config.json, model.safetensors or "
                      "its shards, tokenizer.json): its shape, weights and tokenizer (needs pip install -e '.[hf]'; "
                      f"--lr-scale {FINE_TUNE_LR_SCALE:g} unless given)")

    def pretrained_fields(self, args):
        """A Llama-family folder's model (checked key by key), its tokenizer (present and readable) and its weights
        (read and checked once, :meth:`read_once`), before any run folder is made."""
        folder = args.init_from
        refuse_with_init_from(args, PRETRAINED_FIXED + ("num_kv_heads", "rope_theta", "num_experts",
                                                         "experts_per_token", "moe_d_ff"))
        if importlib.util.find_spec("tokenizers") is None:
            raise UsageError("--init-from needs the tokenizers package, not installed here: pip install -e '.[hf]'")
        if args.corpus_dir is not None or args.bpe_dropout:
            raise UsageError(f"--init-from {folder} reads the text with its folder's tokenizer: give --train-text "
                             "... without --corpus-dir or --bpe-dropout (minitf's own tokenizers' options)")
        try:
            config, _ = moe_hf.pretrained_config(folder)
        except ValueError as error:
            raise UsageError(f"--init-from {folder}: {error}") from None
        read_tokenizer(folder, config.eos_ids)  # a missing or unreadable tokenizer.json: named before the weights
        try:  # damaged weights (truncated, a NaN): refused here, before any run folder; the trainer gets these
            state = self.read_once(weights_path(folder), lambda: moe_hf.read_pretrained_state(
                folder, config, warn=lambda message: print(message, file=sys.stderr)))
        except ValueError as error:
            raise DataError(f"--init-from {folder}: {error}") from None
        config = hf.config_of_state(config, state)  # untied where the file holds its own head
        return dict(d_model=config.d_model, num_heads=config.num_heads, num_kv_heads=config.num_kv_heads,
                    num_decoder_layers=config.num_layers, d_ff=config.d_ff, rope_theta=config.rope_theta,
                    vocab_size=config.vocab_size, tokenizer="pretrained", init_from=str(folder.resolve()),
                    llama=folder_fields(config), lr_scale=args.lr_scale or FINE_TUNE_LR_SCALE)

    def new_run(self, args, given, config, run_dir, world):
        if config.init_from is None:
            return super().new_run(args, given, config, run_dir, world)
        with before_training(run_dir):
            return new_text_data(args, config, run_dir, world, read_init_tokenizer, load_run_tokenizer)

    def reopen(self, config, run_dir):
        if config.init_from is None:
            return super().reopen(config, run_dir)
        tokenizer = load_run_tokenizer(run_dir / "tokenizer.model")
        return RunData(tokenizer, TextCorpus(tokenizer, read_texts(config.data), config.block_size))
