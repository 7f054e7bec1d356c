"""run_delay: the time a thread waited for a CPU, read per thread, never raising."""

import threading
import time

from torchdoctor.watch import run_delay as rd


def test_run_delay_is_per_thread_and_monotonic() -> None:
    if not rd.AVAILABLE:  # no schedstat on this kernel: the clock uses the wall time instead
        assert rd.run_delay() == -1.0
        return
    first = rd.run_delay()
    time.sleep(0.001)
    assert rd.run_delay() >= first >= 0.0
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(rd.run_delay())) for _ in range(70)]
    for t in threads:  # one after another: more threads than files kept open
        t.start()
        t.join()
    assert len(seen) == 70 and all(v >= 0.0 for v in seen)
    assert len(rd._files) <= 64
    assert rd.run_delay() >= first
