"""QLoRA: LoRA adapters over bitsandbytes nf4 (double quantization) or int8 base weights.

A run's peers train QLoRA on CUDA (``build_model`` refuses quantization on
other devices). The loading and adapter code paths below ``build_model`` are
also run on the CPU where the installed bitsandbytes has CPU kernels (0.49+),
so they are tested on machines without a GPU too.
"""

from __future__ import annotations

import pytest
import torch

from p2ptrain.peers.model.models import add_lora, build_model, causal_lm_loss, load_pretrained
from test_export import save_small_llama

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": None}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("small-llama")
    save_small_llama(directory)
    return directory


def bitsandbytes_runs_on_cpu() -> str | None:
    """None if bitsandbytes quantizes to nf4 on the CPU here, else why not."""
    try:
        import bitsandbytes.functional as functional

        functional.quantize_4bit(torch.ones(64, 64), quant_type="nf4")
    except Exception as error:  # an ImportError, or a build without CPU kernels
        return f"bitsandbytes has no CPU kernels here ({type(error).__name__}: {str(error)[:80]})"
    return None


def assert_only_adapters_train(network) -> None:
    trainable = [name for name, p in network.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    batch = torch.randint(0, 200, (2, 16), generator=torch.Generator().manual_seed(0))
    loss = causal_lm_loss(network, batch)
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in network.parameters() if p.requires_grad)


@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_qlora_code_paths_on_the_cpu_where_bitsandbytes_runs_there(model_dir, quantization):
    reason = bitsandbytes_runs_on_cpu()
    if reason:
        pytest.skip(reason)
    import bitsandbytes as bnb

    network = load_pretrained(str(model_dir), "fp32", quantization, "cpu")
    layer_type = bnb.nn.Linear4bit if quantization == "nf4" else bnb.nn.Linear8bitLt
    quantized = [module for module in network.modules() if isinstance(module, layer_type)]
    assert len(quantized) == 7  # q, k, v, o, gate, up, down of the one layer
    if quantization == "nf4":
        state = quantized[0].weight.quant_state
        assert state.quant_type == "nf4" and state.nested  # double quantization
    assert_only_adapters_train(add_lora(network, LORA, quantization))


@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_qlora_build_model_on_cuda(model_dir, quantization):
    if not torch.cuda.is_available():
        pytest.skip("QLoRA peers train on CUDA only and this machine has no CUDA GPU")
    loaded = build_model(str(model_dir), LORA, precision="bf16", quantization=quantization, device="cuda")
    assert loaded.quantization == quantization
    assert loaded.trainable_parameters / loaded.parameters < 0.2
    assert_only_adapters_train(loaded.model)


def test_quantization_of_a_pretrained_model_on_the_cpu_needs_a_cuda_gpu(model_dir):
    with pytest.raises(ValueError, match="quantization 'nf4' needs a CUDA GPU; use quantization 'none' on cpu"):
        build_model(str(model_dir), LORA, quantization="nf4", device="cpu")


def test_int8_layers_get_fp16_inputs_and_nothing_floods_the_log(model_dir, caplog):
    reason = bitsandbytes_runs_on_cpu()
    if reason:
        pytest.skip(reason)
    network = add_lora(load_pretrained(str(model_dir), "fp32", "int8", "cpu"), LORA, "int8")
    with caplog.at_level("WARNING"):
        for _ in range(3):
            assert_only_adapters_train(network)
    casts = [record.message for record in caplog.records if "will be cast" in record.message]
    assert not casts, f"bitsandbytes cast the inputs itself: {casts[:1]} ({len(casts)} lines)"


def test_gradient_checkpointing_is_on_only_when_the_plan_asks(model_dir):
    plain = build_model(str(model_dir), LORA)
    checkpointed = build_model(str(model_dir), LORA, gradient_checkpointing=True)
    assert not plain.model.base_model.model.is_gradient_checkpointing
    assert checkpointed.model.base_model.model.is_gradient_checkpointing
    assert_only_adapters_train(checkpointed.model)
    tiny = build_model("tiny", gradient_checkpointing=True)
    assert tiny.model.is_gradient_checkpointing
