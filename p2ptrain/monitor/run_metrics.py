"""The run monitor's ``/metrics``: the run and each of its present peers, and how the monitor's reads go.

The run's and the peers' families are the daemon's too (``p2ptrain.swarm_metrics``);
a peer whose record expired is left out, so its series end in Prometheus.
"""

from __future__ import annotations

from p2ptrain.openmetrics import OpenMetricsText
from p2ptrain.swarm_metrics import add_peers, add_run


def monitor_metrics(run: dict) -> str:
    """The OpenMetrics text of ``run``, the monitor's ``/api/run.json`` (``history.RunHistory.to_json``)."""
    text = OpenMetricsText()
    add_run(text, run["run"])
    add_peers(text, run["run"]["id"], [peer for peer in run["peers"] if peer["present"]])
    labels = {"run": run["run"]["id"]}
    text.add("p2ptrain_monitor_reads", "counter", "reads of the run's records from the DHT", run["reads"]["count"], **labels)
    text.add("p2ptrain_monitor_read_errors", "counter", "reads that failed (no answer in time)", run["reads"]["failed"], **labels)
    text.add("p2ptrain_monitor_last_read_timestamp_seconds", "gauge", "when the monitor last read the run (Unix time)",
             run["reads"]["at"], **labels)
    return text.render()
