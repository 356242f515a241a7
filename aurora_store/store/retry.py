"""Semantic retries with backoff (tenacity). Transport retries stay inside botocore.

Retried: :class:`TransientStoreError` (409 conditional conflicts, 5xx that outlived botocore's retries,
timeouts). Never retried: "exists" (412) — that is resolved by reading and comparing — "not found",
auth and malformed-request errors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from tenacity import Retrying, before_sleep_log, retry_if_exception_type, stop_after_attempt, wait_exponential

from aurora_store.config import TransferSettings
from aurora_store.errors import TransientStoreError

T = TypeVar("T")
log = logging.getLogger("aurora.store")


def retrying(settings: TransferSettings,
             exceptions: tuple[type[BaseException], ...] = (TransientStoreError,)) -> Retrying:
    return Retrying(
        retry=retry_if_exception_type(exceptions),
        stop=stop_after_attempt(settings.retries + 1),
        wait=wait_exponential(multiplier=settings.retry_wait_s, max=10 * settings.retry_wait_s + 1),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )


def call(settings: TransferSettings, fn: Callable[[], T]) -> T:
    for attempt in retrying(settings):
        with attempt:
            return fn()
    raise AssertionError("unreachable")  # pragma: no cover
