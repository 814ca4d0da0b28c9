"""BERT, the encoder line (Devlin et al. 2018), from minitf's own layers: token, position and token-type embeddings
summed and normalised, the paper's post-LN encoder (:class:`minitf.transformer.Encoder`, exact GELU in its
feed-forward), and one of three tops:

    BertModel                       the encoder's states (B, L, D); its ``pooler``: tanh(h[:, 0] W + b) (B, D)
    BertForMaskedLM                 + dense, activation, LayerNorm, the decoder tied to the token embedding and its
                                    own bias: logits (B, L, V) at every position (the loss reads the masked ones)
    BertForSequenceClassification   + the pooler, dropout, a linear layer: logits (B, num_labels) of the [CLS] state

What separates BERT, DistilBERT and RoBERTa is options (:class:`BertConfig`'s fields; the names in their folders are
:mod:`minitf.bert.hf`'s):

    option             BERT                  DistilBERT            RoBERTa
    type_vocab_size    2 (two segments)      0 (no token types)    1
    position_offset    0: positions 0..L-1   0                     pad_token_id + 1: real tokens counted from there,
                                                                   padding at position pad_token_id
    head_activation    hidden_act            activation            "gelu" (whatever hidden_act says)

Every layer is one of minitf's, each with its own backward: ``Embedding`` (the pad row gets no gradient from its
lookups, as PyTorch's ``padding_idx``), ``LayerNorm``, ``Dropout``, ``MultiHeadAttention`` (its dropout on the
attention weights is BERT's ``attention_probs_dropout_prob``), the post-LN ``SublayerConnection``, ``FeedForward``, ``Linear``, ``Tanh``, ``OutputProjection``. The backward here only
walks the parts in reverse.

Masks follow minitf's convention: ``key_padding_mask`` (B, L) bool, True = a padding key (Hugging Face's
``attention_mask`` is its inverse). Shapes: B batch, L sequence length, D d_model, V vocabulary size, C labels.
"""
import dataclasses
import math

from minitf import backend
from minitf.backend import xp
from minitf.layers import ACTIVATIONS, Dropout, Embedding, LayerNorm, Linear, OutputProjection, Tanh, make_activation
from minitf.module import Module
from minitf.transformer import Encoder, check_ids, check_positive_ints

np = backend.host

#: The three encoders a BertConfig describes (Hugging Face's model_type values).
FLAVOURS = ("bert", "distilbert", "roberta")


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """A BERT-family encoder's shape and choices, declared and checked here once (a ValueError naming the field);
    a model's ``config``. Defaults: bert-base-uncased's shape (but for the vocabulary size).

    ``type_vocab_size`` 0: no token-type embedding (DistilBERT). ``position_offset`` 0: position l is row l of the
    table for every token (BERT, DistilBERT); above 0 (RoBERTa's ``pad_token_id + 1``): the non-padding tokens
    (ids other than ``pad_token_id``) are counted from ``position_offset`` and padding tokens read row
    ``pad_token_id``. ``activation``: the feed-forward's (a name of :data:`minitf.layers.ACTIVATIONS`);
    ``head_activation`` the masked-LM head's (None: the same). ``dropout``: on the embeddings and every residual
    branch; ``attention_dropout`` on the attention weights (BERT's attention_probs_dropout_prob, DistilBERT's
    attention_dropout; None: ``dropout``'s value, set when the config is made); ``classifier_dropout`` before the
    classifier (None: ``dropout``). ``id2label``: the label names, label
    i's at index i (empty: "LABEL_0", "LABEL_1"... for ``num_labels``). ``flavour``: whose folder it is."""
    vocab_size: int
    d_model: int = 768
    num_heads: int = 12
    num_layers: int = 12
    d_ff: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    activation: str = "gelu"
    head_activation: str | None = None
    dropout: float = 0.1
    attention_dropout: float | None = None
    classifier_dropout: float | None = None
    pad_token_id: int = 0
    position_offset: int = 0
    num_labels: int = 2
    id2label: tuple = ()
    flavour: str = "bert"
    initializer_range: float = 0.02

    def __post_init__(self):
        check_positive_ints(self, ("vocab_size", "d_model", "num_heads", "num_layers", "d_ff",
                                   "max_position_embeddings", "num_labels"))
        if self.d_model % self.num_heads:
            raise ValueError(f"BertConfig: d_model {self.d_model} is not a multiple of num_heads {self.num_heads}")
        for name in ("type_vocab_size", "pad_token_id", "position_offset"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"BertConfig: {name} must be an integer >= 0, got {value!r}")
        if self.pad_token_id >= self.vocab_size:
            raise ValueError(f"BertConfig: pad_token_id {self.pad_token_id} is not an id below vocab_size "
                             f"{self.vocab_size}")
        if self.position_offset and not (self.pad_token_id < self.position_offset < self.max_position_embeddings):
            raise ValueError(f"BertConfig: position_offset {self.position_offset} must lie above pad_token_id "
                             f"{self.pad_token_id} (the padding tokens' row) and below max_position_embeddings "
                             f"{self.max_position_embeddings}")
        for name in ("activation", "head_activation"):
            value = getattr(self, name)
            if not (value is None and name == "head_activation") and value not in ACTIVATIONS:
                raise ValueError(f"BertConfig: {name} must be one of {', '.join(ACTIVATIONS)}, got {value!r}")
        for name in ("dropout", "attention_dropout", "classifier_dropout"):
            value = getattr(self, name)
            if not (value is None and name != "dropout") and not (_is_number(value) and 0 <= value < 1):
                raise ValueError(f"BertConfig: {name} must be a number in [0, 1), got {value!r}")
        if self.attention_dropout is None:                       # BERT's: the hidden dropout's value
            object.__setattr__(self, "attention_dropout", self.dropout)
        eps = self.layer_norm_eps
        if not (_is_number(eps) and 0 < eps < 1):
            raise ValueError(f"BertConfig: layer_norm_eps must be a number in (0, 1), got {eps!r}")
        if not (_is_number(self.initializer_range) and self.initializer_range >= 0):
            raise ValueError(f"BertConfig: initializer_range must be a number >= 0, got {self.initializer_range!r}")
        if self.flavour not in FLAVOURS:
            raise ValueError(f"BertConfig: flavour must be one of {', '.join(FLAVOURS)}, got {self.flavour!r}")
        names = tuple(self.id2label)
        if names and (len(names) != self.num_labels or not all(isinstance(n, str) and n for n in names)
                      or len(set(names)) != len(names)):
            raise ValueError(f"BertConfig: id2label must name each of the {self.num_labels} labels once (non-empty "
                             f"strings), got {list(names)!r}")
        object.__setattr__(self, "id2label", names)
        object.__setattr__(self, "layer_norm_eps", float(eps))

    @property
    def labels(self):
        """The label names, label i's at index i: ``id2label``, or "LABEL_i" (Hugging Face's defaults)."""
        return self.id2label or tuple(f"LABEL_{i}" for i in range(self.num_labels))

    @property
    def positions(self):
        """The longest input, in tokens: the table's rows, less RoBERTa's offset."""
        return self.max_position_embeddings - self.position_offset

    def replace(self, **changes):
        """A copy with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        """The config as JSON values (``id2label`` a list): what a run keeps of a folder's model in config.json."""
        return dict(dataclasses.asdict(self), id2label=list(self.id2label))

    @classmethod
    def from_dict(cls, values, where="the BERT config"):
        """The config of :meth:`to_dict`'s values; a ValueError naming ``where`` and what does not fit."""
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(values, dict) or sorted(values) != sorted(names):
            got = sorted(values) if isinstance(values, dict) else type(values).__name__
            raise ValueError(f"{where} must hold the fields {names}, got {got}")
        try:
            return cls(**dict(values, id2label=tuple(values["id2label"] or ())))
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where}: {str(error).replace('BertConfig: ', '')}") from None


# --------------------------------------------------------------------------- #
# The embeddings: token + position (+ token type), then LayerNorm and dropout
# --------------------------------------------------------------------------- #
class BertEmbeddings(Module):
    """``y = Dropout(LayerNorm(W_tok[ids] + W_pos[positions] + W_type[token_type_ids]))`` (Hugging Face's
    ``BertEmbeddings``). Parameters: ``word_embeddings`` (V, D), ``position_embeddings`` (P, D),
    ``token_type_embeddings`` (type_vocab_size, D) or None, ``norm``. ids, positions, token_type_ids (B, L) ->
    (B, L, D)."""

    def __init__(self, config):
        c = config
        self.word_embeddings = Embedding(c.vocab_size, c.d_model, scale=False, padding_idx=c.pad_token_id)
        # RoBERTa's position table has a padding row too (the padding tokens' position): no gradient from it
        self.position_embeddings = Embedding(c.max_position_embeddings, c.d_model, scale=False,
                                             padding_idx=c.pad_token_id if c.position_offset else None)
        self.token_type_embeddings = (Embedding(c.type_vocab_size, c.d_model, scale=False)
                                      if c.type_vocab_size else None)
        self.norm = LayerNorm(c.d_model, c.layer_norm_eps)
        self.dropout = Dropout(c.dropout)

    def forward(self, ids, positions, token_type_ids=None):
        x = self.word_embeddings(ids) + self.position_embeddings(positions)    # W_tok[ids] + W_pos[positions]
        if self.token_type_embeddings is not None:
            x += self.token_type_embeddings(token_type_ids)                    # + W_type[segment]
        return self.dropout(self.norm(x))

    def backward(self, dy):
        """dy (B, L, D) -> None (ids have no gradient); adds the three tables' and the LayerNorm's gradients."""
        dx = self.norm.backward(self.dropout.backward(dy))
        # x = W_tok[ids] + W_pos[positions] + W_type[types]  =>  each table gets the same dx at the rows it gave
        if self.token_type_embeddings is not None:
            self.token_type_embeddings.backward(dx)
        self.position_embeddings.backward(dx)
        self.word_embeddings.backward(dx)


class BertPooler(Module):
    """``pooled = tanh(h[:, 0] W + b)``: the [CLS] position's state through a dense layer and tanh (Hugging
    Face's ``BertPooler``). h (B, L, D) -> (B, D)."""

    def __init__(self, d_model):
        self.dense = Linear(d_model, d_model)
        self.activation = Tanh()

    def forward(self, h):
        self.save_for_backward(h.shape)
        return self.activation(self.dense(h[:, 0]))                # tanh(h[:, 0] W + b)  (B, D)

    def backward(self, dpooled):
        """dpooled (B, D) -> dh (B, L, D): zero at every position but the first."""
        (shape,) = self.saved_tensors()
        dh = xp.zeros(shape, dtype=dpooled.dtype)
        # pooled reads h[:, 0] only  =>  dh[:, 0] = the dense layer's input gradient, dh[:, 1:] = 0
        dh[:, 0] = self.dense.backward(self.activation.backward(dpooled))
        return dh


class MaskedLMHead(Module):
    """``logits = LayerNorm(act(h W + b)) E^T + bias``, E the token embedding (Hugging Face's
    ``BertLMPredictionHead``: ``transform`` then the tied ``decoder``). h (B, L, D) -> logits (B, L, V)."""

    def __init__(self, config, embedding_weight):
        self.dense = Linear(config.d_model, config.d_model)
        self.activation = make_activation(config.head_activation or config.activation)
        self.norm = LayerNorm(config.d_model, config.layer_norm_eps)
        self.decoder = OutputProjection(embedding_weight, bias=True)    # tied: the token embedding's own matrix

    def forward(self, h):
        return self.decoder(self.norm(self.activation(self.dense(h))))

    def backward(self, dlogits):
        """dlogits (B, L, V) -> dh (B, L, D); adds the head's gradients (the tied matrix's into the embedding's)."""
        return self.dense.backward(self.activation.backward(self.norm.backward(self.decoder.backward(dlogits))))


# --------------------------------------------------------------------------- #
# The models
# --------------------------------------------------------------------------- #
class BertPreTrainedModel(Module):
    """What the three models share: a :class:`BertConfig`, Hugging Face's initialisation. Their folders go in and
    out through :mod:`minitf.bert.hf` (``from_pretrained(folder, dtype=None, model_class=None)``,
    ``save_pretrained(model, folder, hf_config=None)``), which builds these classes."""
    config = None

    def init_normal(self, std):
        """Every matrix and table ~ N(0, std^2), biases 0, LayerNorm gains 1, the padding rows 0 (Hugging Face's
        ``_init_weights``; nn.Embedding's padding_idx starts at zero)."""
        rng = backend.init_rng()
        for p in self.parameters():
            if p.data.ndim == 2:
                p.data[...] = backend.asarray(rng.normal(0.0, std, p.shape), dtype=p.data.dtype)
        for embedding in (self.base.embeddings.word_embeddings, self.base.embeddings.position_embeddings):
            if embedding.padding_idx is not None:
                embedding.weight.data[embedding.padding_idx] = 0

    @property
    def base(self):
        """The encoder (:class:`BertModel`) of this model: its ``bert``, or itself."""
        return vars(self).get("bert", self)

    @property
    def vocab_size(self):
        return self.config.vocab_size

    @property
    def position_limit(self):
        """The longest input in tokens (max_position_embeddings, less RoBERTa's offset)."""
        return self.config.positions


class BertModel(BertPreTrainedModel):
    """The encoder: ``model(ids, token_type_ids=None, key_padding_mask=None)`` -> the last layer's states (B, L, D).
    Parts: ``embeddings`` (:class:`BertEmbeddings`), ``encoder`` (a post-LN :class:`minitf.transformer.Encoder`),
    ``pooler`` (:class:`BertPooler`, or None with ``add_pooling_layer=False``, DistilBERT's default: it has none;
    call it on the states: ``model.pooler(h)``)."""

    def __init__(self, config, add_pooling_layer=None, init=True):
        if not isinstance(config, BertConfig):
            raise ValueError(f"{type(self).__name__} is built from a BertConfig, got {type(config).__name__}")
        c = self.config = config
        self.embeddings = BertEmbeddings(c)
        self.encoder = Encoder(c.num_layers, c.d_model, c.num_heads, c.d_ff, c.dropout, pre_norm=False,
                               activation=c.activation, layer_norm_eps=c.layer_norm_eps,
                               attention_dropout=c.attention_dropout)
        if add_pooling_layer is None:
            add_pooling_layer = c.flavour != "distilbert"
        self.pooler = BertPooler(c.d_model) if add_pooling_layer else None
        if init:
            self.init_normal(c.initializer_range)

    def inputs(self, ids, token_type_ids=None, key_padding_mask=None):
        """(ids, positions, token_type_ids, key_padding_mask) as device arrays, checked: a one-line ValueError for
        ids out of the vocabulary, a sequence longer than the positions, token types out of range or of another
        shape, a mask of another shape or dtype."""
        c = self.config
        ids = check_ids(ids, "ids", c.vocab_size)
        B, L = ids.shape
        if L > c.positions:
            raise ValueError(f"ids has {L} tokens a row; the model has {c.positions} positions "
                             f"(max_position_embeddings {c.max_position_embeddings}): give at most {c.positions}")
        if token_type_ids is not None:
            if c.type_vocab_size == 0:
                types = backend.to_numpy(token_type_ids) if hasattr(token_type_ids, "shape") else None
                if types is None or types.any():
                    raise ValueError("token_type_ids given, but this model has no token types (DistilBERT's "
                                     "type_vocab_size 0): leave them out (or give zeros)")
            else:
                token_type_ids = check_ids(token_type_ids, "token_type_ids", c.type_vocab_size)
                if token_type_ids.shape != ids.shape:
                    raise ValueError(f"token_type_ids must have the shape of ids {tuple(ids.shape)}, got "
                                     f"{tuple(token_type_ids.shape)}")
        if c.type_vocab_size and token_type_ids is None:
            token_type_ids = xp.zeros((B, L), dtype=xp.int64)                  # one segment
        if c.type_vocab_size == 0:
            token_type_ids = None
        if key_padding_mask is not None:
            if not hasattr(key_padding_mask, "shape") or tuple(key_padding_mask.shape) != (B, L) \
                    or key_padding_mask.dtype != bool:
                got = (f"shape {tuple(key_padding_mask.shape)} of {key_padding_mask.dtype}"
                       if hasattr(key_padding_mask, "shape") else type(key_padding_mask).__name__)
                raise ValueError(f"key_padding_mask must be a bool array of the shape of ids {(B, L)} (True = "
                                 f"padding), got {got}")
            key_padding_mask = backend.asarray(key_padding_mask)
        if c.position_offset:
            # RoBERTa: the real tokens counted from position_offset, padding tokens at row pad_token_id
            real = ids != c.pad_token_id                                        # (B, L)
            positions = xp.where(real, xp.cumsum(real, axis=1) - 1 + c.position_offset, c.pad_token_id)
        else:
            positions = xp.broadcast_to(xp.arange(L), (B, L))                  # (L,) -> (B, L)
        return ids, positions, token_type_ids, key_padding_mask

    def forward(self, ids, token_type_ids=None, key_padding_mask=None):
        """ids (B, L) integer array, token_type_ids (B, L) or None (segment 0), key_padding_mask (B, L) bool or
        None -> the encoder's states (B, L, D)."""
        ids, positions, token_type_ids, key_padding_mask = self.inputs(ids, token_type_ids, key_padding_mask)
        x = self.embeddings(ids, positions, token_type_ids)                    # (B, L, D)
        return self.encoder(x, key_padding_mask)                               # N post-LN layers

    def backward(self, dh):
        """dh (B, L, D) -> fills ``p.grad`` of the embeddings and every layer (accumulating)."""
        self.embeddings.backward(self.encoder.backward(dh))


class BertForMaskedLM(BertPreTrainedModel):
    """``model(ids, token_type_ids=None, key_padding_mask=None)`` -> logits (B, L, V) at every position (the
    masked-LM loss reads the masked positions only: ``LabelSmoothedCrossEntropy(0.0, ignore_index=-1)`` with -1
    at every other position). ``scored`` (B, L) bool, True where the loss reads: the head runs at those N
    positions only, logits (1, N, V) in row-major order (the loss's targets: ``targets[scored][None]``); the same
    loss and gradients for about 15% of the head's work (transformers' BertForMaskedLM has no such argument: it
    computes every position). Parts: ``bert`` (a :class:`BertModel` without pooler), ``lm_head``
    (:class:`MaskedLMHead`, its decoder the token embedding's matrix)."""

    def __init__(self, config, init=True):
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False, init=False)
        self.lm_head = MaskedLMHead(config, self.bert.embeddings.word_embeddings.weight)
        if init:
            self.init_normal(config.initializer_range)

    def forward(self, ids, token_type_ids=None, key_padding_mask=None, scored=None):
        h = self.bert(ids, token_type_ids, key_padding_mask)                   # (B, L, D)
        if scored is None:
            self.save_for_backward(None, h.shape)
            return self.lm_head(h)                                             # (B, L, V)
        B, L, D = h.shape
        if tuple(scored.shape) != (B, L):
            self.clear_saved()                                                 # the encoder's caches: no backward
            raise ValueError(f"scored must be (B, L) = {(B, L)} like ids, got {tuple(scored.shape)}")
        rows = xp.flatnonzero(backend.asarray(scored).reshape(-1))             # (N,) the scored positions
        self.save_for_backward(rows, h.shape)
        return self.lm_head(h.reshape(B * L, D)[rows][None])                   # (1, N, D) -> (1, N, V)

    def backward(self, dlogits):
        """dlogits (B, L, V), or (1, N, V) after ``scored`` -> fills ``p.grad`` of every parameter (the tied matrix
        gets both uses)."""
        rows, (B, L, D) = self.saved_tensors()
        dh = self.lm_head.backward(dlogits)                                    # (B, L, D) or (1, N, D)
        if rows is not None:
            # h_scored = h.reshape(B * L, D)[rows]  =>  dh is dh_scored at those rows, 0 at every other position:
            # no loss reads them, so their head would only have computed zeros (docs/bert.md)
            dh_all = xp.zeros((B * L, D), dtype=dh.dtype)
            dh_all[rows] = dh[0]
            dh = dh_all.reshape(B, L, D)                                       # (B * L, D) -> (B, L, D)
        self.bert.backward(dh)


class BertForSequenceClassification(BertPreTrainedModel):
    """``model(ids, token_type_ids=None, key_padding_mask=None)`` -> logits (B, C) of the [CLS] position:
    ``classifier(Dropout(pooler(h)))``. Parts: ``bert`` (a :class:`BertModel` with its pooler), ``dropout``,
    ``classifier`` (D -> num_labels). RoBERTa's head (dense, tanh, out_proj on ``<s>``) is the same computation:
    its ``dense`` is the pooler's, its ``out_proj`` the classifier."""

    def __init__(self, config, init=True):
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=True, init=False)
        self.dropout = Dropout(config.dropout if config.classifier_dropout is None else config.classifier_dropout)
        self.classifier = Linear(config.d_model, config.num_labels)
        if init:
            self.init_normal(config.initializer_range)

    def forward(self, ids, token_type_ids=None, key_padding_mask=None):
        h = self.bert(ids, token_type_ids, key_padding_mask)                   # (B, L, D)
        return self.classifier(self.dropout(self.bert.pooler(h)))              # (B, C)

    def backward(self, dlogits):
        """dlogits (B, C) -> fills ``p.grad`` of every parameter."""
        dpooled = self.dropout.backward(self.classifier.backward(dlogits))
        self.bert.backward(self.bert.pooler.backward(dpooled))
