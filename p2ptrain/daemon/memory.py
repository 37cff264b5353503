"""How much memory training a causal LM takes: the arithmetic behind the plan.

An estimate is a sum of parts a user can check:

- the weights: 16-bit or 32-bit, or bitsandbytes int8 / nf4 for the linear
  layers of a quantized (QLoRA) model, whose embeddings, output layer and norms
  peft's ``prepare_model_for_kbit_training`` keeps in fp32;
- the training state of the trainable parameters: the weights themselves (peft
  keeps LoRA adapters in fp32), gradient, Adam's two moments, the averager's copy;
- the activations kept for the backward pass, per sample: every layer's
  (scaled with the activations' dtype: a quantized model's residual stream is
  fp32), or with gradient checkpointing only each layer's input plus one layer
  recomputed at a time; with eager attention the attention probabilities too
  (SDPA kernels do not keep them); and the logits, their fp32 copy for the loss
  and its gradient;
- a workspace the allocator holds besides (cuBLAS, fragmentation at small sizes);
- the CUDA context (or the Python runtime on the CPU), which the allocator
  does not see.

The coefficients were fitted to what an H100 measured on Llama shapes of 1.1B
and 6.7B parameters (LoRA r 16, seq_len 512, bf16, nf4 and int8, micro-batches
1 to 32; ``tests/fixtures/gpu_h100_2026-11-26.jsonl``): on every measured row
the allocator's part of the estimate is at least the peak the caching allocator
reserved and at most 1.4x the peak it allocated (``tests/unit/test_memory_model.py``).
The worker then confirms the plan with real passes (``peers/worker/calibration.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from p2ptrain.daemon.model_facts import ModelFacts

GIB = 1024**3
MIB = 1024**2
BYTES_PER_WEIGHT = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}
# The linear layers of a quantized model, measured: int8 codes plus per-row scales; nf4 codes,
# double-quantized block constants and bitsandbytes' buffers (0.53 on the 6.7B shape, 0.61 on the 1.1B).
BYTES_PER_QUANTIZED_WEIGHT = {"int8": 1.10, "nf4": 0.61}
# A trainable parameter: its gradient, Adam's two moments and the averager's copy (fp32); a LoRA
# adapter's fp32 weight besides (a fully trained weight is counted with the weights).
TRAINING_STATE_BYTES = 16
ADAPTER_WEIGHT_BYTES = 4
# Activations kept per token and layer, in bytes at a 16-bit activation dtype: this many per hidden
# unit (norm inputs in fp32, Q/K/V, attention output, LoRA inputs) and per MLP unit (the gated
# MLP's gate, activation and up projection); fitted to the measured peaks.
ACTIVATION_BYTES_PER_HIDDEN = 34
ACTIVATION_BYTES_PER_MLP = 6
# With gradient checkpointing a layer keeps only its input: per hidden unit, at a 16-bit dtype.
CHECKPOINT_BYTES_PER_HIDDEN = 3
# Eager attention keeps the softmax output in fp32 and its copy in the activation dtype.
EAGER_ATTENTION_BYTES = 4
# Logits per token and vocabulary entry: 16-bit logits, their fp32 copy for the loss, the loss's
# output and the gradients of both; a quantized model's output layer is fp32 and needs fewer copies.
LOGIT_BYTES = {16: 20, 32: 10}
WORKSPACE_BYTES = {"cuda": int(0.1 * GIB), "cpu": 0}
# Outside the allocator: the CUDA context with its kernels, or the Python runtime with torch.
CONTEXT_BYTES = {"cuda": int(0.5 * GIB), "cpu": int(0.5 * GIB)}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes that training needs, by part.

    `allocated(micro_batch)` is what the framework's allocator holds at its
    peak for that many samples at once; `total(micro_batch)` adds the context
    the allocator does not see, and is what must fit the device.
    """

    weights: int
    training_state: int
    per_sample: int
    workspace: int
    context: int

    def allocated(self, micro_batch: int) -> int:
        return self.weights + self.training_state + self.workspace + micro_batch * self.per_sample

    def total(self, micro_batch: int) -> int:
        return self.allocated(micro_batch) + self.context

    def samples_that_fit(self, allowed: int) -> int:
        """The most samples per micro-batch whose total stays within `allowed` bytes (0: not even one)."""
        room = allowed - self.total(0)
        return max(0, room // self.per_sample)


def weight_bytes(facts: ModelFacts, precision: str, quantization: str = "none") -> int:
    """Bytes of the model's weights; a quantized model keeps embeddings, output layer and norms in fp32."""
    if quantization == "none":
        return int(facts.parameters * BYTES_PER_WEIGHT[precision])
    quantized = facts.num_layers * facts.linear_parameters
    return int((facts.parameters - quantized) * 4 + quantized * BYTES_PER_QUANTIZED_WEIGHT[quantization])


def activation_bytes_per_sample(facts: ModelFacts, activation_bytes: int, seq_len: int,
                                gradient_checkpointing: bool = False) -> int:
    """Bytes of activations kept for the backward pass for one sequence of `seq_len` tokens.

    Args:
        facts: the model's shape (its `attention` implementation included).
        activation_bytes: 2 for 16-bit activations, 4 for fp32 (the CPU, or a quantized model's residual stream).
        seq_len: tokens per sample.
        gradient_checkpointing: keep only each layer's input and recompute one layer at a time.
    """
    scale = activation_bytes / 2
    layer = (ACTIVATION_BYTES_PER_HIDDEN * facts.hidden_size + ACTIVATION_BYTES_PER_MLP * facts.intermediate_size) * scale
    if facts.attention == "eager":
        layer += (EAGER_ATTENTION_BYTES + activation_bytes) * facts.num_attention_heads * seq_len
    if gradient_checkpointing:
        per_token = facts.num_layers * CHECKPOINT_BYTES_PER_HIDDEN * facts.hidden_size * scale + layer
    else:
        per_token = facts.num_layers * layer
    logits = LOGIT_BYTES[8 * activation_bytes] * facts.vocab_size
    return int(seq_len * (per_token + logits))


def estimate_memory(facts: ModelFacts, precision: str, quantization: str, seq_len: int, device_kind: str = "cuda",
                    gradient_checkpointing: bool = False) -> MemoryEstimate:
    """The memory that training `facts` takes on a `device_kind` ("cuda" or "cpu") device.

    Args:
        facts: the model's shape and LoRA settings.
        precision: "fp32", "bf16" or "fp16": the dtype of weights and activations.
        quantization: "none", "int8" or "nf4" (bitsandbytes, QLoRA: fp32 activations between layers).
        seq_len: tokens per sample.
        device_kind: selects the workspace and the context outside the allocator.
        gradient_checkpointing: recompute activations in the backward pass instead of keeping them.
    """
    activation_bytes = 4 if quantization != "none" else int(BYTES_PER_WEIGHT[precision])
    return MemoryEstimate(
        weights=weight_bytes(facts, precision, quantization),
        training_state=facts.trainable_parameters * (TRAINING_STATE_BYTES + (0 if facts.lora is None else ADAPTER_WEIGHT_BYTES)),
        per_sample=activation_bytes_per_sample(facts, activation_bytes, seq_len, gradient_checkpointing),
        workspace=WORKSPACE_BYTES[device_kind],
        context=CONTEXT_BYTES[device_kind],
    )


def format_gib(size: float) -> str:
    """Bytes as GiB with one decimal ("5.0 GiB"), or MiB below 1 GiB."""
    if size < GIB:
        return f"{size / MIB:.0f} MiB"
    return f"{size / GIB:.1f} GiB"


def format_parameters(count: int) -> str:
    """A parameter count in the usual words: 2.5B, 824K."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.1f}{unit}"
    return str(count)
