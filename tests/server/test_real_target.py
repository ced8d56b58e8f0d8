"""The 1.5B target over real gRPC on loopback: a greedy session equals the model's own greedy generation."""
from __future__ import annotations

import grpc
import pytest
import torch

from edgespec.proto.edgespec.v1 import pb
from edgespec.shared.tree import ROOT, DraftTree, encode_tree
from support.servers import running_server

TARGET = "qwen2.5-coder-1.5b-instruct"


@pytest.mark.slow
@pytest.mark.models
def test_greedy_session_on_the_1_5b_equals_its_own_greedy_generation(open_stream):
    with running_server(TARGET, http_port=None, device=None, dtype=None) as server:  # the default dtype, on CUDA if present
        target = server.core.target
        messages = [{"role": "user", "content": "Write a Python function that checks whether a number is prime, with a docstring and comments."}]
        text = target.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = target.tokenizer(text, add_special_tokens=False)["input_ids"]
        n = 24
        with torch.inference_mode():
            generated = target.model.generate(torch.tensor([prompt]), max_new_tokens=n + 4, do_sample=False,
                                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
        truth = generated[0, len(prompt):].tolist()
        assert len(truth) == n + 4, "the model stopped early; pick a prompt with a longer answer"

        with grpc.insecure_channel(server.address) as channel:
            stream = open_stream(on=channel)
            opened = stream.send(open=pb.Open(session_id="real-1", prompt_ids=prompt,
                                              tokenizer_fingerprint=target.fingerprint)).opened
            committed = [opened.first_token]
            step = 0
            while len(committed) < n:
                done = len(committed)
                # a wrong sibling first, then the right path for up to 3 tokens, then a wrong token
                wrong = (truth[done] + 1) % target.vocab_size
                tree = DraftTree((wrong, truth[done], truth[done + 1], truth[done + 2], wrong),
                                 (ROOT, ROOT, 1, 2, 3))
                step += 1
                v = stream.send(draft=pb.Draft(session_id="real-1", step=step,
                                               committed_len=len(prompt) + done, tree=encode_tree(tree))).verified
                committed += [tree.tokens[i] for i in v.accepted] + [v.bonus_token]
            stream.send(close=pb.Close(session_id="real-1"))
        assert committed == truth[:len(committed)]
