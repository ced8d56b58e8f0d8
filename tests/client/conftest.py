"""Client test fixtures: a real tiny server on loopback, a TCP relay that can blackhole or reset, references."""
from __future__ import annotations

import socket
import struct
import threading

import pytest
import torch


class TcpProxy:
    """A loopback TCP relay in front of the server that can cut the link two ways.

    - blackhole(): bytes on current connections vanish and new connections are
      accepted but never answered; every socket stays open.
    - reset(): current connections are closed with RST and new ones are reset at once.
    - restore(): new connections pass again (connections cut before stay dead, as
      after a real outage a client must reconnect).
    """

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.mode = "pass"
        self._lock = threading.Lock()
        self._pairs: list[dict] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._closed = False
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except (socket.timeout, OSError):
                continue
            if self.mode == "reset":
                _rst_close(client)
                continue
            pair = {"client": client, "dead": self.mode == "blackhole", "upstream": None}
            if not pair["dead"]:
                try:
                    pair["upstream"] = socket.create_connection(self.upstream)
                except OSError:
                    _rst_close(client)
                    continue
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._pump, args=(pair, "client", "upstream"), daemon=True).start()
            if pair["upstream"] is not None:
                threading.Thread(target=self._pump, args=(pair, "upstream", "client"), daemon=True).start()

    def _pump(self, pair: dict, src: str, dst: str) -> None:
        while True:
            try:
                data = pair[src].recv(65536)
            except OSError:
                break
            if not data:
                break
            if pair["dead"]:
                continue  # blackhole: swallow
            try:
                pair[dst].sendall(data)
            except OSError:
                break
        if not pair["dead"]:
            for side in ("client", "upstream"):
                try:
                    pair[side].shutdown(socket.SHUT_RDWR)
                except (OSError, AttributeError):
                    pass

    def blackhole(self) -> None:
        with self._lock:
            self.mode = "blackhole"
            for pair in self._pairs:
                pair["dead"] = True

    def reset(self) -> None:
        with self._lock:
            self.mode = "reset"
            for pair in self._pairs:
                pair["dead"] = True
                for side in ("client", "upstream"):
                    if pair[side] is not None:
                        _rst_close(pair[side])
            self._pairs.clear()

    def restore(self) -> None:
        self.mode = "pass"

    def close(self) -> None:
        self._closed = True
        with self._lock:
            for pair in self._pairs:
                for side in ("client", "upstream"):
                    if pair[side] is not None:
                        _rst_close(pair[side])
        self._listener.close()


def _rst_close(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    """A real verification server (float32 tiny target) on loopback gRPC."""
    from edgespec.server.app import ServerConfig, start_server

    handle = start_server(ServerConfig(model=str(tiny_model_dir), http_port=None, device="cpu", dtype="float32"))
    yield handle
    handle.stop(grace=1.0)


@pytest.fixture
def proxy(tiny_server):
    p = TcpProxy(("127.0.0.1", tiny_server.port))
    yield p
    p.close()


@pytest.fixture(scope="session")
def tiny_target_f32(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_drafter_f32(tiny_drafter_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_drafter_dir), dtype=torch.float32).eval()


@torch.inference_mode()
def _greedy(model, ids: list[int], max_new: int, eos: set[int]) -> list[int]:
    """Plain greedy decoding with a KV cache: the reference every test compares against."""
    from transformers import DynamicCache

    cache = DynamicCache()
    out: list[int] = []
    feed = list(ids)
    pos = 0
    for _ in range(max_new):
        logits = model(input_ids=torch.tensor([feed]), position_ids=torch.arange(pos, pos + len(feed))[None],
                       past_key_values=cache, use_cache=True).logits[0, -1]
        pos += len(feed)
        token = int(logits.argmax())
        out.append(token)
        if token in eos:
            break
        feed = [token]
    return out


@pytest.fixture(scope="session")
def greedy():
    """greedy(model, prompt_ids, max_new, eos_ids) -> generated ids (EOS included when reached)."""
    return _greedy


@pytest.fixture
def make_client(tiny_model_dir, tiny_drafter_dir):
    """make_client(address, drafter="ngram"|"independent", drafter_dir=None, **link) -> EdgespecClient."""
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link import LinkConfig

    made = []

    def make(address: str, drafter: str = "ngram", drafter_dir=None, tree=None, **link):
        opts = DrafterOptions(name=drafter, model=str(drafter_dir or tiny_drafter_dir), dtype="float32")
        if tree is not None:
            opts = DrafterOptions(name=drafter, model=opts.model, dtype="float32", tree=tree)
        link.setdefault("min_deadline_s", 0.3)
        link.setdefault("connect_timeout_s", 0.5)
        link.setdefault("backoff_initial_s", 0.02)
        link.setdefault("backoff_max_s", 0.2)
        client = EdgespecClient(ClientConfig(LinkConfig(address, **link), opts, tokenizer=str(tiny_model_dir)))
        made.append(client)
        return client

    yield make
    for c in made:
        c.close()
