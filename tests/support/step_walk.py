"""Which of edgespec's modules one verification step walks through, counted from the running code.

A profiler hook (``sys.setprofile``, and ``threading.setprofile`` for threads started afterwards: the server's
gRPC workers and its model thread) follows every Python call and return in edgespec's own modules while a
window is open, thread by thread. Frames of other packages (torch, grpc, transformers, the standard library)
are transparent: execution inside them counts as still being in the edgespec module that called them.

Each thread's walk is the sequence of modules execution moves through (consecutive repeats merged). From it:
- ``modules``: the distinct modules entered, in order of first entry;
- ``crossings``: moves from one module into another (a call in, or a return out);
- ``reentries``: calls into a module that the walk had left before in this window (returns to a caller do not
  count: climbing back up the stack is how a call ends; calling back down into a module already done with is
  what makes a step hard to read).
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field


def _module(frame) -> str | None:
    """The edgespec module of `frame` or of its nearest edgespec caller (None: no edgespec frame on the stack)."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name == "edgespec" or name.startswith("edgespec."):
            return name
        frame = frame.f_back
    return None


@dataclass
class ThreadWalk:
    name: str
    moves: list[tuple[str, str]] = field(default_factory=list)  # (event, module): "call" or "return" into it

    def add(self, event: str, module: str) -> None:
        if not self.moves or self.moves[-1][1] != module:
            self.moves.append((event, module))

    @property
    def modules(self) -> list[str]:
        return list(dict.fromkeys(m for _, m in self.moves))

    @property
    def crossings(self) -> int:
        return max(0, len(self.moves) - 1)

    @property
    def reentries(self) -> list[str]:
        seen, out = set(), []
        for i, (event, module) in enumerate(self.moves):
            if event == "call" and module in seen and i:
                out.append(module)
            seen.add(module)
        return out


class StepWalk:
    """Install with ``start()`` before the server and the client are built (so their threads inherit the hook),
    open a window around the step with ``window(start_when)``, read the walks, ``stop()``."""

    def __init__(self, opens_at: tuple[str, str], nth: int = 1):
        self.opens_at = opens_at  # (module, function): the window is that function's nth call, to its return
        self.nth = nth
        self.walks: dict[int, ThreadWalk] = {}
        self._calls = 0
        self._open = False
        self._opener: tuple[int, object] | None = None  # (thread id, frame) of the call that opened the window

    def start(self) -> None:
        sys.setprofile(self._hook)
        threading.setprofile(self._hook)

    def stop(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)

    def _hook(self, frame, event: str, _arg) -> None:
        if event not in ("call", "return"):
            return  # C calls: inside another package's code, transparent
        code = frame.f_code
        if not self._open:
            if event == "call" and code.co_name == self.opens_at[1] \
                    and frame.f_globals.get("__name__") == self.opens_at[0]:
                self._calls += 1
                if self._calls == self.nth:
                    self._open, self._opener = True, (threading.get_ident(), frame)
            if not self._open:
                return
        here = _module(frame if event == "call" else frame.f_back)
        if here is None:
            return
        ident = threading.get_ident()
        walk = self.walks.get(ident)
        if walk is None:
            walk = self.walks[ident] = ThreadWalk(threading.current_thread().name)
        walk.add(event, here)
        if event == "return" and self._opener == (ident, frame):
            self._open = False

    @property
    def closed(self) -> bool:
        return self._opener is not None and not self._open

    def report(self) -> str:
        lines = []
        for walk in self.walks.values():
            lines.append(f"{walk.name}: {len(walk.modules)} modules, {walk.crossings} crossings, "
                         f"{len(walk.reentries)} re-entries")
            lines += [f"    {m}" + (f"  (re-entered {walk.reentries.count(m)}x)" if m in walk.reentries else "")
                      for m in walk.modules]
        lines.append(f"all threads: {len(self.all_modules())} modules")
        return "\n".join(lines)

    def all_modules(self) -> list[str]:
        return list(dict.fromkeys(m for w in self.walks.values() for m in w.modules))
