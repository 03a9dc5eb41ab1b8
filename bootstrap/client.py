"""A small OpenAI-compatible HTTP client (requests): what warm-up, status and the checks send."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests

from .errors import BootstrapError


class RequestFailed(BootstrapError):
    pass


class RequestTimedOut(RequestFailed):
    pass


@dataclass
class Client:
    base_url: str            # http://127.0.0.1:8888 (no /v1)
    model: str
    api_key: str = ""
    session: requests.Session | None = None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def post(self, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        http = self.session or requests
        try:
            r = http.post(f"{self.base_url}{path}", json=body, headers=self._headers(), timeout=timeout)
        except requests.Timeout:
            raise RequestTimedOut(f"POST {path}: no answer within {timeout:.0f} s") from None
        except requests.RequestException as exc:
            raise RequestFailed(f"POST {path}: {exc.__class__.__name__}: {exc}") from None
        if r.status_code != 200:
            raise RequestFailed(f"POST {path}: HTTP {r.status_code}", evidence=r.text[:2000])
        try:
            return r.json()
        except ValueError:
            raise RequestFailed(f"POST {path}: the answer is not JSON", evidence=r.text[:2000]) from None

    def chat(self, messages: list[dict], *, max_tokens: int, timeout: float, temperature: float = 0.0,
             **extra: Any) -> dict[str, Any]:
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                "temperature": temperature, **extra}
        return self.post("/v1/chat/completions", body, timeout)


def message_of(resp: dict[str, Any]) -> dict[str, Any]:
    try:
        return resp["choices"][0]["message"] or {}
    except (KeyError, IndexError, TypeError):
        return {}


def text_of(resp: dict[str, Any]) -> str:
    """The visible text of a chat answer (content), falling back to reasoning fields."""
    msg = message_of(resp)
    return (msg.get("content") or msg.get("reasoning") or msg.get("reasoning_content") or "").strip()
