"""A small byte-level BPE ``tokenizer.json`` laid out as a released ModernBERT's: other special tokens first (id 0 is
not [PAD]), the learnt vocab, then [UNK] [CLS] [SEP] [PAD] [MASK] at the end ([MASK] absorbing the space before it),
and a post-processor adding [CLS] ... [SEP]. Trained with ``tokenizers`` on real text, nothing downloaded."""

from __future__ import annotations

from pathlib import Path

MODERNBERT_SPECIALS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")  # in ModernBERT's order (50280-50284)


def train_bpe_tokenizer(path: Path, corpus: Path, vocab_size: int = 2000, max_lines: int = 4000) -> Path:
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["|||IP_ADDRESS|||", "<|padding|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    lines = [line for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()][:max_lines]
    tokenizer.train_from_iterator(lines, trainer)
    tokenizer.add_special_tokens([AddedToken(t, lstrip=t == "[MASK]", normalized=False, special=True)
                                  for t in MODERNBERT_SPECIALS])
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path
