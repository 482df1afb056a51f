"""The sweep tool, ``plan-checkpoints batch CONFIG.yaml`` (docs/batch.md): every model x budget x
solver x executor of a YAML file, the traced runs solved from one profile per model, the native ones
planned and measured as planner.plan plans them.

``batch``: the command and its scheduling over worker processes; ``config``: the YAML file;
``executors``: which executor each run plans for; ``tasks``: what a worker runs (profile a model,
solve a traced run); ``native_runs``: a native run; ``profilecache``: op times kept between sweeps;
``clockcache``: the native planner's checkpoint clock kept beside them; ``reports``: the results
table and plots.
"""
