"""Transfer progress: a progress bar on a terminal, periodic structured log lines otherwise."""

from __future__ import annotations

import logging
import sys
import threading
import time

log = logging.getLogger("aurora.progress")


class Progress:
    """Thread-safe byte counter that reports as it advances."""

    def __init__(self, total: int, description: str, *, interactive: bool | None = None,
                 log_every_s: float = 5.0) -> None:
        self.total = total
        self.description = description
        self.done = 0
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._last_log = self._started
        self._log_every = log_every_s
        interactive = sys.stderr.isatty() if interactive is None else interactive
        self._bar = None
        if interactive and total:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=description, unit="B", unit_scale=True, leave=False)

    def advance(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes
            if self._bar is not None:
                self._bar.update(nbytes)
                return
            now = time.monotonic()
            if now - self._last_log >= self._log_every:
                self._last_log = now
                log.info("%s: %d/%d bytes", self.description, self.done, self.total,
                         extra={"bytes_done": self.done, "bytes_total": self.total})

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elapsed = time.monotonic() - self._started
        log.debug("%s: %d bytes in %.2fs", self.description, self.done, elapsed,
                  extra={"bytes_done": self.done, "seconds": round(elapsed, 3)})

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
