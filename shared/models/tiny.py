"""Tiny randomly initialised models (Qwen2 by default, or another Hugging Face
decoder architecture) and a matching byte-level tokenizer.

They exercise every code path (tree verification, KV bookkeeping, drafters,
gRPC) in seconds without real weights. The tokenizer is byte-level BPE with no
merges: 256 byte tokens plus Qwen's chat special tokens, so chat templates and
EOS handling behave as with the real models.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Tools are rendered as Qwen2.5's template renders them (a system turn listing them, calls in <tool_call>).
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n\n<tools>{% for tool in tools %}\n{{ tool | tojson }}"
    "{% endfor %}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "{% for call in message.tool_calls or [] %}\n<tool_call>\n{\"name\": \"{{ call.function.name }}\", "
    "\"arguments\": {{ call.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 320  # >= 256 bytes + 3 specials; the rest are unused rows, as in Qwen
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = 4096
    # Larger than the usual 0.02 so logits are peaked: greedy argmax then has
    # clear margins and token-exact tests do not hinge on float rounding.
    init_std: float = 0.25
    seed: int = 0
    arch: str = "qwen2"  # a key of ARCHITECTURES: the architecture matrix tests every one


def tiny_tokenizer():
    """A byte-level tokenizer with Qwen's special tokens and a Qwen-style chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_chars))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIAL_TOKENS)  # ids 256, 257, 258 in Qwen's order
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=SPECIAL_TOKENS)
    tok.chat_template = CHAT_TEMPLATE
    return tok


# Config class and the extra settings that make each architecture what it is at tiny size
# (a sliding window shorter than the test prompts, Gemma2's alternating layers).
ARCHITECTURES: dict[str, tuple[str, dict]] = {
    "qwen2": ("Qwen2Config", {}),
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {"sliding_window": 4096}),
    "phi3": ("Phi3Config", {"pad_token_id": 256}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": 4096}),
}
_EAGER_ONLY = {"gemma2"}  # transformers has no SDPA path for these


def tiny_model(config: TinyConfig = TinyConfig(), dtype: torch.dtype = torch.float32):
    """A randomly initialised causal LM of ``config.arch``, the same for the same config."""
    import transformers

    class_name, extra = ARCHITECTURES[config.arch]
    cfg = getattr(transformers, class_name)(**{
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "max_position_embeddings": config.max_positions, "initializer_range": config.init_std,
        "tie_word_embeddings": False, "bos_token_id": 256, "pad_token_id": 256, "eos_token_id": 258, **extra})
    cfg._attn_implementation = "eager" if config.arch in _EAGER_ONLY else "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return model.to(dtype).eval()


def save_tiny_model(out_dir: str | Path, config: TinyConfig = TinyConfig()) -> Path:
    """Write a tiny model and its tokenizer as a Hugging Face directory (loadable by path)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tiny_model(config).save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out
