"""What a run asks of its model's shape, the same for every family, and each family's answer with its own checks:
the run core calls its family's resolver (:attr:`.families.ModelFamily.resolve_shape`) without asking which family
it is."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserInputError
from .bert_config import BertConfig, resolve_bert_config
from .modernbert_config import ModernBertConfig, is_modernbert_folder, resolve_modernbert_config, vocab_token_ids


@dataclass(frozen=True)
class ShapeRequest:
    """The settings and the vocab a shape is resolved from (no path of the run core's types: models/ is below it)."""

    model_size: str = ""
    config_file: str = ""  # the bert_config_file setting: a bert_config.json, or a transformers config.json
    init_checkpoint: str = ""
    vocab_tokens: tuple[str, ...] | list[str] | None = None  # None: no vocab read (its size may still be known)
    vocab_size: int | None = None  # the vocab's, else the data's
    tokenizer_json: bool = False  # the vocab is a tokenizer.json (else a WordPiece vocab.txt)
    vocab_setting: str = ""  # the vocab_file as given, and the file read from it: in messages
    vocab_source: str = ""
    vocab_to_come: bool = False  # planned before the vocab is made: vocab_tokens are the special tokens it starts with
    max_position_embeddings: int = 0  # 0: the family's own
    dropout: float = -1.0  # < 0: the shape's own
    activation: str = "gelu"  # a BERT's built from model_size (one from a file keeps its own)


def bert_shape(request: ShapeRequest) -> BertConfig:
    """A BERT's shape; a ModernBERT's config or a tokenizer.json is refused with the flag that trains it."""
    for setting, value in (("init_checkpoint", request.init_checkpoint), ("bert_config_file", request.config_file)):
        if is_modernbert_folder(value):
            raise UserInputError(f"{setting} {value} describes a ModernBERT (model_type modernbert): train it with "
                                 "--model_family modernbert.")
    if request.tokenizer_json:
        raise UserInputError(f"vocab_file {request.vocab_setting} is a tokenizer.json, which only --model_family "
                             "modernbert trains with; BERT takes a WordPiece vocab.txt (make one with "
                             "`tpu-pretrain vocab`).")
    return resolve_bert_config(model_size=request.model_size, bert_config_file=request.config_file,
                               init_checkpoint=request.init_checkpoint, vocab_size=request.vocab_size,
                               max_position_embeddings=request.max_position_embeddings,
                               hidden_dropout_prob=request.dropout, hidden_act=request.activation)


def modernbert_shape(request: ShapeRequest) -> ModernBertConfig:
    """A ModernBERT's shape: its special tokens' ids are the vocab's, so it needs the vocab (or, planned before it
    is made, the special tokens it will start with), whose [PAD] must be the data's padding, id 0."""
    tokens, padded = request.vocab_tokens, request.tokenizer_json
    if tokens is None and not request.vocab_to_come:
        raise UserInputError("model_family=modernbert needs the vocab (its special tokens' ids): set vocab_file.")
    ids = vocab_token_ids(list(tokens)) if tokens else None
    if ids and ids["pad_token_id"] != 0 and not padded:  # a tokenizer.json's data: padding is the rows' zero tail
        raise UserInputError(f"{request.vocab_source} has [PAD] at id {ids['pad_token_id']}, but the data pads with "
                             "id 0: ModernBERT reads padding from the token ids, so [PAD] must be the vocab's first "
                             "token.")
    return resolve_modernbert_config(
        model_size=request.model_size, config_file=request.config_file, init_checkpoint=request.init_checkpoint,
        vocab_size=request.vocab_size, token_ids=ids, max_position_embeddings=request.max_position_embeddings,
        dropout=request.dropout, padded_vocab=padded)
