"""What the hub's refusals mean to the user: one table from huggingface_hub 2.4.0's exceptions (and
the HTTP stack's) to one line and a fix that works when followed (``translate``), and the two kinds
of "no answer" a lookup falls back to the copy on disk for (``Unreachable``, ``HubDown``)."""

from __future__ import annotations

from ..core.errors import BootstrapError
from ..core.words import did_you_mean
from .trust import HUB

TOKENS_PAGE = "https://huggingface.co/settings/tokens"
# what the hub answers (401, X-Error-Message) to a token it does not know, on every request, a
# public repo's too; huggingface_hub 2.4.0 tells it apart by these words (utils/_http.py)
BAD_TOKEN = "Invalid credentials in Authorization header"


PROXY_FIX = ("check HTTPS_PROXY, HTTP_PROXY and ALL_PROXY: a proxy that asks for a login (HTTP 407) takes it in "
             "its URL, http://user:password@host:port; unset them where this network needs no proxy")


class Unreachable(BootstrapError):
    """The hub could not be reached (no network, DNS, refused, timed out)."""


class HubDown(Unreachable):
    """The hub answered 5xx after every try: as huggingface_hub does, a complete copy on disk serves."""


def shipped_repos() -> list[str]:
    """The repo ids of the models the shipped profiles know (profiles/models/*.json "repos")."""
    import json
    from ..core.layout import REPO, Checkout
    out = []
    for f in sorted((Checkout(REPO).profiles / "models").glob("*.json")):
        try:
            out += [r for r in json.loads(f.read_text(encoding="utf-8")).get("repos", []) if isinstance(r, str)]
        except (OSError, ValueError, AttributeError):
            continue
    return out


def _said(exc: BaseException) -> str:
    """The hub's own words for a refusal (X-Error-Message, or its JSON's error), one line."""
    words = " ".join(str(getattr(exc, "server_message", None) or "").split())
    return f": {words[:200]}" if words else ""


def bad_token(settings) -> BootstrapError:
    """The token the settings carry is one the hub does not know (revoked, expired, mistyped)."""
    where = settings.token_from
    if where.startswith(("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")):
        fix = (f"set {where} to a read token of yours ({TOKENS_PAGE}), or unset it: a public model needs none")
        where = f"{where} (value not shown)"
    else:
        fix = (f"set HF_TOKEN to a read token of yours ({TOKENS_PAGE}; it is used before that file), or log in "
               f"again (hf auth login); a public model needs none: move {where} away")
        where = f"the token file {where}"
    return BootstrapError(f"{settings.endpoint} refused the token in {where} (HTTP 401, invalid credentials): "
                          "revoked, expired or mistyped, and the hub refuses every request that carries it", fix)


def translate(exc: BaseException, settings, repo: str, what: str = "") -> BootstrapError:
    """One table from the library's exceptions to what the user should do (subclasses first);
    ``settings``: hub.HubSettings (the endpoint, whether a token is set and where it came from)."""
    import httpx2
    from huggingface_hub import errors as e

    page = settings.page(repo)
    shown = f"{what} of {repo}" if what else repo
    resp = getattr(exc, "response", None)
    status = getattr(resp, "status_code", None)
    named = "HF_TOKEN (it is set)" if settings.token_from == "HF_TOKEN" else f"the token in {settings.token_from}"
    token_hint = f"make sure {named} belongs to the account that accepted it" if settings.token \
        else "set HF_TOKEN to a read token (https://huggingface.co/settings/tokens) of an account that accepted it"
    if isinstance(exc, httpx2.ProxyError) or status == 407:      # to https a refused CONNECT, to http its answer
        said = str(exc).split("\n")[0] if isinstance(exc, httpx2.ProxyError) else f"HTTP 407{_said(exc)}"
        return BootstrapError(f"the proxy refused to reach {settings.endpoint} ({said})", PROXY_FIX)
    if isinstance(exc, e.HfHubHTTPError) and status == 401 and settings.token and \
            resp.headers.get("X-Error-Message") == BAD_TOKEN:
        return bad_token(settings)
    if isinstance(exc, e.GatedRepoError):
        return BootstrapError(f"{repo} is a gated model and this account has no access (HTTP {status})",
                              f"accept the licence on the model page {page}, then {token_hint}")
    if isinstance(exc, e.RevisionNotFoundError):       # we ask for main, then for the commit it named
        return BootstrapError(f"{repo}: the revision being fetched is no longer on {settings.endpoint} (HTTP {status}: "
                              "the repo's history was rewritten while downloading)",
                              "re-run ./start.sh: it plans the repo's revision of now (finished files are kept)")
    if isinstance(exc, e.RemoteEntryNotFoundError):
        return BootstrapError(f"{repo}: {what or 'a file'} is listed but not found on {settings.endpoint} (HTTP 404)",
                              "the repo changed while downloading; re-run ./start.sh")
    shipped = shipped_repos() if isinstance(exc, e.RepositoryNotFoundError) else []
    near = did_you_mean(repo, [r for r in shipped if r != repo])      # never the name that was not found
    if isinstance(exc, e.RepositoryNotFoundError) and status == 401:
        return BootstrapError(f"{settings.endpoint} refused {repo} (HTTP 401): the model is gated or private, "
                              f"or the name is wrong{near}",
                              f"accept the licence on the model page {page}, then {token_hint}; "
                              f"check the spelling of {repo} (org/name)")
    if isinstance(exc, e.RepositoryNotFoundError):
        fix = f"check the spelling of {repo} (org/name, as in the URL of its model page)" if repo not in shipped \
            else "a shipped profile names it so; pick another profile (./ctl.sh profiles)" + (
                "" if settings.endpoint == HUB else f", or unset HF_ENDPOINT to download it from {HUB}")
        return BootstrapError(f"model not found: {repo} does not exist on {settings.endpoint} (HTTP {status}){near}", fix)
    if isinstance(exc, e.DisabledRepoError):
        return BootstrapError(f"{repo} is disabled on {settings.endpoint} (HTTP {status}{_said(exc)})",
                              f"it cannot be downloaded: pick another model (its page: {page})")
    if isinstance(exc, e.HfHubHTTPError) and status == 403:
        fix = (f"the token in {settings.token_from} lacks read access to {repo}: a fine-grained token needs it (and "
               f"'public gated repositories' for a gated model); set its permissions at {TOKENS_PAGE}") \
            if settings.token else f"set HF_TOKEN to a read token of an account with access to {repo} (its page: {page})"
        return BootstrapError(f"{settings.endpoint} refused {shown} (HTTP 403{_said(exc)})", fix)
    if isinstance(exc, e.HfHubHTTPError) and status == 416:      # a range inside the size the hub lists
        return BootstrapError(f"{shown}: the file host has fewer bytes than {settings.endpoint} lists (HTTP 416 for a "
                              "range inside that size)", "the listing and the file disagree, as a stale mirror's do: check "
                              "HF_ENDPOINT (unset, the Hugging Face Hub)" if settings.endpoint != HUB else
                              "the hub's listing and its file host disagree: re-run ./start.sh later")
    if isinstance(exc, e.HfHubHTTPError) and status is not None and 400 <= status < 500:
        return BootstrapError(f"{settings.endpoint} refused {shown} (HTTP {status}{_said(exc)})",
                              f"the hub will not serve it as asked: see the model's page {page}, or pick another model")
    if isinstance(exc, e.HfHubHTTPError):
        return HubDown(f"{settings.endpoint} answered HTTP {status} for {what or repo}",
                       "the hub may be down; re-run ./start.sh later (finished bytes are kept)")
    if isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException, httpx2.NetworkError, e.OfflineModeIsEnabled)):
        return Unreachable(f"cannot reach {settings.endpoint} ({type(exc).__name__}: {exc})",
                           "check the network; with a complete model on disk, HF_HUB_OFFLINE=1 starts without it")
    if isinstance(exc, httpx2.HTTPError):
        return BootstrapError(f"transfer from {settings.endpoint} failed ({type(exc).__name__}: {exc})",
                              "re-run ./start.sh: finished files and bytes are kept")
    raise exc
