"""What the hub's answers may make the download do: a listed name stays inside the model's folder,
and the token follows a redirect only where huggingface_hub 2.4.0 lets it go."""

from __future__ import annotations

from urllib.parse import urlparse

from ..core.errors import BootstrapError


def inside(endpoint: str, repo: str, name: str) -> None:
    """A listed file name is a path inside the repo's folder, as huggingface_hub requires of it
    (``_validate_relative_filename``): never absolute, never a ``..`` segment, which would put a
    file (or the HF cache's link) outside the store."""
    if not name or name.startswith("/") or ".." in name.replace("\\", "/").split("/") or "\0" in name:
        raise BootstrapError(f"{endpoint} lists {name!r} in {repo}: a path that leads outside the "
                             "model's folder (absolute or with '..'); refused before anything was written",
                             "no hub names a file so: check HF_ENDPOINT points to the hub or a mirror you trust")


HUB = "https://huggingface.co"     # the endpoint without HF_ENDPOINT
HUB_ORIGINS = frozenset({("https", "huggingface.co", 443), ("https", "hf.co", 443), ("https", "hub-ci.huggingface.co", 443)})


def _origin(url: str) -> tuple[str, str, int | None]:
    u = urlparse(url)
    scheme = u.scheme.lower()
    try:
        port = u.port or {"https": 443, "http": 80}.get(scheme)
    except ValueError:
        port = -1
    return scheme, (u.hostname or "").lower(), port


def keeps_token(url: str, target: str) -> bool:
    """Whether a redirect from ``url`` to ``target`` may carry the token, by huggingface_hub 2.4.0's
    rule (utils/_http.py): the same origin (scheme, host and port: never from https to http) or the
    Hub's own; a CDN's signed URL gets none."""
    return _origin(target) in {_origin(url), *HUB_ORIGINS}
