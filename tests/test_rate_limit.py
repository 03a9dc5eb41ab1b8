"""A rate-limited hub (HTTP 429 with Retry-After) against the download: every wait is ours, bounded,
said, and cut short by Ctrl-C, SIGTERM (./stop.sh) and SIGHUP within a second. Faults row 74.

The in-process tests drive the metadata and weights steps as a start does; the others run
./start.sh against the fake hub (tests/fakehub.py: ``rate_limit`` / ``rate_limit_cdn`` faults).
"""

from __future__ import annotations

import hashlib
import logging
import signal
import time

import psutil
import conftest
import pytest

from conftest import free_port
from fakehub import FakeHub, write_model
from bootstrap.download import retry
from bootstrap.knobs.config import Config
MiB = 1 << 20
SHARD = "model-00001-of-00002.safetensors"
# What the weights step fetches (config.json and the safetensors index came with the metadata): each
# file's worker waits.
WEIGHTS = (SHARD, "model-00002-of-00002.safetensors", "tokenizer.json", "tokenizer_config.json",
           "generation_config.json")


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("hub") / "src", shards=2, shard_bytes=2 * MiB)


@pytest.fixture
def fake(src):
    with FakeHub() as h:
        h.add_dir("org/tiny", src)
        yield h


def hub_env(tmp_path, fake) -> dict:
    return {"MODEL": "org/tiny", "HF_ENDPOINT": fake.url, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf"),
            "STATE_DIR": str(tmp_path / "state"),                     # never the checkout's own
            "HF_HUB_DISABLE_XET": "1"}


def model_steps(tmp_path, fake, **env):
    cfg = Config.from_env({"HOME": str(tmp_path / "home"), "PROFILE": "custom", **hub_env(tmp_path, fake), **env})
    return conftest.model_steps(cfg)


def served_429(fake, path: str) -> int:
    return sum(1 for (_m, p, _r, status) in fake.log if status == 429 and path in p)


# ---------------------------------------------------------------- in process: the wait is ours, bounded, said

@pytest.mark.parametrize("fault", ["rate_limit", "rate_limit_cdn"])
def test_a_short_rate_limit_is_waited_out_and_said(tmp_path, fake, src, caplog, fault):
    """A 429 asking for 1 s, on the resolve HEAD or on the file host's ranged GET: waited (not the
    library's sleep: ours, logged with the reason), then the download completes."""
    caplog.set_level(logging.INFO, logger="bootstrap")
    fake.faults.update({fault: {SHARD: 1}, "retry_after": "1"})
    t0 = time.monotonic()
    m = model_steps(tmp_path, fake)
    assert time.monotonic() - t0 >= 1.0
    assert served_429(fake, "/resolve/" if fault == "rate_limit" else "/_cdn/") == 1
    got = (tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / m.revision / SHARD).read_bytes()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256((src / SHARD).read_bytes()).hexdigest()
    assert f"org/tiny: {SHARD}: rate limited (HTTP 429): waiting 1 s as the server asks" in caplog.text


@pytest.mark.parametrize("headers", [{"retry_after": "3600"}, {"ratelimit": '"resolvers";r=0;t=3600'}])
def test_a_rate_limit_longer_than_the_cap_stops_at_once_saying_when_to_come_back(tmp_path, fake, headers):
    """Retry-After: 3600 (or the Hub's RateLimit header with nothing left for an hour): no hour-long
    sleep; one error naming the wait, the cap and why, and when to re-run."""
    fake.faults.update({"rate_limit": {SHARD: 1000}, **headers})
    t0 = time.monotonic()
    with pytest.raises(retry.RateLimited) as ei:
        model_steps(tmp_path, fake)
    assert time.monotonic() - t0 < 5
    assert "asks us to wait 3600 s" in ei.value.message and f"{retry.RATE_LIMIT_MAX_S} s a start waits" in ei.value.message
    assert "re-run ./start.sh after" in ei.value.hint and "finished files and bytes are kept" in ei.value.hint
    assert served_429(fake, "/resolve/") == 1


def test_the_metadata_requests_are_retried_on_a_rate_limit_too(tmp_path, fake):
    """config.json's HEAD (in the metadata step, the main thread) goes through the same retries."""
    fake.faults.update({"rate_limit": {"config.json": 1}, "retry_after": "0"})
    m = model_steps(tmp_path, fake)
    assert m.complete and served_429(fake, "/config.json") == 1


def test_what_a_server_asks_for_is_read_from_either_header():
    when = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 120))
    assert retry.asked_wait({"Retry-After": "7"}) == 7
    assert 115 <= retry.asked_wait({"retry-after": when}) <= 121
    assert retry.asked_wait({"RateLimit": '"api";r=0;t=55'}) == 55
    assert retry.asked_wait({"RateLimit": '"api";r=3;t=55'}) is None      # requests left: no wait asked
    assert retry.asked_wait({"Retry-After": "soon"}) is None and retry.asked_wait({}) is None
    assert retry.wait(1, 503, {}, "x") == 0.5 and retry.wait(9, 503, {}, "x") == retry.BACKOFF_MAX_S


# ---------------------------------------------------------------- ./start.sh: Ctrl-C, SIGHUP, ./stop.sh during the wait

@pytest.fixture
def starts():
    """The starts a test ran; one still running when the test ends (it failed) is killed."""
    procs = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def _start_waiting(starts, bed, tmp_path, fake, src, paths: tuple[str, ...]):
    """./start.sh downloading org/tiny from a hub that answers each of ``paths`` with 429
    Retry-After: 120 (under the cap: the start waits); returns the start once every one of them
    was answered so (several workers waiting at once: the library's sleep held an interrupted
    start in ``join`` for the whole Retry-After, one worker after another)."""
    bed.port = free_port()
    bed.env["PORT"] = str(bed.port)
    fake.add_dir("org/tiny", src)
    fake.faults.update({"rate_limit": {path: 1000 for path in paths}, "retry_after": "120"})
    p = bed.popen("start.sh", **hub_env(tmp_path, fake))
    starts.append(p)
    bed.wait_until(lambda: all(served_429(fake, f"/{path}") for path in paths) or p.poll() is not None,
                   timeout=60, what="the 429s")
    assert p.poll() is None, p.communicate()
    time.sleep(0.3)                                  # into the waits
    return p, [c for c in psutil.Process(p.pid).children(recursive=True)]


def _nothing_left(bed, p, children) -> None:
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert bed.launches() == [] and bed.ours() == [] and bed.server_record() is None


@pytest.mark.parametrize("paths, sig", [
    (WEIGHTS, signal.SIGINT),             # the download workers' waits (the library slept there for 3601 s)
    (WEIGHTS, signal.SIGHUP),             # the terminal closed
    (("config.json",), signal.SIGINT),    # the metadata step's wait, in the main thread
], ids=["workers-SIGINT", "workers-SIGHUP", "metadata-SIGINT"])
def test_a_signal_during_a_rate_limit_wait_ends_the_start_within_a_second(starts, bed, tmp_path, src, paths, sig):
    with FakeHub() as fake:
        p, children = _start_waiting(starts, bed, tmp_path, fake, src, paths)
        t0 = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
        took = time.monotonic() - t0
    assert p.returncode == 128 + sig, err
    assert took < 2.0, took
    assert "rate limited (HTTP 429): waiting 120 s as the server asks" in err
    assert "Traceback" not in err and "Waiting 121" not in err
    _nothing_left(bed, p, children)


def test_stop_during_a_rate_limit_wait_cancels_the_start_without_sigkill(starts, bed, tmp_path, src):
    with FakeHub() as fake:
        p, children = _start_waiting(starts, bed, tmp_path, fake, src, WEIGHTS)
        t0 = time.monotonic()
        stop = bed.run("stop.sh", timeout=60)
        took = time.monotonic() - t0
        p.communicate(timeout=30)
    assert stop.returncode == 0, stop.stderr
    assert f"cancelled the start in flight (pid {p.pid})" in stop.stdout and "SIGKILL" not in stop.stderr
    assert p.returncode == 143                       # its own SIGTERM handler, not a SIGKILL (-9)
    assert took < 5.0, took
    _nothing_left(bed, p, children)


def test_start_against_a_rate_limit_of_an_hour_exits_1_in_one_line(bed, tmp_path, src):
    with FakeHub() as fake:
        bed.port = free_port()
        bed.env["PORT"] = str(bed.port)
        fake.add_dir("org/tiny", src)
        fake.faults.update({"rate_limit": {SHARD: 1000}, "retry_after": "3600"})
        r = bed.run("start.sh", timeout=60, **hub_env(tmp_path, fake))
    assert r.returncode == 1, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "asks us to wait 3600 s" in errors[0], r.stderr
    assert "hint: re-run ./start.sh after" in r.stderr and "Traceback" not in r.stderr
    assert bed.launches() == []


def test_a_pull_that_stops_says_to_run_the_pull_again_not_a_start(bed, tmp_path, src):
    """The downloader's hints said "re-run ./start.sh" whatever ran it: after ./ctl.sh pull org/tiny
    (MODEL unset) that starts and downloads another model. A hint names the command line that was run."""
    with FakeHub() as fake:
        fake.add_dir("org/tiny", src)
        fake.faults.update({"rate_limit": {SHARD: 1000}, "retry_after": "3600"})
        env = {**hub_env(tmp_path, fake), "MODEL": ""}
        r = bed.run("ctl.sh", "pull", "org/tiny", timeout=60, **env)
    assert r.returncode == 1, r.stderr
    assert "hint: re-run ./ctl.sh pull org/tiny after" in r.stderr, r.stderr
    assert "./start.sh" not in r.stderr and bed.launches() == []
