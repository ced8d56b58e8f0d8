"""The session contract: what a client and the verifier agree on for one session, each defined once.

- ``SamplingSettings``: how the target's next-token distribution is shaped (vLLM's sampling controls).
  The client's configs, the OpenAI layer and the server's Open handling all hold this one type, and it
  checks itself when built: a bad value is refused on the client, before any request goes out, with the
  same message the server would give.
- ``ServerTimings``: the server's own time on one message, as it measures it and as the client reads it.

What Open fixes for a session, with its feature request and its wire form, is ``shared.session_settings``
(apart, as it loads torch with the codec); the codec choice is ``shared.codec.ActivationCodec`` (validated the
same way); every limit of the wire (tree and message sizes, logprob alternatives) is in ``shared.wire``.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

LOGIT_BIAS_LIMIT = 100.0  # OpenAI's and vLLM's clamp of a logit_bias value
PENALTY_LIMIT = 2.0  # presence and frequency penalties lie in [-2, 2]


@dataclass(frozen=True)
class SamplingSettings:
    """How the target's next-token distribution is shaped, in vLLM's order: logit_bias and the penalties
    (``shared.logits_processors``), then temperature, min_p, top_k, top_p (``shared.verification``).
    The defaults are greedy decoding with nothing applied."""

    temperature: float = 0.0  # 0 = greedy (argmax); > 0 divides the logits
    top_p: float = 1.0  # nucleus mass in [0, 1]; 0 or 1 = off
    top_k: int = 0  # keep the k most probable tokens; 0 = off
    min_p: float = 0.0  # drop tokens below min_p x the most probable one's probability (after temperature); 0 = off
    presence_penalty: float = 0.0  # in [-2, 2]: subtracted once a token is in the output
    frequency_penalty: float = 0.0  # in [-2, 2]: subtracted per occurrence of a token in the output
    repetition_penalty: float = 1.0  # > 0: divides (multiplies) a seen token's positive (negative) logit; 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), sorted by id, biases clamped to [-100, 100]
    min_tokens: int = 0  # vLLM's: while the output is shorter, EOS and stop_token_ids are masked out; 0 = off
    stop_token_ids: tuple[int, ...] = ()  # vLLM's: ids that end the output, as EOS does (masked under min_tokens)

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral):
            raise ValueError(f"top_k must be a whole number, got {self.top_k!r}")
        _check("temperature", self.temperature, self.temperature >= 0, ">= 0 (0 = greedy)")
        _check("top_p", self.top_p, 0 <= self.top_p <= 1, "in [0, 1]")
        _check("top_k", self.top_k, self.top_k >= 0, ">= 0 (0 = off)")
        _check("min_p", self.min_p, 0 <= self.min_p <= 1, "in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(name, value, -PENALTY_LIMIT <= value <= PENALTY_LIMIT, "in [-2, 2]")
        _check("repetition_penalty", self.repetition_penalty, self.repetition_penalty > 0, "> 0 (1 = off)")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, numbers.Integral):
            raise ValueError(f"min_tokens must be a whole number, got {self.min_tokens!r}")
        _check("min_tokens", self.min_tokens, self.min_tokens >= 0, ">= 0 (0 = off)")
        stops = tuple(self.stop_token_ids)
        bad_stop = next((t for t in stops if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0), None)
        if bad_stop is not None:
            raise ValueError(f"stop_token_ids must be token ids (whole numbers >= 0), got {bad_stop!r}")
        object.__setattr__(self, "stop_token_ids", tuple(sorted({int(t) for t in stops})))
        bias = dict(self.logit_bias)  # a mapping or pairs; a later pair for the same id wins, as in a dict
        bad = next((t for t in bias if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0), None)
        if bad is not None:
            raise ValueError(f"logit_bias keys must be token ids (whole numbers >= 0), got {bad!r}")
        object.__setattr__(self, "logit_bias", tuple(sorted(
            (int(t), max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, float(b)))) for t, b in bias.items())))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether logit_bias or a penalty changes anything (then the logits are processed per row)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)

    @property
    def processed(self) -> bool:
        """Whether the logits are processed per row: a penalty or logit_bias, or min_tokens' mask."""
        return self.penalized or self.min_tokens > 0

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ValueError when logit_bias or stop_token_ids names a token outside a vocabulary of vocab_size ids."""
        bad = next((t for t, _ in self.logit_bias if t >= vocab_size), None)
        if bad is not None:
            raise ValueError(f"logit_bias names token id {bad}, outside the vocabulary [0, {vocab_size})")
        bad = next((t for t in self.stop_token_ids if t >= vocab_size), None)
        if bad is not None:
            raise ValueError(f"stop_token_ids names token id {bad}, outside the vocabulary [0, {vocab_size})")


def _check(name: str, value: float, ok: bool, should_be: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {should_be}, got {value}")


@dataclass(frozen=True)
class ServerTimings:
    """The server's own time on one message, in nanoseconds (the wire's ``Timings``)."""

    queue_ns: int = 0  # waiting for the model (other sessions' forward passes)
    forward_ns: int = 0  # the target's forward pass
    verify_ns: int = 0  # acceptance decision and KV bookkeeping
    encode_ns: int = 0  # feature extraction and encoding
    total_ns: int = 0  # everything the server spent on the message
    row_cost_ns: int = 0  # Verified: what one more row adds to the server's forwards now (0: not known)
    sharing: float = 0.0  # Verified: items per forward lately; a node costs the others row_cost_ns * (sharing - 1)

    @classmethod
    def of(cls, message) -> "ServerTimings":
        """From anything with the same fields (the wire's ``Timings`` message)."""
        return cls(**{f.name: getattr(message, f.name) for f in dataclasses.fields(cls)})
