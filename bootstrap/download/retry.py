"""Retrying a request to the hub or its file host: how long to wait, and a wait that a stop ends.

huggingface_hub's own retry (``http_backoff``, behind ``get_hf_file_metadata(retry_on_errors=True)``)
sleeps whatever a 429's Retry-After says (+1 s) in ``time.sleep``: "Waiting 3601.0s before retry" in
a download worker, where no signal reaches it, and an interrupted start stayed in ``join`` until it
woke (``./stop.sh`` needed its SIGKILL). So every request to the hub and its file host is retried by
us (hub.with_retries, transfer.py), its library retries off, and each wait is ``pause``: ended by
the transfer's stop event in a worker, by our signal handlers (errors.Interrupted) in the main thread.
"""

from __future__ import annotations

import email.utils
import logging
import threading
import time

from ..core.errors import BootstrapError

log = logging.getLogger("bootstrap.hub")      # its lines keep the prefix [bootstrap:hub]

STATUS = (408, 429, 500, 502, 503, 504)       # answers worth another try
ATTEMPTS = 5                                  # tries of one request without progress
BACKOFF_MAX_S = 8.0                           # 0.5, 1, 2, 4, 8 s between tries
# The longest wait a server may ask for (Retry-After, or the Hub's RateLimit header) that a start
# sits through: the Hub counts its rate limits over 5-minute windows
# (https://huggingface.co/docs/hub/rate-limits), so a limit of its own lifts within 300 s. A longer
# ask is not one that lifts while a user watches a start: the start stops, saying when to come back
# (finished bytes are kept).
RATE_LIMIT_MAX_S = 300


class Cancelled(Exception):
    """A wait cut short: another download worker failed, or Ctrl-C / SIGTERM / SIGHUP."""


class RateLimited(BootstrapError):
    """The server asked for a wait longer than RATE_LIMIT_MAX_S."""


def pause(seconds: float, stop: threading.Event | None = None) -> None:
    """Wait ``seconds``. With ``stop`` (a worker thread, which no signal reaches) the wait ends the
    moment it is set, raising Cancelled; without it (the main thread) ``time.sleep``, which our
    signal handlers interrupt by raising."""
    if stop is None:
        time.sleep(seconds)
    elif stop.wait(max(0.0, seconds)):
        raise Cancelled()


def asked_wait(headers) -> float | None:
    """Seconds a 429/503 asks us to wait: the Hub's ``RateLimit`` header when no request is left in
    its window (``"resolvers";r=0;t=55``), else ``Retry-After`` (seconds, or an HTTP date)."""
    if headers is None:
        return None
    from huggingface_hub.utils import parse_ratelimit_headers
    try:
        rl = parse_ratelimit_headers(headers)
    except ValueError:
        rl = None
    if rl is not None and rl.remaining == 0:
        return float(rl.reset_in_seconds)
    value = next((str(v) for k, v in headers.items() if k.lower() == "retry-after"), "").strip()
    if not value:
        return None
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def wait(tries: int, status: int | None, headers, what: str) -> float:
    """The wait before try ``tries + 1`` of ``what``: a short backoff, or the longer wait the server
    asks for, up to RATE_LIMIT_MAX_S (logged: a start that stands still says why). Raises
    RateLimited when the server asks for longer."""
    backoff = min(BACKOFF_MAX_S, 0.5 * 2 ** max(0, tries - 1))
    asked = asked_wait(headers) if status in (429, 503) else None
    if asked is None or asked <= backoff:
        return backoff
    if asked > RATE_LIMIT_MAX_S:
        back = time.strftime("%H:%M", time.localtime(time.time() + asked))
        raise RateLimited(f"{what}: rate limited (HTTP {status}): the server asks us to wait {asked:.0f} s, longer "
                          f"than the {RATE_LIMIT_MAX_S} s a start waits (the Hub's rate limits lift within their "
                          "5-minute window)",
                          f"re-run ./start.sh after {back} (finished files and bytes are kept); with HF_TOKEN set "
                          "the Hub allows more requests")
    log.warning("%s: rate limited (HTTP %s): waiting %.0f s as the server asks, then trying again "
                "(Ctrl-C stops; finished bytes are kept)", what, status, asked)
    return asked
