"""The dashboard shows what share of this machine's work the run used, and why the rest was not."""

from p2ptrain.control_types import LocalStatus
from p2ptrain.tui.widgets.hardware_panel import local_lines

LOCAL = {"device": "cpu", "precision": "fp32", "quantization": "none", "micro_batch": 8, "grad_accum": 1,
         "samples_per_second": 9.9, "loss": 2.5, "trained_samples": 0, "unused_samples": {}}


def test_the_share_of_trained_samples_the_run_used_and_the_reasons_for_the_rest():
    lines = local_lines(LocalStatus.from_dict({**LOCAL, "trained_samples": 2048, "contributed_samples": 1536,
                                               "unused_samples": {"late": 120, "failed_round": 0, "rejected": 8}}))
    assert lines[-1] == "used 1.5k of 2.0k trained (75%) · not used: 120 late, 8 rejected"


def test_nothing_about_shares_before_the_first_trained_sample():
    assert not any("trained" in line for line in local_lines(LocalStatus.from_dict({**LOCAL, "contributed_samples": 0})))
