"""``p2ptrain monitor``: a peer that trains nothing and serves a run's page, ``/api/run.json`` and ``/metrics``.

``command.py`` runs it, ``watcher.py`` reads the run from the DHT,
``history.py`` keeps what was read, ``run_metrics.py`` writes ``/metrics``,
``page.html`` is the page. It may import ``peers`` and the leaves, never
``daemon``, ``storage`` or ``tui``; nothing imports it but the CLI, by name,
when the command is given.
"""
