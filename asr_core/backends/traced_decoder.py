"""The finals' prefix-tree rescoring forward as frozen TorchScript graphs, one per direction.

Why: a rescoring call is ~6 layers x 2 directions x dozens of small torch operations, and in
eager mode each one goes through Python, torch's bindings and the dispatcher. A frozen traced
graph runs the same operations without returning to Python between them, with the int8
weights prepacked and the float ones folded into it as constants (as ``traced`` does for the
encoder's chunk step). Measured on the random-weight AISHELL-size decoder (one thread of the
2-core development VM, eager and traced alternated in one process): 23.8 -> 19.8 ms per int8
rescoring call of one utterance's 10-best, 97 -> 88 ms for four; float 55 -> 52 and 228 -> 222
ms. The matmuls are the rest; at 16 utterances per call the difference is within the noise.

One trace serves every call: ``TransformerDecoder.forward_prepared_tree`` reads no tensor's
value in Python and takes every size from its inputs' shapes, so the graph records sizes as
``aten::size`` of its inputs and runs on any utterance count S, tree size N and memory length
T' (tests/test_traced_decoder.py checks one trace against the eager forward on other shapes).
What a graph does fix is the kind of its inputs: the masks' dtypes (the fused kernel's additive
biases, or bool where ``MultiHeadedAttention.kernel_mask`` keeps them), the memory's dtype and
whether positions are per utterance (S, N) or shared (N,). Graphs are keyed by those; a call
with bool masks (an attention query with no key, which a tree never builds), with autograd on
or in training mode runs eagerly, as does every call of a model the tracer cannot follow.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from asr_core.backends.traced import frozen_trace
from asr_core.model.decoder import BiTransformerDecoder, MemoryKeysValues, TransformerDecoder, Tree

log = logging.getLogger(__name__)

GraphKey = tuple[torch.dtype, torch.dtype, torch.dtype, int]
"""(memory dtype, memory mask dtype, tree mask dtype, positions' dims)."""


class PreparedTree(nn.Module):
    """One direction's ``forward_prepared_tree`` as a module with tensor inputs, to trace."""

    def __init__(self, decoder: TransformerDecoder) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(
        self, memory: Tensor, memory_mask: Tensor, tokens: Tensor, positions: Tensor, tree_mask: Tensor
    ) -> Tensor:
        return self.decoder.forward_prepared_tree(memory, memory_mask, tokens, positions, tree_mask)


class TracedTrees:
    """``decoder.forward_prefix_tree`` (one direction) through frozen traced graphs, traced on
    the first call of each ``GraphKey``; eager where a graph does not apply or tracing failed."""

    def __init__(self, decoder: TransformerDecoder) -> None:
        self.decoder = decoder
        self.module = PreparedTree(decoder)
        self._graphs: dict[GraphKey, Callable[..., Tensor]] = {}
        self._failed: set[GraphKey] = set()
        self._trace_lock = threading.Lock()  # the engine's finalizer lanes may share one decoder

    @property
    def graphs(self) -> int:
        return len(self._graphs)

    def __call__(
        self, memory: Tensor, memory_mask: Tensor, tokens: Tensor, positions: Tensor, tree_mask: Tensor
    ) -> Tensor:
        """memory (S, T', D), memory_mask (S, 1, T') bool, tokens (S, N), positions (S, N) or (N,),
        tree_mask (S, N, N) bool -> log-probs (S, N, V), as ``forward_prefix_tree``."""
        if self.decoder.training or torch.is_grad_enabled():  # the graphs are inference-only
            return self.decoder.forward_prefix_tree(memory, memory_mask, tokens, positions, tree_mask)
        tree_mask, memory_mask = self.decoder.tree_attention_masks(tree_mask, memory_mask)
        inputs = (memory, memory_mask, tokens, positions, tree_mask)
        graph = self._graph((memory.dtype, memory_mask.dtype, tree_mask.dtype, positions.dim()), inputs)
        if graph is None:
            return self.decoder.forward_prepared_tree(*inputs)
        # No profiling-executor passes on top of freezing (as ``traced.TracedSteps``): they would
        # re-optimize for every new shape.
        with torch.jit.optimized_execution(False):
            return graph(*inputs)

    def _graph(self, key: GraphKey, example: tuple[Tensor, ...]) -> Callable[..., Tensor] | None:
        graph = self._graphs.get(key)
        if graph is not None or key in self._failed or keeps_bool_masks(key):
            return graph
        with self._trace_lock:
            graph = self._graphs.get(key)
            if graph is None and key not in self._failed:
                graph = self._trace(key, example)
        return graph

    def _trace(self, key: GraphKey, example: tuple[Tensor, ...]) -> Callable[..., Tensor] | None:
        started = time.perf_counter()
        try:
            graph = frozen_trace(self.module, example, baked_values="error")  # a value baked in: stay eager
        except Exception:  # a model the tracer cannot follow still rescores, eagerly
            log.exception("tracing the rescoring decoder for %s failed; it runs eagerly", key)
            self._failed.add(key)
            return None
        self._graphs[key] = graph
        log.info("traced the rescoring decoder for %s in %.1f s", key, time.perf_counter() - started)
        return graph


def keeps_bool_masks(key: GraphKey) -> bool:
    """Whether a call's masks stayed bool (a query with no key to attend): rare, left eager."""
    return key[1] == torch.bool or key[2] == torch.bool


class TracedTreeDecoder(nn.Module):
    """A model decoder (``TransformerDecoder`` or U2++'s ``BiTransformerDecoder``) whose
    ``forward_tree`` runs through ``TracedTrees``, one per direction; its other calls (the padded
    ``forward``, the search's ``step``) run the wrapped decoder eagerly."""

    def __init__(self, decoder: TransformerDecoder | BiTransformerDecoder) -> None:
        super().__init__()
        self.decoder = decoder
        if isinstance(decoder, BiTransformerDecoder):
            self.left: TracedTrees = TracedTrees(decoder.left_decoder)
            self.right: TracedTrees | None = TracedTrees(decoder.right_decoder)
        else:
            self.left, self.right = TracedTrees(decoder), None

    def warm_up(self) -> None:
        """Trace the graphs now (a few tenths of a second per direction on the AISHELL-size
        model) rather than in the first final: one call on two small trees, of the kind the
        finals make (float memory and masks, positions per utterance)."""
        embedding = self.left.decoder.embed[0]
        assert isinstance(embedding, nn.Embedding)
        weight = embedding.weight
        memory = torch.zeros(2, 4, weight.size(1), dtype=weight.dtype, device=weight.device)  # (S, T', D)
        memory_mask = torch.ones(2, 1, 4, dtype=torch.bool, device=weight.device)
        tokens = torch.zeros(2, 3, dtype=torch.long, device=weight.device)  # (S, N)
        positions = torch.arange(3, device=weight.device).expand(2, 3)
        tree_mask = torch.ones(3, 3, dtype=torch.bool, device=weight.device).tril().expand(2, 3, 3)
        tree = (tokens, positions, tree_mask)
        with torch.inference_mode():
            self.forward_tree(memory, memory_mask, tree, tree)

    @property
    def graphs(self) -> int:
        """Graphs traced so far, both directions."""
        return self.left.graphs + (self.right.graphs if self.right is not None else 0)

    def forward(
        self,
        memory: Tensor,
        memory_mask: Tensor,
        ys_in_pad: Tensor,
        ys_in_lens: Tensor,
        r_ys_in_pad: Tensor | None = None,
        reverse_weight: float = 0.0,
        memory_rows: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The wrapped decoder's padded forward, eagerly (``rescoring.protocols.DecoderFn``)."""
        result: tuple[Tensor, Tensor] = self.decoder(
            memory, memory_mask, ys_in_pad, ys_in_lens, r_ys_in_pad, reverse_weight, memory_rows
        )
        return result

    def forward_tree(self, memory: Tensor, mask: Tensor, tree: Tree, r_tree: Tree | None) -> tuple[Tensor, Tensor]:
        """As ``BiTransformerDecoder.forward_tree`` (a unidirectional decoder ignores ``r_tree``)."""
        l2r = self.left(memory, mask, *tree)
        if r_tree is None or self.right is None:
            return l2r, l2r.new_zeros(0)
        return l2r, self.right(memory, mask, *r_tree)

    def memory_keys_values(self, memory: Tensor) -> MemoryKeysValues:
        """The wrapped decoder's (``rescoring.attention_search.StepDecoder``)."""
        return self.decoder.memory_keys_values(memory)

    def step(
        self, memory_kv: MemoryKeysValues, memory_mask: Tensor, tokens: Tensor, cache: list[Tensor] | None,
        memory_rows: Tensor,
    ) -> tuple[Tensor, list[Tensor]]:  # fmt: skip
        """The wrapped decoder's search step, eagerly (``rescoring.attention_search.StepDecoder``)."""
        return self.decoder.step(memory_kv, memory_mask, tokens, cache, memory_rows)
