"""clip-before-unscale (TD316): fires on real GradScaler loops that clip scaled gradients, at run time and in
lint; quiet with unscale_ first, without a scaler, with a disabled scaler, and with accelerate's clip."""

import textwrap

import torch
from torch import nn

import torchdoctor


def _loop(unscale: bool, scaler_enabled: bool = True, clip: str = "norm", steps: int = 3):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=scaler_enabled)
    with torchdoctor.watch(model, opt, on_finding=lambda f: None, report=False) as s:
        for _ in range(steps):
            opt.zero_grad()
            scaler.scale(nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1))).backward()
            if unscale:
                scaler.unscale_(opt)
            if clip == "norm":
                torch.nn.utils.clip_grad_norm_((p for p in model.parameters()), 1.0)  # a generator: left unread
            else:
                torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
            scaler.step(opt)
            scaler.update()
    return s


def test_fires_when_clipping_scaled_gradients():
    for clip in ("norm", "value"):
        [f] = _loop(unscale=False, clip=clip).findings
        assert (f.code, f.name, f.location.step) == ("TD316", "clip-before-unscale", 0)
        assert "loss scale (65536)" in f.message and "scaler.unscale_(optimizer)" in f.fix.code


def test_quiet_with_unscale_first_or_a_disabled_scaler():
    assert _loop(unscale=True).findings == []
    assert _loop(unscale=False, scaler_enabled=False).findings == []


def test_the_clip_functions_are_restored_after_the_session():
    original = torch.nn.utils.clip_grad_norm_
    _loop(unscale=True)
    assert torch.nn.utils.clip_grad_norm_ is original


LOOP = """
import torch
from torch.nn.utils import clip_grad_norm_

def train(model, opt, loader, accelerator):
    scaler = torch.amp.GradScaler()
    for x, y in loader:
        opt.zero_grad()
        scaler.scale(model(x).mean()).backward()
        {unscale}
        {clip}
        scaler.step(opt)
        scaler.update()
"""


def _lint(unscale: str, clip: str):
    from torchdoctor import registry
    from torchdoctor.sdk import Example
    from torchdoctor.sdk.testing import run_example

    code = textwrap.dedent(LOOP.format(unscale=unscale, clip=clip))
    return [f.name for f in run_example(registry.get("clip-before-unscale"), Example(code), "source")]


def test_lint_fires_on_a_clip_between_scale_and_step():
    assert _lint("pass", "clip_grad_norm_(model.parameters(), 1.0)") == ["clip-before-unscale"]
    assert _lint("pass", "torch.nn.utils.clip_grad_value_(model.parameters(), 1.0)") == ["clip-before-unscale"]


def test_lint_is_quiet_with_unscale_first_and_on_accelerates_clip():
    assert _lint("scaler.unscale_(opt)", "clip_grad_norm_(model.parameters(), 1.0)") == []
    assert _lint("pass", "accelerator.clip_grad_norm_(model.parameters(), 1.0)") == []
