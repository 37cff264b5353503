"""Small local models and corpora for tests: as a volunteer with a downloaded model has them, no network."""

from __future__ import annotations

from pathlib import Path


def save_small_llama(directory: Path, hidden_size: int = 128, intermediate_size: int = 344, layers: int = 2, heads: int = 4) -> None:
    """A small pretrained-looking Llama (~0.3 M parameters by default) with its own byte-level BPE tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(["def main():\n    return 0\n", "import os\nprint(os.getcwd())\n", "class A:\n    pass\n"], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>", unk_token="<unk>")
    tokenizer.save_pretrained(directory)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=256, eos_token_id=1)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)


def save_small_corpus(path: Path) -> None:
    """About 400 KB of Python source: tokenizing it with a BPE tokenizer takes seconds, not the minutes the stdlib takes."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join((stdlib / name).read_text() for name in ("argparse.py", "ast.py", "dataclasses.py", "enum.py"))
    path.write_text(text[:400_000])
