"""Sparse rungs: the wire formats, error feedback and the reducer's refusal of other rungs (no processes)."""

import logging
import math

import pytest
import torch
from hivemind.compression import ScaledFloat16Compression, deserialize_torch_tensor, serialize_torch_tensor
from hivemind.proto import runtime_pb2

from p2ptrain.peers.compression.codecs import COUNTERS, RungRefused, SparseTopK, allow_rungs
from p2ptrain.peers.compression.ladder import parse_rung
from p2ptrain.peers.compression.sparse import (
    decode,
    encode_top_k,
    encode_union,
    pack_positions,
    sparsify,
    unpack_positions,
)
from p2ptrain.peers.compression.error_feedback import ErrorFeedback, rounds_held

RUNGS = ["sparse2bit-64of4096", "sparse4bit-64of4096", "sparse2bit-4of256", "sparse4bit-256of1024"]
# the tiny preset's shapes (a tensor shorter than a chunk, one with a short last chunk) and odd ones
SHAPES = [(344, 128), (128,), (259, 128), (5000,), (3,), (64, 64)]


def heavy_tailed(shape, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator) * torch.rand(shape, generator=generator) ** 3


@pytest.fixture
def refusing():
    """Reducers of this process accept only the rungs the test allows; everything again afterwards."""
    yield allow_rungs
    allow_rungs(None)


@pytest.mark.parametrize("name", RUNGS)
@pytest.mark.parametrize("shape", SHAPES)
def test_what_is_sent_is_what_arrives_and_sending_it_again_changes_nothing(name, shape):
    rung = parse_rung(name)
    tensor = heavy_tailed(shape, seed=sum(shape))
    sent = sparsify(tensor, rung)
    assert torch.equal(decode(encode_top_k(tensor, rung)), sent)
    # the trainer puts `sent` into the averager: hivemind's compression of it must be lossless
    assert torch.equal(sparsify(sent, rung), sent)
    assert torch.equal(decode(SparseTopK(rung).compress(sent, info=None)), sent)


@pytest.mark.parametrize("name", RUNGS)
def test_each_chunk_sends_its_k_largest_entries_with_their_signs(name):
    rung = parse_rung(name)
    tensor = heavy_tailed((rung.chunk * 3,), seed=1)
    sent = sparsify(tensor, rung).view(3, rung.chunk)
    chunks = tensor.view(3, rung.chunk)
    for chunk, sent_chunk in zip(chunks, sent):
        chosen = sent_chunk != 0
        assert int(chosen.sum()) == rung.k
        assert set(chosen.nonzero().view(-1).tolist()) == set(chunk.abs().topk(rung.k).indices.tolist())
        assert torch.equal(torch.sign(sent_chunk[chosen]), torch.sign(chunk[chosen]))
        assert len(set(sent_chunk[chosen].abs().tolist())) <= rung.levels


def test_two_bit_levels_are_the_means_of_the_small_and_the_large_magnitudes():
    rung = parse_rung("sparse2bit-4of256")
    tensor = torch.zeros(256)
    tensor[[3, 50, 100, 200]] = torch.tensor([1.0, -2.0, 9.0, -11.0])  # mean magnitude 5.75
    sent = sparsify(tensor, rung)
    assert sent[[3, 50, 100, 200]].tolist() == [1.5, -1.5, 10.0, -10.0]
    assert int((sent != 0).sum()) == 4


@pytest.mark.parametrize("name", ["sparse2bit-64of4096", "sparse2bit-16of4096", "sparse4bit-256of4096"])
def test_part_sizes_match_the_ladder(name):
    rung = parse_rung(name)
    tensor = heavy_tailed((64 * rung.chunk,), seed=2)
    size = len(encode_top_k(tensor, rung).buffer)
    assert abs(size / tensor.numel() - rung.send_bytes_per_value()) < 0.001


def test_a_reducers_answer_keeps_the_union_to_8_bit_precision_and_goes_dense_when_smaller():
    rung = parse_rung("sparse2bit-64of4096")
    sent = [sparsify(heavy_tailed((44032,), seed), rung) for seed in range(4)]
    average = sum(sent) / 4
    for tensor in sent:
        answer = encode_union(average - tensor)
        assert answer.buffer[3] == 2  # sparse: only the union of the four senders' entries
        assert len(answer.buffer) < 0.15 * average.numel()
        restored = tensor + decode(answer)
        # 8 bits scaled by each chunk's largest magnitude of the answer
        assert torch.allclose(restored, average, rtol=0, atol=float((average - tensor).abs().max()) / 127)
        assert torch.equal(restored == 0, average == 0), "the answer keeps every entry of the union"
    dense = heavy_tailed((10000,), seed=5)
    answer = encode_union(dense)
    assert answer.buffer[3] == 3 and len(answer.buffer) < dense.numel() + 100
    assert torch.allclose(decode(answer), dense, rtol=0, atol=float(dense.abs().max()) / 127)


def test_positions_are_elias_fano_coded_in_about_two_plus_log2_of_the_gap_bits():
    generator = torch.Generator().manual_seed(7)
    for universe, count in [(44032, 688), (4096, 1), (1000, 1000), (5, 0), (1 << 20, 100)]:
        positions = torch.randperm(universe, generator=generator)[:count].sort().values.numpy()
        packed = pack_positions(positions, universe)
        restored, end = unpack_positions(packed + b"tail", 0, count, universe)
        assert restored.tolist() == positions.tolist() and end == len(packed)
        if count:
            assert len(packed) * 8 <= count * (2 + math.log2(universe / count)) + 16


@pytest.mark.parametrize("name", ["sparse2bit-64of4096", "sparse4bit-16of1024"])
def test_error_feedback_is_exact_what_is_not_sent_now_is_sent_later(name):
    """sum over rounds of what was sent, plus the last residual, is the sum of the pseudo-gradients;
    a round that did not count leaves the residual as it was."""
    shapes = [(344, 128), (128,), (5000,)]
    feedback = ErrorFeedback(parse_rung(name), [torch.zeros(shape) for shape in shapes])
    total_gradients = [torch.zeros(shape, dtype=torch.float64) for shape in shapes]
    total_sent = [torch.zeros(shape, dtype=torch.float64) for shape in shapes]
    for round_index in range(12):
        gradients = [heavy_tailed(shape, seed=100 * round_index + index) for index, shape in enumerate(shapes)]
        outgoing = feedback.outgoing(gradients)
        if round_index % 5 == 3:  # no group: the peer keeps this round's progress for the next one
            feedback.not_sent()
            continue
        feedback.sent()
        for total, gradient in zip(total_gradients, gradients):
            total += gradient.double()
        for total, sent in zip(total_sent, outgoing):
            total += sent.double()
    for gradients, sent, residual in zip(total_gradients, total_sent, feedback.residuals):
        assert float(residual.abs().max()) > 0, "something was left for later"
        assert torch.allclose(sent + residual.double(), gradients, rtol=0, atol=1e-5)


def test_error_feedback_decay_forgets_old_residuals_geometrically():
    rung = parse_rung("sparse2bit-4of256")
    feedback = ErrorFeedback(rung, [torch.zeros(1024)], decay=0.5)
    expected_residual = torch.zeros(1024)
    for round_index in range(6):
        gradient = heavy_tailed((1024,), seed=round_index)
        target = 0.5 * expected_residual + gradient
        sent = feedback.outgoing([gradient])[0]
        feedback.sent()
        assert torch.equal(sent, sparsify(target, rung))
        expected_residual = target - sent
        assert torch.allclose(feedback.residuals[0], expected_residual, atol=1e-6)


@pytest.mark.parametrize("decay", [0.5, 0.9, 1.0])
def test_a_value_sent_holds_at_most_rounds_held_rounds_of_pseudo_gradient(decay):
    # robust aggregation bounds an honest pseudo-gradient's values by rounds_held rounds of them
    rung = parse_rung("sparse2bit-4of256")
    feedback = ErrorFeedback(rung, [torch.zeros(256)], decay=decay)
    gradient = torch.full((256,), 0.01)
    gradient[:4] = 1.0  # always the largest: entry 4 waits in the residual
    for _ in range(60):
        feedback.outgoing([gradient])
        feedback.sent()
    waiting = float(feedback.residuals[0][4])
    assert waiting <= 0.01 * rounds_held([rung], decay) + 1e-6
    if decay == 1.0:
        assert rounds_held([rung], decay) == math.inf and waiting == pytest.approx(0.6), "60 rounds of it, and growing"
    assert rounds_held([parse_rung("none"), parse_rung("blockwise8bit")], decay) == 1.0, "dense rungs send what a round holds"


def test_error_feedback_survives_a_checkpoint_and_a_lone_step_empties_it():
    rung = parse_rung("sparse2bit-4of256")
    feedback = ErrorFeedback(rung, [torch.zeros(512)])
    gradient = heavy_tailed((512,), seed=3)
    feedback.outgoing([gradient])
    feedback.sent()
    restored = ErrorFeedback(rung, [torch.zeros(512)])
    restored.load_state_dict(feedback.state_dict())
    assert torch.equal(restored.residuals[0], feedback.residuals[0])
    everything = restored.everything([torch.zeros(512)])[0]
    assert torch.allclose(everything, gradient - sparsify(gradient, rung))
    assert float(restored.residuals[0].abs().max()) == 0


def test_a_checkpoint_during_a_round_keeps_only_what_the_round_leaves_unsent():
    """The restored trainer drops the in-flight round's local progress (the swarm may have adopted
    it): its residual is what that round did not send, never the part it did."""
    rung = parse_rung("sparse2bit-4of256")
    feedback = ErrorFeedback(rung, [torch.zeros(512)])
    feedback.outgoing([heavy_tailed((512,), seed=7)])
    feedback.sent()
    gradient = heavy_tailed((512,), seed=8)
    target = feedback.residuals[0] + gradient
    sent = feedback.outgoing([gradient])[0]  # the round is in flight
    restored = ErrorFeedback(rung, [torch.zeros(512)])
    restored.load_state_dict(feedback.state_dict())
    assert torch.allclose(restored.residuals[0], target - sent, rtol=0, atol=1e-6)
    feedback.not_sent()  # had it found no group, the peer itself keeps its residual as before the round
    assert torch.allclose(feedback.residuals[0], target - gradient, rtol=0, atol=1e-6)


def test_a_dense_rung_sends_pseudo_gradients_as_they_are():
    feedback = ErrorFeedback(parse_rung("blockwise8bit"), [torch.zeros(8)])
    gradient = torch.randn(8)
    assert feedback.outgoing([gradient])[0] is gradient
    assert feedback.state_dict()["residuals"] == []


def test_a_reducer_refuses_a_part_of_a_rung_the_run_does_not_allow(refusing, caplog):
    allowed = parse_rung("sparse2bit-64of4096")
    refusing([allowed.name])
    part = heavy_tailed((8192,), seed=4)
    assert torch.equal(deserialize_torch_tensor(encode_top_k(part, allowed)), sparsify(part, allowed))
    refused_before = COUNTERS.refused_parts
    with caplog.at_level(logging.WARNING), pytest.raises(RungRefused):
        deserialize_torch_tensor(encode_top_k(part, parse_rung("sparse4bit-64of4096")))
    assert COUNTERS.refused_parts == refused_before + 1
    message = ("refused an averaging part sent with compression sparse4bit-64of4096: this run allows "
               "sparse2bit-64of4096; the sender is left out of this round")
    assert [record.getMessage() for record in caplog.records if "refused" in record.getMessage()] == [message]
    with pytest.raises(RungRefused, match="compression fp16"):
        deserialize_torch_tensor(serialize_torch_tensor(part, runtime_pb2.CompressionType.FLOAT16))
    # state downloads travel uncompressed: never refused
    assert torch.equal(deserialize_torch_tensor(serialize_torch_tensor(part, runtime_pb2.CompressionType.NONE)), part)


def test_without_a_run_every_rung_is_read_and_hivemind_mean_std_still_decodes(refusing):
    refusing(None)
    part = heavy_tailed((4, 300), seed=6)
    for name in RUNGS:
        assert torch.equal(deserialize_torch_tensor(encode_top_k(part, parse_rung(name))), sparsify(part, parse_rung(name)))
    scaled = deserialize_torch_tensor(ScaledFloat16Compression().compress(part, info=None))
    assert scaled.shape == part.shape and float((scaled - part).abs().max()) < 0.01
