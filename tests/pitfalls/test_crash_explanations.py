"""Crash explanations (the CRASH event): each fires on a real tiny program that raises its error, or on a
stand-in for CUDA's allocator and NVML, and stays out of the way of unrelated exceptions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor.watch import evidence


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def crash(model, optimizer, body, **kwargs):
    """Run `body` in a watch session; the session and the exception that ended it."""
    s = torchdoctor.watch(model, optimizer, on_finding=lambda f: None, report=False, **kwargs)
    with pytest.raises(BaseException) as info:
        with s:
            body()
    return s, info.value


def names(s) -> list[str]:
    return [f.name for f in s.findings]


def _steps(model, optimizer, n=2, zero=True):
    for _ in range(n):
        if zero:
            optimizer.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 3, (4,))).backward()
        optimizer.step()


# -- out-of-memory -------------------------------------------------------------------------------------


def test_a_broadcast_that_cannot_fit_is_explained_as_a_shape_mistake():
    model = nn.Linear(8, 1)
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(2**21, 8), torch.randn(2**21)

    def body():
        _steps_regression(model, opt, torch.randn(4, 8), torch.randn(4))
        ((model(x) - y) ** 2).mean()

    s, exc = crash(model, opt, body)
    assert "can't allocate memory" in str(exc)
    (finding,) = s.findings
    assert finding.name == "out-of-memory" and "shape mistake" in finding.message
    assert "optimizer state (Adam) 72 bytes" in finding.message  # exp_avg and exp_avg_sq of 9 floats
    assert finding.location.step == 1 and "squeeze(1)" in finding.fix.code
    assert s.facts["crash_explained_by"] == ["out-of-memory"]


def _steps_regression(model, opt, x, y):
    opt.zero_grad()
    ((model(x).squeeze(1) - y) ** 2).mean().backward()
    opt.step()


@pytest.fixture
def fake_gpu(monkeypatch):
    """CUDA's allocator and NVML stood in for: the 'GPU' is the CPU, where the session's tensors live."""
    stats = {
        "memory": evidence.DeviceMemory(allocated=6 << 30, reserved=9 << 30, total=16 << 30, free=1 << 30),
        "others": [(4242, 5 << 30)],
    }
    monkeypatch.setattr(
        evidence, "oom_device", lambda exc: torch.device("cpu") if isinstance(exc, torch.OutOfMemoryError) else None
    )
    monkeypatch.setattr(evidence, "cuda_memory", lambda device: stats["memory"])
    monkeypatch.setattr(evidence, "other_gpu_processes", lambda device: stats["others"])
    return stats


def _cuda_oom():
    raise torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "16.00 GiB of which 1.00 GiB is free."
    )


def test_a_cuda_oom_breaks_memory_down_and_ranks_the_fixes(fake_gpu):
    model = _mlp()
    opt = torch.optim.Adam(model.parameters())

    def body():
        _steps(model, opt)  # gradients stay allocated after the last step: zero_grad comes before the next one
        _cuda_oom()

    s, _ = crash(model, opt, body)
    (finding,) = s.findings
    text, fix = finding.message, finding.fix
    assert "at step 2 allocating 2 GiB" in text and "parameters 780 bytes" in text and "gradients 780 bytes" in text
    assert "optimizer state (Adam) 1.5 KiB, the rest (activations and temporaries) 6 GiB" in text
    assert "Reserved by PyTorch but unused by tensors: 3 GiB — more than the failed allocation" in text
    assert "pid 4242 (5 GiB)" in text
    # ranked by bytes saved: the other process (5 GiB), activation checkpointing (~4 GiB), fragmentation (3 GiB)
    assert fix.title.startswith(
        "Ranked by what they would save: 1) ending the other processes on this GPU (~5 GiB); "
        "2) activation checkpointing"
    )
    assert "expandable_segments" in fix.title and fix.code.startswith("nvidia-smi")
    assert "empty_cache" not in fix.title + fix.code


def test_without_other_processes_or_slack_the_activations_lead(fake_gpu):
    fake_gpu["memory"] = evidence.DeviceMemory(allocated=15 << 30, reserved=15 << 30, total=16 << 30, free=0)
    fake_gpu["others"] = []
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s, _ = crash(model, opt, lambda: (_steps(model, opt), _cuda_oom()))
    fix = s.findings[0].fix
    assert fix.title.startswith("Ranked by what they would save: 1) activation checkpointing")
    assert "expandable_segments" not in fix.title and "other processes" not in fix.title


def test_an_oom_the_program_caught_and_unrelated_errors_are_not_explained(fake_gpu):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def caught_then_other():
        try:
            _cuda_oom()
        except torch.OutOfMemoryError:
            pass  # e.g. retry with a smaller batch
        _steps(model, opt)
        raise KeyError("missing config key")

    s, exc = crash(model, opt, caught_then_other)
    assert isinstance(exc, KeyError) and names(s) == [] and "crash_explained_by" not in s.facts


# -- device-mismatch -----------------------------------------------------------------------------------


def test_a_batch_left_on_another_device_is_named_with_the_layer():
    model = _mlp().to("meta")  # meta stands in for cuda: a second device all the same
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def body():
        x = torch.randn(4, 8)
        x.to("meta")  # the result is dropped
        model(x)

    s, exc = crash(model, opt, body)
    (finding,) = s.findings
    assert finding.name == "device-mismatch"
    assert "Linear `0` holds its parameters on meta (weight, bias); it was handed `input` on cpu" in finding.message
    assert finding.location.module == "0" and "x = x.to(device)" in finding.fix.code
    assert "Move `input` to meta, the device of the model" in finding.fix.title


def test_a_layer_added_after_the_model_was_moved_is_named():
    model = _mlp().to("meta")
    model[2] = nn.Linear(16, 3)  # a new head, created on the CPU after model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s, _ = crash(model, opt, lambda: model(torch.randn(4, 8, device="meta")))
    (finding,) = s.findings
    assert "Linear `2` holds its parameters on cpu" in finding.message and "`input` on meta" in finding.message
    assert "Sequential: 2 parameter tensors on meta, 2 parameter tensors on cpu" in finding.message


def test_an_error_that_mentions_a_device_without_two_devices_is_left_alone():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def body():
        _steps(model, opt)
        raise RuntimeError("no CUDA device is available for the benchmark")

    s, _ = crash(model, opt, body)
    assert names(s) == []


# -- state-dict-mismatch (at run time) ------------------------------------------------------------------


def test_a_new_head_of_another_size_is_named_with_the_keys_to_drop():
    model = _mlp()
    saved = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10)).state_dict()
    s, exc = crash(model, None, lambda: model.load_state_dict(saved))
    (finding,) = s.findings
    assert finding.name == "state-dict-mismatch" and "2.weight: dict [10, 16] vs model [3, 16]" in finding.message
    assert "sd.pop(k)" in finding.fix.code and finding.location.key == "2.weight"


def test_a_load_that_succeeds_or_an_unrelated_error_is_quiet():
    model = _mlp()

    def body():
        model.load_state_dict(_mlp().state_dict())
        raise ValueError("bad learning rate")

    s, _ = crash(model, None, body)
    assert names(s) == []


# -- dataloader-worker-died ------------------------------------------------------------------------------


def _worker_died(signal_name: str):
    """The chain torch raises when a worker dies: the signal handler's error, then the loader's."""
    try:
        raise RuntimeError(f"DataLoader worker (pid 1438) is killed by signal: {signal_name}. ")
    except RuntimeError as inner:
        raise RuntimeError("DataLoader worker (pid(s) 1438) exited unexpectedly") from inner


def test_a_worker_killed_by_a_bus_error_points_at_a_small_dev_shm(monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(64 << 20, 60 << 20, 4 << 20))
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s, _ = crash(model, opt, lambda: _worker_died("Bus error"))
    (finding,) = s.findings
    assert "killed by signal Bus error" in finding.message
    assert (
        "/dev/shm, through which workers hand over batches, is 64 MiB (4 MiB free now) — Docker's default"
        in finding.message
        and "--shm-size" in finding.fix.title
    )
    assert finding.fix.code == "loader = DataLoader(dataset, batch_size=batch_size, num_workers=0)"


def test_a_worker_killed_by_the_kernel_points_at_ram_and_names_the_loader():
    from torch.utils.data import DataLoader

    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(list(range(8)), batch_size=4, num_workers=1)

    def body():
        iter(loader)  # a pass starts (no batch is needed for the check to know the loader)
        _worker_died("Killed")

    s, _ = crash(model, opt, body)
    (finding,) = s.findings
    assert "(the DataLoader had num_workers=1, batch_size=4): the kernel ended it" in finding.message
    assert "available now" in finding.message
    assert finding.fix.code == "loader = DataLoader(dataset, batch_size=4, num_workers=0)"  # fewer than 1


def test_a_runtime_error_that_is_not_a_dead_worker_is_left_alone():
    model = _mlp()
    s, _ = crash(model, None, lambda: (_ for _ in ()).throw(RuntimeError("worker pool exited")))
    assert names(s) == []


# -- cuda-device-assert ----------------------------------------------------------------------------------


def test_labels_numbered_from_one_are_found_in_the_failing_loss():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    y = torch.tensor([1, 10, 3, 10])
    s, exc = crash(model, opt, lambda: nn.functional.cross_entropy(model(torch.randn(4, 8)), y))
    assert "out of bounds" in str(exc)
    (finding,) = s.findings
    assert finding.name == "cuda-device-assert"
    assert "range from 1 to 10, but the output has 10 classes (valid labels 0..9)" in finding.message
    assert "numbered from 1" in finding.message and finding.fix.code == "y = y - 1"


def test_token_ids_past_the_vocabulary_are_found_in_the_failing_embedding():
    model = nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(32, 3))
    s, _ = crash(model, None, lambda: model(torch.tensor([[1, 2, 3, 57]])))
    (finding,) = s.findings
    assert "range from 1 to 57, but it has 50 rows (valid ids 0..49)" in finding.message


def test_after_a_cuda_assert_the_batches_seen_explain_it(monkeypatch):
    from torch.utils.data import DataLoader, TensorDataset
    from torchdoctor.checks.cuda_device_assert import CudaDeviceAssert

    monkeypatch.setattr(CudaDeviceAssert, "record_batches", True)  # as on a machine with CUDA
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(16, 8), torch.arange(16) % 11)  # labels 0..10 for 10 classes
    loader = DataLoader(data, batch_size=8)

    def body():
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y.clamp(max=9)).backward()  # stands in for the CUDA kernel
            opt.step()
        raise RuntimeError(
            "CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously "
            "reported at some other API call"
        )

    s, _ = crash(model, opt, body)
    (finding,) = s.findings
    assert "batch[1] held values up to 10 but Sequential outputs 10 classes (valid labels 0..9)" in finding.message
    assert "`CUDA_LAUNCH_BLOCKING=1 python train.py`" in finding.fix.title
    assert finding.fix.code == "assert 0 <= y.min() and y.max() < num_classes"
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    assert _BaseDataLoaderIter.__next__.__name__ == "__next__"  # the recorder is gone with the session


def test_an_index_error_of_the_programs_own_is_left_alone():
    model = _mlp()
    s, _ = crash(model, None, lambda: [][3])
    assert names(s) == []


# -- collective-timeout ----------------------------------------------------------------------------------


def test_a_timed_out_collective_says_where_this_rank_was(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def body():
        _steps(model, opt, n=3)
        raise dist.DistBackendError(
            "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, "
            "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 "
            "milliseconds before timing out."
        )

    s, _ = crash(model, opt, body)
    (finding,) = s.findings
    assert finding.name == "collective-timeout" and finding.location.rank == 1
    assert finding.message.startswith("Allreduce #42 timed out after 600 s on rank 1 of 2, which had done SGD 3 steps")


def test_a_distributed_error_that_is_not_a_timeout_is_left_alone():
    import torch.distributed as dist

    s, _ = crash(
        _mlp(), None, lambda: (_ for _ in ()).throw(dist.DistBackendError("NCCL error: unhandled system error"))
    )
    assert names(s) == []


# -- dtype-mismatch --------------------------------------------------------------------------------------


def test_numpy_float64_data_into_a_float32_model_is_named():
    import numpy as np

    model = _mlp()
    s, exc = crash(model, None, lambda: model(torch.from_numpy(np.random.rand(4, 8))))
    (finding,) = s.findings
    assert finding.name == "dtype-mismatch" and "`input` as float64" in finding.message
    assert finding.fix.code == "x = x.to(torch.float32)"


def test_an_error_about_dtypes_with_one_dtype_in_sight_is_left_alone():
    model = _mlp()

    def body():
        x = torch.randn(4, 8)
        model(x)
        raise TypeError("expected dtype float32 for the config value")

    s, _ = crash(model, None, body)
    assert names(s) == []


# -- backward-without-graph ------------------------------------------------------------------------------


def test_a_frozen_model_and_a_rebuilt_loss_are_told_apart():
    model = _mlp().requires_grad_(False)
    s, _ = crash(
        model, None, lambda: nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 3, (4,))).backward()
    )
    assert "the model is frozen" in s.findings[0].message and "requires_grad_(True)" in s.findings[0].fix.code
    model = _mlp()
    s, _ = crash(
        model,
        None,
        lambda: torch.tensor(
            nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 3, (4,))).item()
        ).backward(),
    )
    assert "rebuilt from values without a graph" in s.findings[0].message


def test_other_autograd_errors_are_not_this_pitfalls():
    model = _mlp()

    def body():
        loss = nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 3, (4,)))
        loss.backward()
        loss.backward()  # backward through the graph a second time

    s, _ = crash(model, None, body)
    assert "backward-without-graph" not in names(s)


# -- nan-in-loss-input -----------------------------------------------------------------------------------


def test_raw_scores_into_bce_and_broken_weights_are_told_apart():
    model = nn.Sequential(nn.Linear(8, 1))
    x, y = torch.randn(16, 8) * 10, torch.rand(16, 1).round()
    s, _ = crash(model, None, lambda: nn.functional.binary_cross_entropy(model(x), y))
    assert "raw scores, not probabilities" in s.findings[0].message
    assert "binary_cross_entropy_with_logits" in s.findings[0].fix.code
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    s, _ = crash(model, None, lambda: nn.functional.binary_cross_entropy(torch.sigmoid(model(x)), y))
    assert "the weights already hold NaN/Inf (Sequential `0.weight`)" in s.findings[0].message


def test_a_sampling_call_with_valid_probabilities_that_fails_otherwise_is_left_alone():
    s, _ = crash(_mlp(), None, lambda: torch.multinomial(torch.tensor([0.5, 0.5]), 3))  # too many samples
    assert names(s) == []


# -- backward-through-freed-graph, inplace-modified-for-backward ----------------------------------------


def test_a_running_loss_kept_with_its_graph_is_named():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def body():
        total = 0
        for _ in range(2):
            opt.zero_grad()
            total = total + nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 3, (4,)))
            total.backward()  # back-propagates the first step's graph again
            opt.step()

    s, _ = crash(model, opt, body)
    (finding,) = s.findings
    assert "`total`" in finding.message and finding.fix.code.startswith("total = total.detach()")


def test_a_step_between_a_forward_and_its_backward_names_the_weight():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def body():
        out = model(torch.randn(4, 8))
        first = out.sum()
        first.backward(retain_graph=True)
        opt.step()  # changes the weights the second loss goes through
        (out**2).sum().backward()

    s, _ = crash(model, opt, body)
    (finding,) = s.findings
    assert finding.name == "inplace-modified-for-backward"
    assert "it has the shape of Sequential `2.weight`" in finding.message and finding.location.param == "2.weight"
