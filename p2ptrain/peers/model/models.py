"""Models: the built-in `tiny` preset and pretrained causal LMs with LoRA / QLoRA.

`build_model` returns a `LoadedModel`: the torch module, its tokenizer, and the
one definition of "the trainable state" that the worker averages with other
peers and writes to checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from p2ptrain.peers.model.tokenizers import (
    TINY_PRESET,
    ByteTokenizer,
    ModelUnavailable,
    Tokenizer,
    build_tokenizer,
    first_line,
)

__all__ = [
    "TINY_PRESET",
    "LoadedModel",
    "ModelUnavailable",
    "build_model",
    "causal_lm_loss",
    "tiny_config",
]

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
QUANTIZATIONS = ("none", "int8", "nf4")
# LoRA targets per architecture when the manifest leaves `target_modules` empty:
# the attention projections, the usual choice for fine-tuning a causal LM.
DEFAULT_LORA_TARGETS = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "mistral": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "gemma": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "phi3": ["qkv_proj", "o_proj"],
    "gpt2": ["c_attn", "c_proj"],
    "gpt_neox": ["query_key_value", "dense"],
    "opt": ["q_proj", "k_proj", "v_proj", "out_proj"],
}


@dataclass
class LoadedModel:
    """A model ready to train.

    `model`: a transformers causal LM (LlamaForCausalLM for the tiny preset),
    wrapped by peft when LoRA is used. `tokenizer`: the matching tokenizer.
    `parameters`: all parameters; `trainable_parameters`: those that are trained,
    averaged with other peers and checkpointed (the LoRA adapters under LoRA).
    """

    model: torch.nn.Module
    tokenizer: Tokenizer
    parameters: int
    trainable_parameters: int
    name: str = TINY_PRESET
    precision: str = "fp32"
    quantization: str = "none"
    device: str = "cpu"
    _names: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._names = [name for name, parameter in self.model.named_parameters() if parameter.requires_grad]

    def trainable(self) -> list[torch.nn.Parameter]:
        """The trainable parameters in a stable order (the model's own registration order).

        Tied weights appear once. Every peer of a run gets the same list, so the
        averager can match tensors by position.
        """
        parameters = dict(self.model.named_parameters())
        return [parameters[name] for name in self._names]

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Copies of the trainable parameters on the CPU, by name: what a checkpoint stores.

        Copies, so that saving in the background cannot see a half-applied step.
        """
        return {name: parameter.detach().to("cpu", copy=True)
                for name, parameter in zip(self._names, self.trainable())}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a `trainable_state()` (from a checkpoint or a peer) into the model.

        Checks everything before changing anything: raises ValueError naming the
        missing, unexpected, misshapen or non-finite tensors.
        """
        expected = dict(zip(self._names, self.trainable()))
        missing = [name for name in expected if name not in state]
        unexpected = [name for name in state if name not in expected]
        if missing or unexpected:
            raise ValueError(
                f"trainable state does not match the model: missing {shorten(missing)}, unexpected "
                f"{shorten(unexpected)}; it was saved from another model or LoRA setting, use a matching one"
            )
        misshapen = [f"{name} {tuple(state[name].shape)} != {tuple(parameter.shape)}"
                     for name, parameter in expected.items() if state[name].shape != parameter.shape]
        if misshapen:
            raise ValueError(f"trainable state has wrong shapes: {shorten(misshapen)}; "
                             f"it was saved from another model configuration")
        not_finite = [name for name in expected if not torch.isfinite(state[name]).all()]
        if not_finite:
            raise ValueError(f"trainable state has NaN or infinite values in {shorten(not_finite)}; "
                             f"discard it and load an earlier checkpoint")
        with torch.no_grad():
            for name, parameter in expected.items():
                parameter.copy_(state[name].to(device=parameter.device, dtype=parameter.dtype))


def shorten(items: list[str], limit: int = 3) -> str:
    """At most `limit` items of a list, for one-line errors."""
    if not items:
        return "none"
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def tiny_config():
    """The Llama configuration of the tiny preset: ~0.82 M parameters, byte vocabulary.

    Small enough to train at a usable speed on a laptop CPU; built in code, so it
    needs no download.
    """
    from transformers import LlamaConfig

    tokenizer = ByteTokenizer()
    return LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=False,
    )


def build_model(model: str, lora: dict | None = None, precision: str = "fp32", quantization: str = "none",
                device: str = "cpu", seed: int = 0, gradient_checkpointing: bool = False) -> LoadedModel:
    """Build the model of a run.

    `model`: "tiny" (the built-in preset, trained from scratch), or a hub id or
    local directory of a pretrained causal LM. `lora`: `{"r", "alpha", "dropout",
    "target_modules"}` to train only LoRA adapters, or None to train every weight.
    `precision`: "fp32", "bf16" or "fp16" for the weights. `quantization`: "none",
    "int8" or "nf4" (QLoRA through bitsandbytes; needs a CUDA GPU and a pretrained
    model). `device`: a torch device string. `seed`: the run's seed; the tiny
    preset's weights and LoRA's initial adapters are drawn from it, so every
    peer of a run starts from the same weights. `gradient_checkpointing`: keep
    only each layer's input and recompute its activations in the backward pass
    (the plan turns it on where it buys a larger micro-batch or lets the model fit).

    Raises ValueError for bad arguments and ModelUnavailable when the model or
    its tokenizer cannot be loaded here.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; use one of {', '.join(QUANTIZATIONS)}")
    if quantization != "none" and not str(device).startswith("cuda"):
        raise ValueError(f"quantization {quantization!r} needs a CUDA GPU; use quantization 'none' on {device}")
    if quantization != "none" and model == TINY_PRESET:
        raise ValueError(f"the {TINY_PRESET!r} preset is trained from scratch and cannot be quantized; "
                         f"use quantization 'none'")
    if quantization != "none" and lora is None:
        raise ValueError(f"quantized weights cannot be trained directly; give a lora setting to train "
                         f"{quantization} adapters (QLoRA) or use quantization 'none'")
    if model != TINY_PRESET and model.startswith(("/", "./", "../", "~")):
        model = str(Path(model).expanduser())
        if not Path(model).is_dir():
            raise ModelUnavailable(f"model directory {model!r} does not exist; give a directory saved with "
                                   f"save_pretrained, a hub id, or the {TINY_PRESET!r} preset")
    tokenizer = build_tokenizer(model)
    with torch.random.fork_rng(devices=[]):
        # A private RNG: the same seed gives the same weights, whatever ran before.
        torch.manual_seed(seed)
        if model == TINY_PRESET:
            from transformers import LlamaForCausalLM

            network = LlamaForCausalLM(tiny_config()).to(device=device, dtype=PRECISIONS[precision])
        else:
            network = load_pretrained(model, precision, quantization, device)
        embeddings = network.get_input_embeddings().num_embeddings
        if tokenizer.vocab_size > embeddings:
            raise ModelUnavailable(f"the tokenizer of {model!r} has {tokenizer.vocab_size} tokens but the model "
                                   f"only {embeddings} embeddings; use the tokenizer saved with the model")
        if lora is not None:
            network = add_lora(network, lora, quantization, gradient_checkpointing)
        elif gradient_checkpointing:
            network.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    network.train()
    return LoadedModel(
        model=network,
        tokenizer=tokenizer,
        parameters=sum(p.numel() for p in network.parameters()),
        trainable_parameters=sum(p.numel() for p in network.parameters() if p.requires_grad),
        name=model,
        precision=precision,
        quantization=quantization,
        device=str(device),
    )


def load_pretrained(model: str, precision: str, quantization: str, device: str) -> torch.nn.Module:
    """`AutoModelForCausalLM.from_pretrained`, with bitsandbytes quantization when asked."""
    from transformers import AutoModelForCausalLM

    options: dict = {"dtype": PRECISIONS[precision]}
    if quantization != "none":
        from transformers import BitsAndBytesConfig

        if quantization == "nf4":
            options["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=PRECISIONS[precision],
                bnb_4bit_use_double_quant=True,
            )
        else:
            options["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        options["device_map"] = {"": device}
    try:
        network = AutoModelForCausalLM.from_pretrained(model, **options)
    except (OSError, ValueError) as error:
        raise ModelUnavailable(
            f"cannot load model {model!r} ({first_line(error)}); use the {TINY_PRESET!r} preset or a local "
            f"directory with config.json and weights"
        ) from error
    if quantization == "none":
        network = network.to(device)
    network.config.use_cache = False  # the key/value cache only helps generation, and costs memory in training
    return network


def add_lora(network: torch.nn.Module, lora: dict, quantization: str, gradient_checkpointing: bool = False) -> torch.nn.Module:
    """Wrap `network` with LoRA adapters (peft); only the adapters stay trainable.

    A quantized model is prepared as QLoRA prescribes (peft's
    `prepare_model_for_kbit_training`: embeddings, output layer and norms in
    fp32, gradient checkpointing on: the plan never quantizes without it); an int8
    model's quantized layers are fed the fp16 inputs bitsandbytes computes in
    (`feed_int8_layers_fp16`).
    """
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    unknown = set(lora) - {"r", "alpha", "dropout", "target_modules"}
    if unknown:
        raise ValueError(f"unknown lora settings {sorted(unknown)}; use r, alpha, dropout, target_modules")
    model_type = getattr(network.config, "model_type", "")
    targets = lora.get("target_modules") or DEFAULT_LORA_TARGETS.get(model_type)
    checkpointing = {"gradient_checkpointing_kwargs": {"use_reentrant": False}}
    if quantization != "none":
        network = prepare_model_for_kbit_training(network, use_gradient_checkpointing=True, **checkpointing)
        if quantization == "int8":
            feed_int8_layers_fp16(network)
    elif gradient_checkpointing:
        network.gradient_checkpointing_enable(**checkpointing)
    config = LoraConfig(
        r=int(lora.get("r", 8)),
        lora_alpha=float(lora.get("alpha", 16)),
        lora_dropout=float(lora.get("dropout", 0.0)),
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(network, config)
    except ValueError as error:
        raise ValueError(f"cannot add LoRA to a {model_type or 'this'} model ({first_line(error)}); "
                         f"set lora.target_modules to names of its linear layers") from error


def feed_int8_layers_fp16(network: torch.nn.Module) -> None:
    """Give each bitsandbytes int8 layer its input in fp16, the dtype it computes in, and its
    output back in the input's dtype.

    QLoRA's preparation keeps the residual stream in fp32, and bitsandbytes
    casts every other dtype to fp16 itself, logging a warning on each call
    (7,392 lines in a minute on an H100). The casts here are the ones it makes,
    silent; the layer keeps its input for the backward pass in fp16, half the bytes.
    """
    import bitsandbytes as bnb

    def to_fp16(module, inputs):
        module._p2ptrain_input_dtype = inputs[0].dtype
        return (inputs[0].to(torch.float16), *inputs[1:])

    def to_input_dtype(module, inputs, output):
        return output.to(module._p2ptrain_input_dtype)

    for module in network.modules():
        if isinstance(module, bnb.nn.Linear8bitLt):
            module.register_forward_pre_hook(to_fp16)
            module.register_forward_hook(to_input_dtype)


def causal_lm_loss(model: torch.nn.Module, batch: torch.LongTensor) -> torch.Tensor:
    """Mean next-token cross entropy of `batch` (`[batch, seq_len]` token ids), labels = inputs.

    The batch is moved to the model's device. The model shifts the labels itself,
    so a window of `seq_len` tokens gives `seq_len - 1` predictions.
    """
    device = next(model.parameters()).device
    batch = batch.to(device)
    return model(input_ids=batch, labels=batch).loss


@torch.no_grad()
def mean_loss(model: torch.nn.Module, batches: Iterable[torch.LongTensor]) -> float:
    """Mean of :func:`causal_lm_loss` over ``batches`` (validation windows), in eval mode."""
    model.eval()
    try:
        losses = [causal_lm_loss(model, batch).item() for batch in batches]
    finally:
        model.train()
    return sum(losses) / len(losses)
