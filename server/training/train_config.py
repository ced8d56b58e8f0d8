"""The settings of the `edgespec train` steps: the data set (data.py), the feature extraction (extraction.py),
the training loop (trainer.py). They stand apart from their torch-importing modules so that the steps' flags
come from them (shared/config_flags.py) while `edgespec --help` stays fast."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000  # optimizer steps in all
    lr: float = 3e-4  # peak learning rate (AdamW)
    warmup: int = 20  # linear warm-up steps, then cosine decay to lr/10
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    grad_clip: float = 0.5  # max global gradient norm
    batch_tokens: int = 2048  # tokens per optimizer step (summed over windows and processes)
    # The client's drafter attends over the whole context, so a window shorter than the sequences trains a head
    # that never saw the distances it is used at: by default a window is the whole stored sequence.
    window: int = 4096  # longest window cut from one sequence (random start)
    eval_every: int = 100  # steps between validation passes (and at the end)
    eval_depth: int = 6  # draft positions whose acceptance is logged
    eval_sequences: int = 32  # validation sequences per pass (the first ones, for comparable numbers)
    save_every: int = 100  # steps between checkpoints (and at the end)
    seed: int = 0  # data order, windows, noise
    max_wall_s: float = 0.0  # stop (validate, save) once this run has trained this long; 0 = no limit
    grad_accum: int = 1  # micro-batches (separate backward passes) per process and optimizer step
    amp: Literal["auto", "bf16", "off"] = "auto"  # mixed precision: auto = bf16 autocast on CUDA, none on CPU
    log_every: int = 10  # steps between progress lines when not on a terminal
    # A cooldown (the decay of a warmup-stable-decay schedule): the run's last steps, counted from the step it is
    # at when it starts, with the learning rate falling linearly from the schedule's value there to 0. A long run
    # at a steady rate is branched (`train fit --branch-from`) and cooled for each drafter shipped, and keeps going.
    cooldown: int = 0  # steps of the final linear decay to 0; 0 = none
    snapshot_tokens: int = 0  # keep a copy of the drafter in snapshots/tokens-T/ each time the tokens seen pass
    # T = this many times a power of two (0: none): the points of a scaling curve, one per doubling

    # Randomness inside windows: "per-window" (seeded by step and window: the same whatever process or
    # micro-batch draws it), "shared" (one stream with the window draws, as runs before data-parallel
    # training had), "auto": per-window under a launcher (WORLD_SIZE set) or with grad_accum > 1.
    window_rng: str = "auto"

    cache_mb: float = 4096.0  # MiB of decoded training sequences kept in memory (least recently used dropped
    # first; the others are decoded again when drawn): about 100k MoA tokens (41 KB each), safe beside the
    # target's parts and the optimizer on a 24 GB laptop. Validation's few sequences are kept apart.


@dataclass(frozen=True)
class DataConfig:
    seed: int = 0  # chooses the prompts; same seed, same data set
    n_write: int = 200  # "write a function that ..." prompts from docstrings
    n_explain: int = 100  # "explain this code" prompts
    n_code: int = 60  # plain code chunks (no generation; the target's features only)
    n_complete: int = 200  # "complete this function" requests in the words HumanEval is asked in (client_prompts.py)
    n_chat: int = 200  # chat requests of MT-Bench's and Spec-Bench's kinds, about what is on this machine
    code_chars: int = 1500  # characters per code chunk
    max_new_tokens: int = 192  # length cap of the target's responses
    batch_size: int = 8  # prompts generated together (left padding); a CPU is much faster batched
    val_fraction: float = 0.1  # share of samples (by id hash) held out for validation
    source_root: str | None = None  # where prompts come from; None = this interpreter's standard library


@dataclass(frozen=True)
class CaptureConfig:
    """The target's features of every answer `train data` generates, kept as it writes them (answer_capture.py):
    the store `train features` would write from these rows, without running the target over them again."""

    features_out: str | None = None  # feature store folder filled as the answers come (unset: no features)
    features_contents: Literal["full", "hidden"] = "full"  # full: LM-head input, all K/V, TLI activations (MoA); hidden: the LM-head input only (EAGLE)
    features_tli: tuple[int, ...] = (0, 1)  # TLI depths whose target activations a full store keeps


@dataclass(frozen=True)
class FileDataConfig:
    text: tuple[str, ...] = ()  # files or folders of plain text / code (walked, filtered by text_globs)
    chats: tuple[str, ...] = ()  # ShareGPT or OpenAI-style messages JSON / JSONL files
    text_globs: tuple[str, ...] = ()  # file-name globs of text files; () = corpus.DEFAULT_TEXT_GLOBS
    answers: Literal["given", "target"] = "given"  # chat files: "given" keeps their assistant turns, "target"
    # has the target rewrite them (self-distillation)
    chunk_tokens: int = 512  # target tokens per plain-text chunk (one training sequence)
    chunks_per_file: int = 4  # at most this many chunks of one file: many sources beat a few long ones
    max_tokens: int = 0  # stop adding text chunks at about this many tokens; 0 = all
    max_new_tokens: int = 512  # length cap of a regenerated answer
    batch_size: int = 8  # conversations regenerated together
    val_fraction: float = 0.02  # share of samples (by id hash) held out for validation
    val_first: int = 8  # held-out text chunks put first (the rest keep their shuffled place)
    seed: int = 0  # file and chunk order


@dataclass(frozen=True)
class ExtractConfig:
    max_len: int = 1024  # tokens per sequence at most (longer ones are cut)
    tli_depths: tuple[int, ...] = (0, 1, 3)  # TLI depths whose target activations are stored
    # "hidden" stores ~1.2 KB a token for the 1.5B in int8 against ~14 KB with every layer's K/V, and the
    # forward keeps no K/V: the same disk and time hold ten times the tokens for the drafters that need no more.
    contents: Literal["full", "hidden"] = "full"  # full: LM-head input, all K/V, TLI activations (MoA); hidden: the LM-head input only (EAGLE, Beagle)
    batch_tokens: int = 4096  # padded tokens per forward (several sequences each)
    shard_tokens: int = 16384  # tokens per shard file: what a kill can cost at most
    limit: int = 0  # use only the first rows of the data set; 0 = all
    growing: bool = False  # rows are still being appended (a data job beside): a last, unfilled shard waits for a later run
