"""The hardware plan: real GPU profiles x models, the memory arithmetic against measurements, and `p2ptrain plan`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from p2ptrain.daemon.memory import estimate_memory
from p2ptrain.daemon.model_facts import ModelFactsError, model_facts
from p2ptrain.daemon.plan import DeviceFacts, PlanError, PlanPolicy, TrainingWay, make_plan, training_ways
from p2ptrain.daemon.plan_command import parse_size_mib

LORA = {"r": 8}
FINE_TUNING = {"seq_len": 512, "micro_batch_hint": 8}
FROM_SCRATCH = {"seq_len": 128, "micro_batch_hint": 8}


def gpu(name: str, total_mib: int, free_mib: int, capability: tuple[int, int]) -> DeviceFacts:
    return DeviceFacts(kind="cuda", name=name, index=0, memory_total_mib=total_mib, memory_free_mib=free_mib,
                       compute_capability=capability, cpu_cores=8)


# What nvidia-smi reports for these cards, with a desktop's share used on the consumer ones.
PROFILES = {
    "t4": gpu("Tesla T4", 15360, 15000, (7, 5)),
    "rtx3060": gpu("NVIDIA GeForce RTX 3060", 12288, 11500, (8, 6)),
    "rtx4090": gpu("NVIDIA GeForce RTX 4090", 24564, 23000, (8, 9)),
    "a100-40": gpu("NVIDIA A100-SXM4-40GB", 40960, 40000, (8, 0)),
    "a100-80": gpu("NVIDIA A100-SXM4-80GB", 81920, 80000, (8, 0)),
    "laptop-8gb": gpu("NVIDIA GeForce RTX 3070 Laptop GPU", 8192, 7400, (8, 6)),
    "cpu": DeviceFacts(kind="cpu", name="AMD Ryzen 7 5800X", memory_total_mib=32768, memory_free_mib=20000,
                       cpu_cores=8),
}
MODELS = ["tiny", "tinyllama-1.1b", "gemma-2b", "open-llama-7b", "open-llama-13b"]
CASES = [(profile, model) for profile in PROFILES for model in MODELS]
SHAPES = Path(__file__).parent.parent / "fixtures" / "model-shapes"


def plan_for(model: str, device: DeviceFacts, policy: PlanPolicy | None = None, manifest: dict | None = None,
             measured: dict | None = None):
    tiny = model == "tiny"
    manifest = manifest or (FROM_SCRATCH if tiny else FINE_TUNING)
    return make_plan(model_facts(model, None if tiny else LORA), manifest, device, policy, measured)


@pytest.mark.parametrize(("profile", "model"), CASES, ids=[f"{p}-{m}" for p, m in CASES])
def test_every_profile_gets_the_fastest_way_that_fits_or_a_one_line_refusal(profile, model):
    device, policy = PROFILES[profile], PlanPolicy()
    facts = model_facts(model, None if model == "tiny" else LORA)
    manifest = FROM_SCRATCH if model == "tiny" else FINE_TUNING
    precision = plan_for("tiny", device).precision
    allowed = int(device.memory_free_mib * 2**20 * (policy.ram_share if device.kind == "cpu" else policy.memory_share))
    fits = {way: estimate_memory(facts, precision, way.quantization, manifest["seq_len"], device.kind,
                                 way.gradient_checkpointing).samples_that_fit(allowed)
            for way in training_ways(facts, device)}
    if not any(fits.values()):
        with pytest.raises(PlanError, match="does not fit"):
            plan_for(model, device)
        return
    plan = plan_for(model, device)
    chosen = TrainingWay(plan.quantization, plan.gradient_checkpointing)
    faster = list(fits)[: list(fits).index(chosen)]
    assert all(fits[way] < policy.enough_micro_batch for way in faster), "a faster way fits enough samples"
    assert plan.micro_batch * plan.grad_accum == 8, "accumulation reaches the manifest's samples per step"
    assert plan.memory_estimate_gib <= plan.memory_allowed_gib
    if device.kind == "cuda":
        assert plan.memory_cap_gib < plan.memory_allowed_gib, "the allocator's cap leaves room for the CUDA context"
    assert len(plan.rationale) == 4 and all(plan.rationale)


def test_the_1b_on_a_16_gib_card_gets_micro_batch_8_as_measured_fastest():
    """On an H100 capped at 16 GiB, bf16 LoRA of the 1.1B shape at micro-batch 8 ran 78 samples/s (4: 31) and
    16 ran out of memory (tests/fixtures/gpu_h100_2026-11-26.jsonl); the old plan said 4."""
    facts = model_facts(str(SHAPES / "llama-1.1b"), {"r": 16})
    card = gpu("an H100 capped at 16 GiB", 16384, 16384, (9, 0))
    for hint in (8, 64):
        plan = make_plan(facts, {"seq_len": 512, "micro_batch_hint": hint}, card)
        assert (plan.precision, plan.quantization, plan.gradient_checkpointing, plan.micro_batch) == ("bf16", "none", False, 8)


def test_a_7b_on_an_8_gib_turing_card_trains_nf4_at_two_samples_or_more():
    """nf4 QLoRA of the 7B shape peaked at 6.1 GiB at 4 x 512 tokens on the H100; the old plan refused it at 8 GiB."""
    plan = plan_for("llama-2-7b", gpu("an 8 GiB card", 8192, 8192, (7, 5)))
    assert (plan.precision, plan.quantization, plan.gradient_checkpointing) == ("fp16", "nf4", True)
    assert plan.micro_batch >= 2


def test_nf4_comes_before_int8_unless_this_device_measured_int8_faster():
    tight = PROFILES["t4"]
    assert plan_for("open-llama-7b", tight).quantization == "nf4"
    assert plan_for("open-llama-7b", tight, measured={"nf4": 23.8, "int8": 12.4}).quantization == "nf4"
    assert plan_for("open-llama-7b", tight, measured={"nf4": 9.0, "int8": 12.4}).quantization == "int8"


def test_old_cards_train_in_fp32_and_never_in_int8():
    pascal = gpu("NVIDIA GeForce GTX 1080 Ti", 11264, 11000, (6, 1))
    assert plan_for("tiny", pascal).precision == "fp32"
    assert "fp16 arithmetic is slower" in plan_for("tiny", pascal).rationale[0]
    assert [way.quantization for way in training_ways(model_facts("open-llama-7b", LORA), pascal)] == ["none", "none", "nf4"]
    assert plan_for("open-llama-7b", pascal).quantization == "nf4"


def test_gradient_checkpointing_is_chosen_where_it_buys_a_busy_micro_batch():
    laptop = PROFILES["laptop-8gb"]
    plan = plan_for("tinyllama-1.1b", laptop)
    assert (plan.quantization, plan.gradient_checkpointing) == ("none", True)
    assert plan.micro_batch >= PlanPolicy().enough_micro_batch
    assert "unquantized with gradient checkpointing" in plan.rationale[1] and "the fastest way that fits" in plan.rationale[1]
    roomy = plan_for("tinyllama-1.1b", PROFILES["a100-80"])
    assert not roomy.gradient_checkpointing, "with room to spare, activations are kept (no recompute)"


def test_plan_sizes_from_free_memory_not_total():
    idle = gpu("NVIDIA GeForce RTX 4090", 24564, 23000, (8, 9))
    busy_desktop = gpu("NVIDIA GeForce RTX 4090", 24564, 9000, (8, 9))
    assert plan_for("gemma-2b", idle).quantization == "none"
    busy = plan_for("gemma-2b", busy_desktop)
    assert busy.quantization == "nf4"
    assert "7.9 GiB allowed (90% of 8.8 GiB free)" in busy.rationale[1]


def test_rationale_names_parameters_memory_and_reason():
    plan = plan_for("gemma-2b", gpu("T4", 16384, 16384, (7, 5)))
    assert plan.rationale[0] == "precision fp16: compute capability 7.5 has no bfloat16 (needs 8.0)"
    assert plan.rationale[1].startswith("quantization nf4; gradient checkpointing on: 2.5B params need 4.7 GiB in fp16")
    assert "samples that fit at once in 14.4 GiB allowed (90% of 16.0 GiB free): unquantized " in plan.rationale[1]


def test_full_training_never_quantizes():
    facts = model_facts("tinyllama-1.1b", None)
    plan = make_plan(facts, FINE_TUNING, PROFILES["a100-40"])
    assert plan.quantization == "none"
    with pytest.raises(PlanError):
        make_plan(facts, FINE_TUNING, PROFILES["laptop-8gb"])


def test_policy_caps_memory_share_and_cpu_threads():
    generous = plan_for("tinyllama-1.1b", PROFILES["rtx4090"])
    careful = plan_for("tinyllama-1.1b", PROFILES["rtx4090"], PlanPolicy(memory_share=0.3, max_cpu_threads=1))
    assert careful.micro_batch < generous.micro_batch or careful.quantization != "none" or careful.gradient_checkpointing
    assert careful.memory_estimate_gib <= careful.memory_allowed_gib < generous.memory_allowed_gib
    assert careful.cpu_threads == 1
    assert plan_for("tiny", PROFILES["cpu"]).cpu_threads == 8


def test_a_compute_share_below_one_is_in_the_plan_and_its_rationale():
    full = plan_for("tiny", PROFILES["cpu"])
    half = plan_for("tiny", PROFILES["cpu"], PlanPolicy(compute_share=0.5))
    assert (full.compute_share, half.compute_share) == (1.0, 0.5)
    assert not any("max_compute_share" in line for line in full.rationale)
    assert any("computes 50% of the time" in line and "max_compute_share = 0.5" in line for line in half.rationale)
    assert half.to_status().compute_share == 0.5


def test_micro_batch_divides_the_samples_per_step():
    plan = make_plan(model_facts("tinyllama-1.1b", LORA), {"seq_len": 512, "micro_batch_hint": 12},
                     PROFILES["t4"])
    assert 12 % plan.micro_batch == 0 and plan.micro_batch * plan.grad_accum == 12


def test_model_facts_match_published_parameter_counts():
    counts = {"tinyllama-1.1b": 1.10e9, "gemma-2b": 2.51e9, "open-llama-3b": 3.43e9, "open-llama-7b": 6.74e9,
              "open-llama-13b": 13.0e9, "llama-2-7b": 6.74e9}
    for model, published in counts.items():
        assert model_facts(model).parameters == pytest.approx(published, rel=0.01), model
    assert model_facts("google/gemma-2b").parameters == model_facts("gemma-2b").parameters
    assert 0.8e6 <= model_facts("tiny").parameters <= 1e6


def test_model_facts_read_a_local_config_and_refuse_unknown_models(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 1000}))
    facts = model_facts(str(tmp_path), LORA)
    assert facts.parameters == 2 * 1000 * 256 + 2 * (4 * 256 * 256 + 3 * 256 * 688 + 2 * 256) + 256
    with pytest.raises(ModelFactsError, match="not in the local Hugging Face cache"):
        model_facts("nobody/no-such-model-anywhere")


def test_tiny_facts_agree_with_the_real_preset():
    from p2ptrain.peers.model.models import tiny_config

    config = tiny_config()
    facts = model_facts("tiny")
    assert (facts.vocab_size, facts.hidden_size, facts.intermediate_size, facts.num_layers) == (
        config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers)


@pytest.mark.parametrize("text,mib", [("16GiB", 16384), ("16 GB", 16384), ("8192MiB", 8192), ("80G", 81920)])
def test_sizes_parse(text, mib):
    assert parse_size_mib(text) == mib


def run_plan(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "p2ptrain.cli", "plan", *arguments], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.timeout(120)
def test_plan_command_for_hypothetical_gpus():
    small = run_plan("--model", "gemma-2b", "--gpu-memory", "16GiB", "--compute-capability", "7.5", "--json")
    assert small.returncode == 0, small.stderr
    small_plan = json.loads(small.stdout)
    assert small_plan["quantization"] in ("int8", "nf4") and small_plan["precision"] == "fp16"
    assert {"micro_batch", "grad_accum", "rationale"} <= set(small_plan)
    big = json.loads(run_plan("--model", "gemma-2b", "--gpu-memory", "80GiB", "--compute-capability", "8.0",
                              "--json").stdout)
    assert (big["precision"], big["quantization"]) == ("bf16", "none")


@pytest.mark.timeout(120)
def test_plan_command_rejects_bad_input_in_one_line():
    for arguments, words in ((("--gpu-memory", "16 gigs", "--compute-capability", "7.5"), "16GiB"),
                             (("--gpu-memory", "16GiB"), "--compute-capability"),
                             (("--gpu-memory", "16GiB", "--compute-capability", "seven"), "7.5")):
        result = run_plan("--model", "gemma-2b", *arguments)
        assert result.returncode == 2
        assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr
    cpu = run_plan("--model", "tiny", "--device", "cpu")
    assert cpu.returncode == 0 and "fp32" in cpu.stdout




@pytest.mark.timeout(120)
def test_plan_command_puts_a_7b_on_an_8_gib_turing_card_in_nf4():
    shown = run_plan("--model", "llama-2-7b", "--gpu-memory", "8GiB", "--compute-capability", "7.5")
    assert shown.returncode == 0, shown.stderr
    assert "fp16, quantization nf4, gradient checkpointing, micro-batch 2 x 4" in shown.stdout.splitlines()[0], shown.stdout
    assert "is the way that fits the most" in shown.stdout
