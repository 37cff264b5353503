"""The tiny preset, the trainable state, LoRA on a local pretrained model, and the loss."""

import math

import pytest
import torch

from p2ptrain.peers.model.data import DEFAULT_DATASET, train_batches
from p2ptrain.peers.model.models import TINY_PRESET, ModelUnavailable, build_model, causal_lm_loss
from p2ptrain.peers.model.tokenizers import ByteTokenizer


@pytest.fixture(scope="module")
def tiny():
    return build_model(TINY_PRESET, seed=0)


@pytest.fixture(scope="session")
def stdlib_cache(tmp_path_factory):
    """One token cache of the stdlib corpus for the whole session (shared with test_data)."""
    return tmp_path_factory.getbasetemp() / "stdlib-token-cache"


def test_tiny_preset_is_a_fully_trainable_llama_of_about_a_million_parameters(tiny):
    assert type(tiny.model).__name__ == "LlamaForCausalLM"
    assert 800_000 <= tiny.parameters <= 1_000_000
    assert tiny.trainable_parameters == tiny.parameters
    assert sum(p.numel() for p in tiny.trainable()) == tiny.parameters
    assert isinstance(tiny.tokenizer, ByteTokenizer)
    assert tiny.model.get_input_embeddings().num_embeddings == tiny.tokenizer.vocab_size == 259


def test_same_seed_gives_the_same_weights_and_another_seed_different_ones(tiny):
    torch.manual_seed(1234)  # global RNG state must not matter
    again = build_model(TINY_PRESET, seed=0)
    other = build_model(TINY_PRESET, seed=1)
    first, second, third = tiny.trainable_state(), again.trainable_state(), other.trainable_state()
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert not torch.equal(first["model.layers.0.self_attn.q_proj.weight"],
                           third["model.layers.0.self_attn.q_proj.weight"])


def test_loss_on_random_tokens_is_about_log_of_the_vocabulary(tiny):
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 259, (4, 64), generator=generator)
    with torch.no_grad():
        loss = causal_lm_loss(tiny.model, batch).item()
    assert abs(loss - math.log(259)) < 0.3


def test_causal_lm_loss_is_next_token_cross_entropy(tiny):
    batch = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = tiny.model(input_ids=batch).logits
        expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 259), batch[:, 1:].reshape(-1))
        assert causal_lm_loss(tiny.model, batch).item() == pytest.approx(expected.item(), rel=1e-5)


def test_twenty_adamw_steps_on_the_stdlib_corpus_lower_the_loss(stdlib_cache):
    loaded = build_model(TINY_PRESET, seed=0)
    batches = train_batches(DEFAULT_DATASET, loaded.tokenizer, seq_len=64, micro_batch=8, seed=0,
                            cache_dir=stdlib_cache)
    held_out = next(batches)
    with torch.no_grad():
        before = causal_lm_loss(loaded.model, held_out).item()
    optimizer = torch.optim.AdamW(loaded.trainable(), lr=3e-3)
    for _ in range(20):
        causal_lm_loss(loaded.model, next(batches)).backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        after = causal_lm_loss(loaded.model, held_out).item()
    assert after < before - 0.5


def test_trainable_state_round_trips_between_models(tiny):
    other = build_model(TINY_PRESET, seed=7)
    state = other.trainable_state()
    with torch.no_grad():
        other.trainable()[0].add_(1.0)  # the state is a copy: later training must not change it
    assert not torch.equal(state[next(iter(state))], other.trainable()[0])
    target = build_model(TINY_PRESET, seed=0)
    target.load_trainable_state(state)
    assert all(torch.equal(a, b) for a, b in zip(target.trainable_state().values(), state.values()))


def test_loading_a_state_with_wrong_shapes_names_or_values_raises_value_error(tiny):
    state = tiny.trainable_state()
    before = tiny.trainable_state()
    name = "model.layers.0.mlp.up_proj.weight"
    misshapen = dict(state, **{name: torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="wrong shapes: model.layers.0.mlp.up_proj.weight"):
        tiny.load_trainable_state(misshapen)
    missing = {key: value for key, value in state.items() if key != name}
    with pytest.raises(ValueError, match="missing model.layers.0.mlp.up_proj.weight"):
        tiny.load_trainable_state(missing)
    not_finite = dict(state, **{name: torch.full_like(state[name], float("nan"))})
    with pytest.raises(ValueError, match="NaN or infinite"):
        tiny.load_trainable_state(not_finite)
    assert all(torch.equal(a, b) for a, b in zip(tiny.trainable_state().values(), before.values()))


def save_small_llama(directory):
    """A small pretrained-looking Llama with its own BPE tokenizer, saved like a hub model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = save_small_tokenizer(directory)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=128, eos_token_id=1)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)


def save_small_tokenizer(directory):
    """A byte-level BPE tokenizer trained on two lines, saved with save_pretrained (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(["def main():\n    return 0\n", "import os\nprint(os.getcwd())\n"], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>", unk_token="<unk>")
    tokenizer.save_pretrained(directory)
    return tokenizer


def test_lora_on_a_local_llama_trains_only_the_adapters(tmp_path):
    save_small_llama(tmp_path)
    loaded = build_model(str(tmp_path), lora={"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": None})
    assert loaded.trainable_parameters / loaded.parameters < 0.2
    trainable_names = [name for name, p in loaded.model.named_parameters() if p.requires_grad]
    assert trainable_names and all("lora_" in name for name in trainable_names)
    assert any("o_proj.lora_A" in name for name in trainable_names)  # the llama default targets
    assert set(loaded.trainable_state()) == set(trainable_names)
    batch = torch.tensor([loaded.tokenizer.encode("def main():\n    return 0\n")])
    causal_lm_loss(loaded.model, batch).backward()
    assert all(p.grad is not None for p in loaded.trainable())


def test_lora_on_a_local_gpt2_uses_its_attention_layers_by_default(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = save_small_tokenizer(tmp_path)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2,
                               n_positions=64)).save_pretrained(tmp_path)
    loaded = build_model(str(tmp_path), lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": None})
    names = list(loaded.trainable_state())
    assert any("c_attn.lora_A" in name for name in names)
    assert all("lora_" in name for name in names)
    batch = torch.tensor([loaded.tokenizer.encode("import os\n")])
    assert torch.isfinite(causal_lm_loss(loaded.model, batch))


def test_lora_adapters_start_the_same_for_the_same_seed(tmp_path):
    save_small_llama(tmp_path)
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj"]}
    first = build_model(str(tmp_path), lora=lora, seed=3).trainable_state()
    second = build_model(str(tmp_path), lora=lora, seed=3).trainable_state()
    assert len(first) == 4 and all(torch.equal(first[name], second[name]) for name in first)


def test_a_missing_model_directory_is_a_one_line_model_unavailable(tmp_path):
    with pytest.raises(ModelUnavailable, match="does not exist") as error:
        build_model(str(tmp_path / "no-such-model"))
    assert "\n" not in str(error.value)


def test_quantization_on_cpu_says_it_needs_a_cuda_gpu():
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        build_model(TINY_PRESET, quantization="nf4", device="cpu")


def test_unknown_precision_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        build_model(TINY_PRESET, precision="fp8")


def test_bf16_precision_gives_bf16_weights():
    loaded = build_model(TINY_PRESET, precision="bf16")
    assert {p.dtype for p in loaded.trainable()} == {torch.bfloat16}
