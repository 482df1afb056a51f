"""The sweep tool, ``plan-checkpoints batch CONFIG.yaml`` (docs/batch.md): every model x budget x
solver of a YAML file, solved from one profile per model.

``batch``: the command and its scheduling over worker processes; ``config``: the YAML file;
``tasks``: what a worker runs (profile a model, solve a run); ``profilecache``: op times kept between
sweeps; ``reports``: the results table and plots.
"""
