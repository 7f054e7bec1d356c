"""The ``CRASH`` event: when the watched code raises, the checks that explain exceptions look at the
evidence (`torchdoctor.watch.evidence`) and say what happened; their findings lead the report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchdoctor.watch.contract import CrashEvent, Event

if TYPE_CHECKING:
    from torchdoctor.watch.events import EventHub
    from torchdoctor.watch.session import WatchSession


def explain_crash(session: "WatchSession", hub: "EventHub", exc: BaseException) -> list[str]:
    """Deliver `exc` to the crash checks; the names of the pitfalls whose new findings explain it. They are
    not warned about (the report that follows leads with them); a callable `on_finding` still gets them."""
    before = set(session._found)
    if session._follower is not None:
        try:
            session._follower.adopt_called_models()
        except Exception:  # evidence only: never in the way of the user's exception
            pass
    mode = session.on_finding
    if not callable(mode):
        session.on_finding = _quiet
    try:
        hub.dispatch(Event.CRASH, CrashEvent(exc))
    finally:
        session.on_finding = mode
    return list(dict.fromkeys(f.name for key, f in session._found.items() if key not in before))


def _quiet(finding: Any) -> None:
    """`on_finding` while a crash is explained."""
