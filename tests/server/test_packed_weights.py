"""A float32 CPU target's packed weights (shared/packed_weights.py): the same products, row by row; the same
parameters; on by default where they were measured, and the server's greedy output unchanged through them."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from edgespec.shared.packed_weights import (
    PackedLinear,
    pack_linears,
    packed_bytes,
    packed_weights_wanted,
    set_packed,
)

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


def _linear(rows_in: int = 96, rows_out: int = 200, bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(rows_in, rows_out, bias=bias)


@pytest.mark.parametrize("bias", [True, False])
def test_packed_products_follow_torchs_within_float32_rounding(bias):
    lin = _linear(bias=bias)
    packed = PackedLinear(lin)
    for shape in [(2, 96), (17, 96), (1, 5, 96), (3, 7, 96), (300, 96)]:
        x = torch.randn(shape)
        with torch.no_grad():
            want, got = lin(x), packed(x)
        assert got.shape == want.shape
        assert torch.allclose(got, want, rtol=0, atol=2e-5 * want.abs().max().item())


def test_one_row_runs_torchs_own_kernel_bit_for_bit():
    lin = _linear()
    packed = PackedLinear(lin)
    x = torch.randn(1, 1, 96)
    with torch.no_grad():
        assert torch.equal(packed(x), lin(x))


def test_a_row_gives_the_same_bits_alone_and_in_any_batch():
    """What makes a tree's rows independent of its size: the packed kernel computes each row alone."""
    packed = PackedLinear(_linear(rows_in=512, rows_out=300))
    x = torch.randn(33, 512)
    with torch.no_grad():
        whole = packed(x)
        for size in (2, 5, 16):
            assert torch.equal(packed(x[:size]), whole[:size])


def test_inactive_modules_compute_on_the_models_own_weight():
    lin = _linear(rows_in=1536, rows_out=512)
    packed = PackedLinear(lin)
    x = torch.randn(8, 1536)
    with torch.no_grad():
        assert not torch.equal(packed(x), lin(x))  # at this length the two kernels sum in different orders
        packed.active = False
        assert torch.equal(packed(x), lin(x))


def test_pack_linears_keeps_the_models_parameters_and_its_outputs(tiny_model_dir):
    from edgespec.shared.models.loading import load_model

    model = load_model(str(tiny_model_dir), device="cpu", dtype="float32").model
    plain = copy.deepcopy(model)
    linears = sum(type(m) is nn.Linear for m in model.modules())
    keys = {k: v.data_ptr() for k, v in model.state_dict().items()}

    assert pack_linears(model) == linears > 0
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == keys  # same names, same tensors
    if model.config.tie_word_embeddings:
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert packed_bytes(model) == sum(m.weight.numel() * 4 for m in plain.modules() if type(m) is nn.Linear)

    ids = torch.randint(0, model.config.vocab_size, (1, 24))
    with torch.no_grad():
        want = plain(ids).logits
        got = model(ids).logits
        assert torch.allclose(got, want, rtol=0, atol=1e-5 * want.abs().max().item())
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        assert set_packed(model, False) == linears
        assert torch.equal(model(ids).logits, want)  # off: exactly the model's own products


def test_packed_weights_are_wanted_for_float32_on_a_cpu_unless_asked_otherwise():
    cpu = torch.device("cpu")
    assert packed_weights_wanted(cpu, torch.float32, None)
    assert not packed_weights_wanted(cpu, torch.bfloat16, None)  # not measured on a CPU that computes bf16
    assert packed_weights_wanted(cpu, torch.bfloat16, True)
    assert not packed_weights_wanted(cpu, torch.float32, False)
    assert not packed_weights_wanted(torch.device("cuda", 0), torch.float32, None)
    with pytest.raises(ValueError, match="need a CPU"):
        packed_weights_wanted(torch.device("cuda", 0), torch.bfloat16, True)


def test_the_default_server_verifies_on_packed_weights(tiny_server):
    """Every other server test then runs through them: the greedy sessions of test_grpc.py compare with the
    unpacked model's own greedy output."""
    model = tiny_server.core.target.model
    assert all(m.active for m in model.modules() if isinstance(m, PackedLinear))
    assert sum(isinstance(m, PackedLinear) for m in model.modules()) > 0
    assert not any(type(m) is nn.Linear for m in model.modules())


def test_a_server_asked_for_none_holds_its_weights_once(tiny_model_dir):
    from support.servers import running_server

    with running_server(tiny_model_dir, packed_weights=False) as handle:
        assert not any(isinstance(m, PackedLinear) for m in handle.core.target.model.modules())


def test_auto_packs_only_where_the_copy_leaves_a_quarter_of_the_memory(tmp_path):
    from edgespec.shared.packed_weights import linear_bytes, memory_allows

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    9000000 kB\n")
    gb = 1024 * 1000 * 1000  # the file's kB are KiB
    assert memory_allows(int(4.9 * gb), str(meminfo))  # 9 - 4.9 >= 16 / 4
    assert not memory_allows(int(5.1 * gb), str(meminfo))
    assert memory_allows(1 << 60, str(tmp_path / "absent"))  # unreadable: no guess against it
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2, bias=False))
    assert linear_bytes(model) == (8 * 4 + 4 * 2) * 4
    assert packed_weights_wanted(torch.device("cpu"), torch.float32, None, model)  # 160 bytes fit anywhere
