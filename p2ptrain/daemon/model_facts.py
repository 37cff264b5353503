"""Model facts: the shape of a causal LM, enough to size a training plan.

The plan needs parameter counts and the dimensions that set activation memory,
not the weights. They come from a built-in table of well-known models (so
planning works offline and in the supervisor, which never imports torch), or
from the model's ``config.json``: in a local directory, or in the local Hugging
Face cache for a hub id. ``config.json`` is read as JSON rather than through
``transformers.AutoConfig``, because importing transformers imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

# LoRA targets when a manifest names none: the attention projections (as in
# p2ptrain.peers.model.models.DEFAULT_LORA_TARGETS for Llama-like models).
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


class ModelFactsError(ValueError):
    """A model whose shape cannot be found; the message says how to fix it."""


@dataclass(frozen=True)
class ModelFacts:
    """The shape of a decoder-only transformer (Llama-style names).

    `name`: what the user called it. `hub_id`: its Hugging Face id, if known.
    `vocab_size`, `hidden_size`, `intermediate_size` (MLP width),
    `num_layers`, `num_attention_heads`, `num_key_value_heads` (grouped-query
    attention), `head_dim`: as in the model's config. `tie_word_embeddings`:
    the output layer shares the input embedding. `gated_mlp`: SwiGLU/GeGLU (3
    matrices) rather than a 2-matrix MLP. `attention`: the attention kernel,
    ``sdpa`` (PyTorch's fused kernels, transformers' default) or ``eager``
    (keeps the attention probabilities: more memory). `lora`: the run's LoRA
    settings, or None for full training of every weight.
    """

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    gated_mlp: bool = True
    attention: str = "sdpa"
    hub_id: str | None = None
    lora: dict | None = field(default=None, compare=False)

    @property
    def embedding_parameters(self) -> int:
        """Input embedding plus output layer: bitsandbytes keeps these in 16-bit when it quantizes."""
        matrices = 1 if self.tie_word_embeddings else 2
        return matrices * self.vocab_size * self.hidden_size

    @property
    def linear_parameters(self) -> int:
        """Weights of one transformer block's linear layers (attention and MLP): what quantization shrinks."""
        query_width = self.num_attention_heads * self.head_dim
        key_value_width = self.num_key_value_heads * self.head_dim
        attention = self.hidden_size * (2 * query_width + 2 * key_value_width)
        mlp = (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        return attention + mlp

    @property
    def layer_parameters(self) -> int:
        """Weights of one transformer block (its linear layers and two norms)."""
        return self.linear_parameters + 2 * self.hidden_size

    @property
    def parameters(self) -> int:
        """All parameters of the model."""
        return self.embedding_parameters + self.num_layers * self.layer_parameters + self.hidden_size

    @property
    def trainable_parameters(self) -> int:
        """Parameters that get gradients and optimizer state: LoRA adapters, or every weight without LoRA."""
        if self.lora is None:
            return self.parameters
        rank = int(self.lora.get("r", 8))
        targets = self.lora.get("target_modules") or DEFAULT_LORA_TARGETS
        shapes = self._linear_shapes()
        # An adapter on an input x output matrix is two matrices: input x r and r x output.
        per_layer = sum(rank * sum(shapes.get(target, (self.hidden_size, self.hidden_size))) for target in targets)
        return self.num_layers * per_layer

    def _linear_shapes(self) -> dict[str, tuple[int, int]]:
        query_width = self.num_attention_heads * self.head_dim
        key_value_width = self.num_key_value_heads * self.head_dim
        return {
            "q_proj": (self.hidden_size, query_width),
            "k_proj": (self.hidden_size, key_value_width),
            "v_proj": (self.hidden_size, key_value_width),
            "o_proj": (query_width, self.hidden_size),
            "gate_proj": (self.hidden_size, self.intermediate_size),
            "up_proj": (self.hidden_size, self.intermediate_size),
            "down_proj": (self.intermediate_size, self.hidden_size),
        }

    @property
    def can_quantize(self) -> bool:
        """Quantized weights can only be trained through LoRA adapters (QLoRA)."""
        return self.lora is not None


def _llama(name: str, hub_id: str | None, vocab: int, hidden: int, intermediate: int, layers: int, heads: int,
           kv_heads: int | None = None, head_dim: int | None = None, tied: bool = False) -> ModelFacts:
    return ModelFacts(
        name=name, hub_id=hub_id, vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
        head_dim=head_dim or hidden // heads, tie_word_embeddings=tied,
    )


# Shapes copied from each model's config.json on the Hugging Face hub; the tiny
# preset's from p2ptrain.peers.model.models.tiny_config (byte vocabulary of 259).
_OPEN_LLAMA_7B = dict(vocab=32000, hidden=4096, intermediate=11008, layers=32, heads=32)
_BUILT_IN = [
    _llama("tiny", None, vocab=259, hidden=128, intermediate=344, layers=4, heads=4, tied=True),
    _llama("tinyllama-1.1b", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", vocab=32000, hidden=2048, intermediate=5632,
           layers=22, heads=32, kv_heads=4),
    _llama("gemma-2b", "google/gemma-2b", vocab=256000, hidden=2048, intermediate=16384, layers=18, heads=8,
           kv_heads=1, head_dim=256, tied=True),
    _llama("open-llama-3b", "openlm-research/open_llama_3b", vocab=32000, hidden=3200, intermediate=8640,
           layers=26, heads=32),
    _llama("open-llama-7b", "openlm-research/open_llama_7b", **_OPEN_LLAMA_7B),
    _llama("open-llama-13b", "openlm-research/open_llama_13b", vocab=32000, hidden=5120, intermediate=13824,
           layers=40, heads=40),
    _llama("llama-2-7b", "meta-llama/Llama-2-7b-hf", **_OPEN_LLAMA_7B),
    _llama("llama-2-13b", "meta-llama/Llama-2-13b-hf", vocab=32000, hidden=5120, intermediate=13824,
           layers=40, heads=40),
]
# Other hub ids of the same shapes.
_ALIASES = {
    "TinyLlama/TinyLlama_v1.1": "tinyllama-1.1b",
    "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T": "tinyllama-1.1b",
    "google/gemma-2b-it": "gemma-2b",
    "openlm-research/open_llama_3b_v2": "open-llama-3b",
    "openlm-research/open_llama_7b_v2": "open-llama-7b",
    "meta-llama/Llama-2-7b-chat-hf": "llama-2-7b",
    "meta-llama/Llama-2-13b-chat-hf": "llama-2-13b",
}
_BY_KEY = {facts.name.lower(): facts for facts in _BUILT_IN}
_BY_KEY.update({facts.hub_id.lower(): facts for facts in _BUILT_IN if facts.hub_id})
_BY_KEY.update({alias.lower(): _BY_KEY[target] for alias, target in _ALIASES.items()})


def built_in_models() -> list[str]:
    """Short names of the models whose facts are built in."""
    return [facts.name for facts in _BUILT_IN]


def model_facts(model: str, lora: dict | None = None) -> ModelFacts:
    """The shape of `model`, with the run's LoRA settings attached.

    Args:
        model: a built-in short name (``gemma-2b``), a hub id
            (``google/gemma-2b``), or a local directory with ``config.json``.
        lora: the manifest's ``lora`` dict (``r``, ``target_modules``...), or
            None for full training.

    Raises:
        ModelFactsError: the model is not built in, not a local directory, and
            its ``config.json`` is not in the local Hugging Face cache.
    """
    known = _BY_KEY.get(model.lower())
    if known is not None:
        return replace(known, name=model, lora=lora)
    directory = Path(model).expanduser()
    if (directory / "config.json").is_file():
        return facts_from_config(model, _read_config(directory / "config.json"), lora)
    cached = _cached_hub_config(model)
    if cached is not None:
        return facts_from_config(model, _read_config(cached), lora, hub_id=model)
    raise ModelFactsError(
        f"unknown model {model!r}: not built in ({', '.join(built_in_models())}), not a directory with "
        f"config.json, and not in the local Hugging Face cache; use one of those, or download its config once "
        f"with `huggingface-cli download {model} config.json`"
    )


def _read_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ModelFactsError(f"cannot read {path} ({error}); give a model directory with a valid config.json")
    if not isinstance(config, dict):
        raise ModelFactsError(f"{path} is not a JSON object; give a model directory with a valid config.json")
    return config


def _cached_hub_config(model: str) -> Path | None:
    if model.count("/") != 1 or model.startswith((".", "/", "~")):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a valid repo id
        return None
    return Path(found) if isinstance(found, str) else None


def _first(config: dict, *keys: str):
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


def facts_from_config(name: str, config: dict, lora: dict | None = None, hub_id: str | None = None) -> ModelFacts:
    """Facts from a transformers ``config.json`` dict (Llama names, with GPT-2/OPT-style aliases)."""
    config = {**config, **(config.get("text_config") or {})}
    hidden = _first(config, "hidden_size", "n_embd", "d_model")
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _first(config, "num_attention_heads", "n_head")
    vocab = config.get("vocab_size")
    if not all(isinstance(value, int) and value > 0 for value in (hidden, layers, heads, vocab)):
        raise ModelFactsError(
            f"the config of {name!r} lacks hidden_size, num_hidden_layers, num_attention_heads or vocab_size; "
            f"give a decoder-only causal LM"
        )
    model_type = str(config.get("model_type", ""))
    gated = model_type not in ("gpt2", "gpt_neox", "opt", "gptj", "bloom", "falcon", "phi")
    return ModelFacts(
        name=name,
        hub_id=hub_id,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_first(config, "intermediate_size", "n_inner", "ffn_dim") or 4 * hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=_first(config, "num_key_value_heads", "num_kv_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", model_type in ("gpt2", "gemma", "opt"))),
        gated_mlp=gated,
        attention="eager" if _first(config, "attn_implementation", "_attn_implementation") == "eager" else "sdpa",
        lora=lora,
    )
