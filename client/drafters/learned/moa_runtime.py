"""MoA drafting, the client part: caches over committed tokens and draft nodes (``runtime`` has the use).

Features, by ``edgespec.shared.wire`` name: {LSA: [k, 2*E_kv], and for TLI = N TLI_K, TLI_V: [N, k, E_kv]}.
``parts`` holds the target's embedding / norm / LM head and its last N layers. Offline there is no new memory,
and the TLI layers use their own K/V.

Per committed token c_i at position i the drafter keeps: its Self-Attention K/V (token-only,
never recomputed); when the server sent its features ("covered"), a Cross-Attention memory
row and, for TLI, the server's K/V of the last N layers; when not (the root, tokens made
offline), the TLI layers' own K/V computed from the predicted activation. Rows carry explicit
RoPE positions, so covered and own rows may interleave (a resume can cover a later span).
"""
from __future__ import annotations

import torch

from edgespec.shared import wire
from edgespec.shared.drafters.blocks import KV
from edgespec.shared.drafters.moa.client_part import MoAClient
from edgespec.shared.drafters.target_parts import TargetParts

from .runtime import DrafterStateError, LearnedRuntime


def _kv_rows(x: torch.Tensor, heads: int) -> torch.Tensor:
    # [T, heads*D] -> [heads, T, D]
    return x.view(x.shape[0], heads, -1).transpose(0, 1)


def _cat(a: KV | None, b: KV) -> KV:
    return b if a is None else a.cat(b)


class MoARuntime(LearnedRuntime):
    name = "MoA"
    feature = wire.LSA

    def __init__(self, client: MoAClient, parts: TargetParts):
        if parts.tli != client.config.tli:
            raise DrafterStateError(f"the client part was trained for TLI {client.config.tli} but the target "
                                    f"parts hold {parts.tli} layers")
        self.client = client.eval()
        super().__init__(parts)

    def reset(self) -> None:
        super().reset()
        self.x: torch.Tensor | None = None  # [n, W] Self-Attention inputs of committed tokens
        self.sa: KV | None = None  # [H, n, D]
        self.mem: KV | None = None  # Cross-Attention memory, one row per covered position
        self.mem_pos: list[int] = []  # positions of the memory rows, in row order
        self.tli_server: list[KV] | None = None  # per TLI layer, rows aligned with mem_pos
        self.own_pos: list[int] = []  # uncovered committed positions (ascending; the root is last)
        self.tli_own: list[KV] | None = None  # per TLI layer, rows aligned with own_pos
        # [len(own_pos), E]: the LM head's input, not its output, so that a head that changes (a router, the
        # committed text's ids joining the draft vocabulary, which renumbers them) never meets stale rows
        self.own_hidden: torch.Tensor | None = None

    def clear_draft(self) -> None:
        super().clear_draft()
        self.draft_sa: KV | None = None
        self.draft_tli: list[KV] | None = None

    @property
    def covered(self) -> int:
        """Committed positions whose target features the drafter holds."""
        return len(self.mem_pos)

    # -- committing -----------------------------------------------------------------------------
    def _add_tokens(self, n0: int) -> None:
        pos = torch.arange(n0, self.length)
        x = self.client.sa_input(self.parts.embed(torch.tensor(self.tokens[n0:], dtype=torch.long)))
        self.x = x if self.x is None else torch.cat([self.x, x])
        self.sa = _cat(self.sa, self.client.sa_kv(x, pos))
        self.own_pos += list(range(n0, self.length))

    def _cover(self, features: dict[str, torch.Tensor], start: int) -> None:
        lsa = features[wire.LSA]
        k = lsa.shape[0]
        span = list(range(start, start + k))
        if not set(span) <= set(self.own_pos):
            raise DrafterStateError(f"features of positions {start}..{start + k - 1} do not fit: positions already "
                                    f"covered cannot be covered again")
        self.mem = _cat(self.mem, self.client.memory(lsa, torch.tensor(span)))
        self.mem_pos += span
        if self.parts.tli:
            tk, tv = features.get(wire.TLI_K), features.get(wire.TLI_V)
            n_tli = self.parts.tli
            if tk is None or tv is None or tk.shape[:2] != (n_tli, k) or tv.shape[:2] != (n_tli, k):
                raise DrafterStateError(f"TLI {n_tli} needs {wire.TLI_K!r} and {wire.TLI_V!r} of shape "
                                        f"[{n_tli}, {k}, E_kv]")
            heads, dt = self.parts.shape.kv_heads, self.parts.dtype
            new = [KV(_kv_rows(tk[i].to(dt), heads), _kv_rows(tv[i].to(dt), heads)) for i in range(n_tli)]
            self.tli_server = new if self.tli_server is None else [o.cat(w) for o, w in zip(self.tli_server, new)]
        self.own_pos = [p for p in self.own_pos if p not in set(span)]
        self.own_hidden = self.tli_own = None  # the memory changed: every own row is stale

    def _carry_on(self) -> None:
        """Predict the uncovered committed positions not predicted yet (always the root)."""
        done = 0 if self.own_hidden is None else self.own_hidden.shape[0]
        todo = self.own_pos[done:]
        if not todo:
            return
        pos = torch.tensor(todo)
        mem_pos = torch.tensor(self.mem_pos, dtype=torch.long)
        own_done = torch.tensor(self.own_pos[:done], dtype=torch.long)
        # Each query sees what existed when its token was the newest: tokens, memory and TLI rows up to it.
        sa_mask = torch.arange(self.length)[None, :] <= pos[:, None]
        mem_mask = mem_pos[None, :] < pos[:, None]
        tli_mask = torch.cat([mem_mask, own_done[None, :] < pos[:, None], pos[None, :] <= pos[:, None]], 1)
        past = self._tli_committed(done)
        hidden, tli_new = self._predict(self.x[pos], pos, self.sa, sa_mask, mem_mask, past, tli_mask)
        if tli_new:
            self.tli_own = tli_new if self.tli_own is None else [o.cat(t) for o, t in zip(self.tli_own, tli_new)]
        self.own_hidden = hidden if self.own_hidden is None else torch.cat([self.own_hidden, hidden])

    def _tli_committed(self, own_rows: int | None = None) -> list[KV] | None:
        """Per TLI layer: server rows then the first ``own_rows`` own rows (all when None)."""
        if not self.parts.tli:
            return None
        layers = []
        for i in range(self.parts.tli):
            kv = self.tli_server[i] if self.tli_server is not None else None
            if self.tli_own is not None:
                own = self.tli_own[i] if own_rows is None else self.tli_own[i].take(slice(0, own_rows))
                kv = own if kv is None else kv.cat(own)
            layers.append(kv)
        return None if any(kv is None for kv in layers) else layers

    def _predict(self, x, pos, sa_keys: KV, sa_mask, mem_mask, tli_past: list[KV] | None, tli_mask):
        memory = self.client.with_null(self.mem if self.mem is not None else self.client.empty_kv(x))
        mem_mask = torch.cat([torch.ones(x.shape[0], 1, dtype=torch.bool), mem_mask], 1)
        act = self.client.predict(x, pos, sa_keys, sa_mask, memory, mem_mask)
        if tli_past is None:  # nothing committed in the TLI cache yet: only this call's rows
            tli_mask = tli_mask[:, tli_mask.shape[1] - x.shape[0]:]
        out, tli_new = self.parts.run_layers(act, pos, tli_mask, tli_past)
        return self.parts.norm(out.to(self.parts.dtype)), tli_new  # [k, E]: the LM head's input

    def _forget(self, length: int) -> None:
        if not length:
            return self.reset()
        self.x, self.sa = self.x[:length], self.sa.take(slice(0, length))
        keep = [i for i, p in enumerate(self.mem_pos) if p < length - 1]
        if len(keep) < len(self.mem_pos):
            idx = torch.tensor(keep, dtype=torch.long)
            self.mem = self.mem.take(idx) if keep else None
            if self.tli_server is not None:
                self.tli_server = [kv.take(idx) for kv in self.tli_server] if keep else None
            self.mem_pos = [self.mem_pos[i] for i in keep]
        covered = set(self.mem_pos)
        self.own_pos = [p for p in range(length) if p not in covered]
        self.own_hidden = self.tli_own = None
        self._carry_on()

    # -- drafting -------------------------------------------------------------------------------
    def _check_ready(self) -> None:
        if self.own_hidden is None or not self.length:
            raise DrafterStateError("no prediction yet: commit at least one token")

    def _root_logprobs(self) -> torch.Tensor:
        return self._logprobs(self.own_hidden[-1:])[0]

    def _fixed_rows(self) -> int:
        return self.length

    def _expand(self, ids: torch.Tensor, parents: list[int], depths: list[int], vis: torch.Tensor) -> torch.Tensor:
        pos = torch.tensor([self.length - 1 + d for d in depths])
        x = self.client.sa_input(self.parts.embed(ids))
        self.draft_sa = _cat(self.draft_sa, self.client.sa_kv(x, pos))
        tli_past = self._tli_committed()
        if tli_past is not None and self.draft_tli is not None:
            tli_past = [c.cat(d) for c, d in zip(tli_past, self.draft_tli)]
        mem_mask = torch.ones(len(ids), self.covered, dtype=torch.bool)
        hidden, tli_new = self._predict(x, pos, self.sa.cat(self.draft_sa), vis, mem_mask, tli_past, vis)
        if tli_new:
            self.draft_tli = tli_new if self.draft_tli is None else [d.cat(t) for d, t in zip(self.draft_tli, tli_new)]
        return self._logprobs(hidden)
