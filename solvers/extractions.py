"""A model output or a gradient counted once, not twice, in what eager PyTorch holds.

The profiler gives the values that leave the step a node of their own, an *extraction* (value class
``model_output``: pinned, held by the caller; ``gradient``: a parameter's ``.grad``, held to the end),
reading the group that computed them. The group's ``mem`` still includes those bytes, so while the
group is held (until its last backward reader) the same tensor is counted twice: a nn.TransformerEncoder
whose last ``norm2`` output is the model output was predicted 32,768 B high at the loss, 2.03% of a
50% plan's peak.

For the native executor the source group of such a value is never recomputed (a region that computes
a model output is refused, backward ops are not regions), so the group's copy of the bytes can move
into its workspace: the step that computes it still counts them (held + mem + workspace), the
extraction counts them from the next step on, and nothing counts them twice. The traced executor can
recompute the group (and then does make the tensor again), so it keeps the conservative count.
"""

from __future__ import annotations

import networkx as nx

EXTRACTED_ONCE = ("model_output", "gradient")


def count_extractions_once(graph: nx.DiGraph) -> nx.DiGraph:
    """``graph`` (a copy) with each ``model_output``/``gradient`` extraction's bytes taken out of its
    source group's ``mem`` and put into that group's ``workspace``; ``graph`` itself when it has none."""
    moves: dict = {}
    for v, data in graph.nodes(data=True):
        if data.get("value_class") not in EXTRACTED_ONCE or data.get("kind") == "loss":
            continue
        sources = list(graph.predecessors(v))
        if len(sources) == 1 and _is_extraction_of(v, data, sources[0]):
            moves[sources[0]] = moves.get(sources[0], 0) + int(data["mem"])
    if not moves:
        return graph
    result = graph.copy()
    for source, extracted in moves.items():
        data = result.nodes[source]
        extracted = min(extracted, int(data["mem"]))
        data["mem"] = int(data["mem"]) - extracted
        data["workspace"] = int(data.get("workspace", 0)) + extracted
    return result


def _is_extraction_of(node, data: dict, source) -> bool:
    """An extraction runs no op and is named after its source (``"<source>/<value class>"``); a
    group whose own values are all special (the logits of a language model head) is a group, and
    holds its bytes once already."""
    return data.get("ops") == 0 and str(node) == f"{source}/{data.get('value_class')}"
