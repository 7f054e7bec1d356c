"""The names the user's code gives the objects a runtime finding is about, so that its fix pastes: the variable
(`optimizer`, `loader`) or attribute of `self` (`self.optimizer`) that holds it in the user's innermost frames.
Read at the moment the check runs inside the user's call (a forward, a step, an iteration), never stored
beyond the name."""

from __future__ import annotations

import linecache
import warnings
from types import FrameType
from typing import Any, Optional

from torchdoctor.sdk import Fix
from torchdoctor.sdk.runtime import frame_variables, user_frame, user_frames

FRAMES = 4  # the user's frames searched, innermost first


def name_of(obj: Any, default: str, frame: Optional[FrameType] = None, *also: Any) -> str:
    """The user's name for `obj` (or for one of `also`, such as a model's wrapper), else `default`."""
    return find_name(obj, frame or user_frame(2), *also) or default


def find_name(obj: Any, frame: FrameType, *also: Any) -> Optional[str]:
    """The user's name for `obj` (or one of `also`) in `frame` and the user's frames outside it, if any."""
    found = find_binding(obj, frame, *also)
    return found[0] if found else None


def find_binding(obj: Any, frame: FrameType, *also: Any) -> Optional[tuple[str, FrameType]]:
    """The user's name for `obj` (or one of `also`) and the frame that binds it: `frame` or a user's frame
    outside it."""
    return next(iter(bindings(obj, frame, *also)), None)


def bindings(obj: Any, frame: FrameType, *also: Any) -> list[tuple[str, FrameType]]:
    """Every user's name for `obj` (or one of `also`) with its frame, innermost first (a loop's parameter,
    then the caller's variable that was passed to it)."""
    wanted = {id(o) for o in (obj, *also) if o is not None}
    found: list[tuple[str, FrameType]] = []
    if not wanted:
        return found
    try:
        for f in user_frames(frame, limit=FRAMES):
            name = _bound(f, wanted)
            if name:
                found.append((name, f))
    except Exception:  # reading frames must never break the user's step
        pass
    return found


def _bound(frame: FrameType, wanted: set[int]) -> Optional[str]:
    variables = frame_variables(frame)
    for name, value in variables:
        if id(value) in wanted and not name.startswith("_"):
            return name
    for name, value in variables:
        if name == "self":
            for attr, held in list(getattr(value, "__dict__", {}).items())[:200]:
                if id(held) in wanted and not attr.startswith("_"):
                    return f"self.{attr}"
    return None


def source_line(frame: FrameType) -> str:
    """The frame's current line of source, stripped ("" when the file cannot be read)."""
    return linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()


def where(frame: FrameType) -> str:
    """`file:line` of a frame, for a fix's title."""
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class LoaderCall:
    """How the user's code builds a DataLoader, to write it again with other settings: the assignment that
    builds it when the user's file shows one (`loader = DataLoader(train_set, batch_size=64)`, its own text and
    line), else one rebuilt from the loader's settings and the user's names for it and its dataset."""

    def __init__(self, loader: Any, frame: Optional[FrameType] = None) -> None:
        frame = frame or user_frame(2)
        found = bindings(loader, frame) if loader is not None else []
        self.func = "DataLoader"
        self.args: dict[str, str] = {}  # keyword (or "*0", "*1" for positional) -> source text
        self.where = ""
        for self.target, where in found:  # the first frame whose file shows the assignment that builds it
            if self._from_source(where):
                return
        self.target = found[0][0] if found else "loader"
        self.args = _settings(loader, frame) if loader is not None else {"*0": "dataset"}

    def code(self, changes: dict[str, str]) -> str:
        """The assignment with `changes` (keyword -> source text) made, keeping every other argument ("" when
        that changes nothing)."""
        if all(self.args.get(key) == value for key, value in changes.items()):
            return ""
        args = {**self.args, **changes}
        text = ", ".join(value if key.startswith("*") else f"{key}={value}" for key, value in args.items())
        return f"{self.target} = {self.func}({text})"

    def fix(self, what: str, changes: dict[str, str]) -> Fix:
        """`what` to do, with the rewritten line as the code (the title alone when the line stays as it is)."""
        code = self.code(changes)
        return Fix(self.title(what) if code else what, code)

    def title(self, what: str) -> str:
        at = f" ({self.where})" if self.where else ""
        return f"{what}: replace the line that builds `{self.target}`{at} with"

    def _from_source(self, frame: FrameType) -> bool:
        import ast

        name = frame.f_code.co_filename
        text = "".join(linecache.getlines(name))
        if not text or "DataLoader" not in text:
            return False
        try:
            with warnings.catch_warnings():  # its `"\d"` is a SyntaxWarning on Python 3.12: said once already
                warnings.simplefilter("ignore")
                tree = ast.parse(text, name)
        except (SyntaxError, ValueError):
            return False
        found = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and ast.unparse(node.targets[0]) == self.target
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func).endswith("DataLoader")
        ]
        if not found:
            return False
        before = [n for n in found if n.lineno <= frame.f_lineno] or found  # the latest before the loop
        node = max(before, key=lambda n: n.lineno)
        call = node.value
        assert isinstance(call, ast.Call)
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return False  # `**kwargs`: what it holds is not in the text
        self.func = ast.unparse(call.func)
        self.args = {f"*{i}": ast.unparse(a) for i, a in enumerate(call.args)}
        self.args.update({str(k.arg): ast.unparse(k.value) for k in call.keywords})
        self.where = f"{name}:{node.lineno}"
        return True


def _settings(loader: Any, frame: FrameType) -> dict[str, str]:
    """The DataLoader arguments that give `loader`'s settings (those not at their default), with the user's
    names for the objects it holds."""
    from torch.utils.data import RandomSampler
    from torch.utils.data._utils.collate import default_collate

    args = {"*0": name_of(getattr(loader, "dataset", None), "dataset", frame)}
    if getattr(loader, "batch_size", None) is not None:
        args["batch_size"] = str(loader.batch_size)
        if isinstance(getattr(loader, "sampler", None), RandomSampler):
            args["shuffle"] = "True"
        if getattr(loader, "drop_last", False):
            args["drop_last"] = "True"
    workers = getattr(loader, "num_workers", 0)
    if workers:
        args["num_workers"] = str(workers)
    collate = getattr(loader, "collate_fn", None)
    if collate is not None and collate is not default_collate:
        args["collate_fn"] = name_of(collate, getattr(collate, "__name__", "collate_fn"), frame)
    if getattr(loader, "pin_memory", False):
        args["pin_memory"] = "True"
    if workers and getattr(loader, "persistent_workers", False):
        args["persistent_workers"] = "True"
    if workers and getattr(loader, "prefetch_factor", None) not in (None, 2):
        args["prefetch_factor"] = str(loader.prefetch_factor)
    for attr in ("worker_init_fn", "generator"):
        held = getattr(loader, attr, None)
        if held is not None:
            args[attr] = name_of(held, attr, frame)
    return args


def rebuilt_loader(loader: Any, changes: dict[str, str], what: str) -> Fix:
    """The fix that builds `loader` again with `changes` (see `LoaderCall`)."""
    return LoaderCall(loader, user_frame(2)).fix(what, changes)
