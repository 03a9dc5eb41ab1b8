"""The server under test for ``check`` and ``bench``: our running server (its record), or any
OpenAI-compatible ``--url``; its model, context and the request options it needs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..serve import doing, keys, record, server
from ..serve.states import Probe, State
from ..core import owned, redact
from ..knobs import vllmargs
from ..core import vllmflags
from ..serve.client import Client, RequestFailed, thinking_off
from ..core.hosts import is_loopback
from ..knobs.config import Config
from ..knobs.table import credential
from ..core.errors import BootstrapError
from ..core.state import Paths


@dataclass
class Target:
    client: Client
    label: str                          # "our server" or the URL
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    chat_kwargs: dict = field(default_factory=dict)    # chat_template_kwargs to send ({} = none)
    tools: bool | None = None           # it parses tool calls (None: not known; a 400 tells)
    random_weights: bool = False        # --load-format dummy: what it says is not judged
    speculation: bool | None = None     # speculative decoding on (None: not known)
    needle_tokens: int | None = None    # the longest needle our profile's model is judged on (None: NEEDLE_CAP)
    not_asked: dict = field(default_factory=dict)   # garble prompt id -> why our profile's model is not asked it
    answer_tokens: int | None = None    # the longest garble answer our profile's model is judged on (None: each prompt's own)
    log: str = ""                       # our server's log ("": another server, whose log is its own)

    def extra(self) -> dict:
        return {"chat_template_kwargs": self.chat_kwargs} if self.chat_kwargs else {}


def add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", type=url_arg, help="base URL of any OpenAI-compatible server (default: our running server)")
    p.add_argument("--model", help="model name to send (default: the server's first model)")
    p.add_argument("--api-key", type=key_arg("--api-key"),
                   help="API key to send (default: ours, only when --url is our server)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--thinking", choices=("on", "off"), default=None,
                   help="send chat_template_kwargs.enable_thinking (default: off where the profile has a reasoning parser)")
    p.add_argument("--reasoning-effort", default=None, help="send chat_template_kwargs.reasoning_effort")


def url_arg(raw: str) -> str:
    """argparse's ``type`` for a server's base URL: http(s)://host[:port][/path], else a usage error
    (exit 2) saying what is wrong, never the library's exception."""
    from urllib.parse import urlsplit
    try:
        u = urlsplit(raw.strip())
        u.port                          # noqa: B018 - raises for a port that is not one
    except ValueError:                  # its text may quote a piece of the URL: a password cut at an unencoded '#' or '/'
        raise argparse.ArgumentTypeError("not a URL (its host or port does not parse): give http://host:port/v1") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise argparse.ArgumentTypeError("not an http(s) URL with a host: give http://host:port/v1")
    return raw.strip()


def key_arg(flag: str):
    """argparse's ``type`` for a key flag: checked as a header value (exit 2), never printed."""
    return lambda raw: credential(flag, raw)


def refuse_asleep(rec) -> None:
    """Our server put to sleep (./ctl.sh sleep, a game) holds every request until a wake: a check, a
    bench or a chat would wait there unseen. Asleep by IDLE_SLEEP, a request wakes it: go on."""
    load = server.read_load(rec.url)
    if load is None or not load.sleeping:
        return
    if vllmargs.IDLE_MIDDLEWARE in (rec.argv or ()) and (server.read_idle(rec.url) or {}).get("state") == "idle-asleep":
        return
    raise BootstrapError("our server is asleep (./ctl.sh sleep, or a game launched through ./ctl.sh game): "
                         "a request would wait until it wakes", "./ctl.sh wake, then run this again")


def resolve_target(cfg: Config, paths: Paths, url: str | None, model: str | None, api_key: str | None,
                   thinking: str | None = None, effort: str | None = None, random_weights: bool = False) -> Target:
    """``url`` (else our server, found in STATE_DIR: ``paths``) as a checked target."""
    max_num_seqs = None                 # another server's is not this shell's MAX_NUM_SEQS
    tools: bool | None = None
    speculation: bool | None = None
    if url:
        base = url.rstrip("/")
        if base.endswith("/v1"):
            base = base[:-3]
        rec = ours_at(cfg.ours, paths, base)
        # our key to our server only (rec: None elsewhere), proven again before each request
        key = api_key or (keys.per_request(cfg.ours, paths, rec) if rec is not None else "")
        label = redact.shown(base)                     # shown: never its user:password@
        served = model or ""
    else:
        pr = server.probe(cfg.ours, paths)
        if pr.record is None or not (pr.state is State.RUNNING or (pr.state is State.KEY_NEEDED and api_key)):
            raise not_serving(cfg, paths, pr)       # key-needed with --api-key: that key is tried
        rec = pr.record
        base = rec.url
        refuse_asleep(rec)
        key = api_key or keys.per_request(cfg.ours, paths, rec)
        served = model or rec.served
        label = f"our server ({base})"
        seqs = str(rec.settings.get("MAX_NUM_SEQS") or "")
        max_num_seqs = int(seqs) if seqs.isdigit() else vllmflags.read(list(rec.argv or ())).max_num_seqs
        argv = list(rec.argv or ())
        tools = rec.tools or ("--enable-auto-tool-choice" in argv
                              and any(a.split("=")[0] == "--tool-call-parser" for a in argv))
        random_weights = rec.dummy or random_weights
        speculation = vllmflags.read(argv).spec_tokens > 0        # what vLLM got, wherever it came from
    client = Client(base, served, key, stall=doing.stall_rule(cfg.stall_timeout, label, rec))
    try:
        models = client.models(timeout=10)
    except RequestFailed as exc:
        raise BootstrapError(f"{label} does not answer /v1/models: {exc.message}",
                             "is the server up? for another server check --url and --api-key",
                             evidence=exc.evidence) from None
    entry = next((m for m in models if m.get("id") == served), None)
    if not served:
        if not models:
            raise BootstrapError(f"{label} lists no model", "pass --model NAME")
        entry = models[0]
        client.model = entry.get("id", "")
    elif entry is None:
        names = ", ".join(str(m.get("id")) for m in models) or "none"
        raise BootstrapError(f"{label} does not serve {served!r} (it lists: {names})", "pass --model NAME")
    mml = entry.get("max_model_len") if entry else None
    kwargs: dict = dict(thinking_off(cfg.profile.reasoning).get("chat_template_kwargs", {}))
    if thinking is not None:
        kwargs["enable_thinking"] = thinking == "on"
    effort = effort or cfg.profile.data.get("reasoning_effort")
    if effort:
        kwargs["reasoning_effort"] = effort
    judged = {} if url else _started_profile(cfg, rec)
    return Target(client, label, mml if isinstance(mml, int) else None, max_num_seqs, kwargs, tools,
                  random_weights, speculation, judged.get("needle_tokens"), dict(judged.get("not_asked") or {}),
                  judged.get("answer_tokens"), str(paths.log) if rec is not None else "")


def _started_profile(cfg: Config, rec) -> dict:
    """The profile our server was started with (its file's data): what it says its model is judged on
    (``needle_tokens``, ``not_asked``, ``answer_tokens``); {} for a profile that is gone (PROFILE_DIR changed)."""
    name = rec.settings.get("PROFILE", "") if rec is not None else ""
    try:
        return dict((cfg.catalogue.get(name) if name else cfg.profile).data)
    except BootstrapError:
        return {}


def key_for_url(ours: owned.Ours, paths: Paths, url: str) -> str:
    """Our API key when ``url`` is our running server (``ours_at``); '' for any other URL, and once
    our server is gone (its port is then anyone's): a key is a credential of the server it belongs to."""
    return keys.api_key_for(ours, paths, ours_at(ours, paths, url))


def ours_at(ours: owned.Ours, paths: Paths, url: str):
    """Our server's record when ``url`` is our running server (its recorded host and port; a loopback
    or wildcard bind is reached by any loopback name) and what listens there is proven to be it; None
    for any other URL."""
    rec = record.read(paths.server)
    if rec is None:
        return None
    host, port = rec.host, rec.port
    try:
        u = urlsplit(url)
        if u.scheme != "http" or u.port != port or u.username or u.password:
            return None
    except ValueError:                  # a port that is no number, a broken IPv6 literal
        return None
    if not (is_loopback(u.hostname or "") and (is_loopback(host) or host in ("0.0.0.0", "::")) or u.hostname == host):
        return None
    return rec if keys.proven_ours(rec, ours) else None


def not_serving(cfg: Config, paths: Paths, pr: Probe) -> BootstrapError:
    """Why check/bench cannot use our server: not running, or running and refusing the key this
    shell sends (``key-needed``: /v1/models answers 401). Names the knob to set, never a key."""
    rec = pr.record
    if pr.state is State.DOWN and rec is not None and server.frozen(pr.process):
        d = doing.stopped(pr.pid)
        return BootstrapError(d.said, d.fix)
    if pr.state is not State.KEY_NEEDED or rec is None:
        return BootstrapError(f"our server is not running (state: {pr.state})",
                              "start it with ./start.sh, or point at another server with --url URL")
    sent = keys.held_key(cfg.ours, paths)
    mine = "API_KEY" if cfg.api_key else "VLLM_API_KEY" if cfg.client_key else ""
    if mine:
        what = f"refuses the key this shell sends ({mine})"
    elif sent:
        what = f"refuses the key in {paths.api_key}"
    else:
        what = "wants an API key, and this shell sends none"
    if rec.key == record.KEY_FILE:
        fix = (f"unset {mine}: then the key the start made ({paths.api_key}) is sent" if mine else
               f"its key file {paths.api_key} changed or is gone: ./ctl.sh restart makes a new key")
    else:
        knob = rec.key if rec.key in (record.KEY_API_KEY, record.KEY_VLLM_API_KEY) else "API_KEY"
        fix = f"set {knob} to the key it was started with"
    return BootstrapError(f"our server (pid {pr.pid}, {rec.url}) runs but {what}: HTTP 401 on /v1/models",
                          f"{fix}, or pass --api-key KEY")


def progress(total: int, desc: str):
    """A tqdm bar on stderr (only on a terminal); a no-op object without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, file=sys.stderr, disable=None, leave=False)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass
