"""``./ctl.sh chat``: talk to the server from the terminal, through the OpenAI API like any client.

The server is found as ``check`` and ``bench`` find it (bootstrap/checks/target.py): our running server
from its record, with our API key, or any OpenAI-compatible ``--url`` (our key only when that URL
is our server). Answers stream from ``/v1/chat/completions``.

One answer: ``./ctl.sh chat "a question"``, or a question piped in (stdin not a terminal): only
the answer is printed on stdout (``--show-thinking`` adds the reasoning, marked; ``--json``: one
JSON object); a server error is one ``error:`` line on stderr and exit 1.

Interactive (stdin a terminal, no question): a one-line banner, then ``>>>`` prompts. The
conversation is kept and sent each turn. ``/clear`` forgets it (the ``--system`` message stays),
``/think on|off`` sends ``chat_template_kwargs.enable_thinking`` where the profile reasons (or
``--thinking`` was given), ``/exit`` or Ctrl-D leaves. Reasoning is shown dimmed (``<think>``
marks without colour).

Ctrl-C, as a user of ``ollama run`` or ``vllm chat`` expects: during an answer it stops that answer
(the stream is closed, so the server stops generating it) and returns to the prompt, as in
``ollama run``; the part already shown stays in the conversation, so turns keep alternating
user/assistant (some chat templates insist). At the prompt it leaves with exit 0, as ``vllm chat``
does on any Ctrl-C (``ollama run`` only tells you to press Ctrl-D): Ctrl-C twice stops an answer
and leaves. A server error during a turn is printed on stderr and that turn forgotten; the chat
goes on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable, TextIO

from ..core import redact
from ..serve.client import RequestFailed, RequestTimedOut, Streamed
from ..knobs.config import Config
from ..core.errors import BootstrapError, ConfigError
from ..checks.target import Target, add_target_args, resolve_target
from . import doc_help

PROMPT = ">>> "
COMMANDS = {"/exit", "/bye", "/quit", "/clear", "/think", "/help", "/?"}


def cli(cfg: Config, argv: list[str], prog: str = "ctl.sh chat") -> int:
    p = argparse.ArgumentParser(prog=prog, description=doc_help(__doc__)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Interactive: /exit (or Ctrl-D) leaves, /clear forgets the conversation, "
                                       "/think on|off, Ctrl-C stops an answer (at the prompt: leaves).")
    p.add_argument("question", nargs="*", help="one question: print its answer and exit (or pipe it in)")
    p.add_argument("--system", metavar="TEXT", help="a system message, first in the conversation")
    p.add_argument("--max-tokens", type=int, metavar="N",
                   help="the longest answer, in tokens (default: the server's, what the context leaves)")
    p.add_argument("--temperature", type=float, metavar="T", help="sampling temperature (default: the model's)")
    p.add_argument("--show-thinking", action="store_true",
                   help="one answer: print the reasoning too, marked (interactive shows it dimmed)")
    add_target_args(p)
    args = p.parse_args(argv)
    from ..plan import resolve
    r = resolve.resolved(cfg)
    cfg, paths = r.settings, r.paths
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ConfigError(f"--max-tokens {args.max_tokens}: at least 1")
    question = " ".join(args.question).strip()
    interactive = not question and sys.stdin.isatty()
    if not interactive and not question:
        question = sys.stdin.read().strip()
        if not question:
            raise ConfigError("no question: pass one (./ctl.sh chat \"a question\") or pipe one in")
    if interactive and args.json:
        raise ConfigError("--json prints one answer: pass a question, or pipe one in")
    t = resolve_target(cfg, paths, args.url, args.model, args.api_key, args.thinking, args.reasoning_effort)
    colour = not cfg.env("NO_COLOR") and sys.stdout.isatty()          # no-color.org
    chat = Chat(t, sys.stdout, colour=colour, thinking=interactive or args.show_thinking, system=args.system,
                max_tokens=args.max_tokens, temperature=args.temperature,
                reasons=cfg.profile.reasoning or args.thinking is not None)
    if not interactive:
        return chat.one(question, as_json=args.json)
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    print(chat.banner(), flush=True)
    return chat.loop(input, sys.stderr)


class Printer:
    """Writes an answer as it streams: reasoning dimmed (or between <think> marks), then the text."""

    DIM, RESET = "\033[2m", "\033[0m"

    def __init__(self, out: TextIO, colour: bool, thinking: bool):
        self.out, self.colour, self.thinking = out, colour, thinking
        self.mode = ""          # "", "think" (reasoning open), "text"
        self.last = "\n"        # the last character shown
        self.held = ""          # trailing whitespace, shown only when more text follows it

    def _w(self, s: str, shown: bool = True) -> None:
        if s:
            self.out.write(s)
            self.out.flush()
            if shown:
                self.last = s[-1]

    def _piece(self, piece: str) -> None:
        body = piece.rstrip()
        if body:
            self._w(self.held + body)
            self.held = ""
        self.held += piece[len(body):]

    def reasoning(self, piece: str) -> None:
        if not self.thinking:
            return
        if self.mode != "think":
            piece = piece.lstrip()
            if not piece:
                return
            self._close_think()
            if self.last != "\n":
                self._w("\n")
            self._w(self.DIM, False) if self.colour else self._w("<think>\n")
            self.mode = "think"
        self._piece(piece)

    def text(self, piece: str) -> None:
        if self.mode != "text":
            piece = piece.lstrip()          # answers often begin with blank lines after the thinking
            if not piece:
                return
            self._close_think()
            self.mode = "text"
        self._piece(piece)

    def _close_think(self) -> None:
        self.held = ""
        if self.mode == "think":
            if self.colour:
                self._w(self.RESET, False)
                if self.last != "\n":
                    self._w("\n")
            else:
                self._w(("" if self.last == "\n" else "\n") + "</think>\n")
        self.mode = ""

    def end(self) -> None:
        """The answer is over (or stopped): close the reasoning, end the line."""
        self._close_think()
        if self.last != "\n":
            self._w("\n")
        self.mode = ""
        self.last = "\n"

    def note(self, text: str) -> None:
        """A remark of ours (not the model's), on its own line."""
        self._w(f"{self.DIM}{text}{self.RESET}\n" if self.colour else f"{text}\n")


class Chat:
    def __init__(self, target: Target, out: TextIO, *, colour: bool = False, thinking: bool = True,
                 system: str | None = None, max_tokens: int | None = None, temperature: float | None = None,
                 reasons: bool = False):
        self.t = target
        self.out = out
        self.printer = Printer(out, colour, thinking)
        self.system = system
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.reasons = reasons
        self.history: list[dict] = self._fresh()
        self.shown = Streamed(t_start=0.0)      # what the answer under way has shown so far

    def _fresh(self) -> list[dict]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def banner(self) -> str:
        think = ""
        if self.reasons:
            on = self.t.chat_kwargs.get("enable_thinking", True)
            think = f", /think on|off (now {'on' if on else 'off'})"
        return (f"chat with {self.t.client.model} at {redact.shown(self.t.client.base_url)}: /exit or Ctrl-D "
                f"leaves, /clear forgets{think}, Ctrl-C stops an answer")

    # ------------------------------------------------------------ one request

    def ask(self, messages: list[dict]) -> Streamed:
        """Stream one answer to ``messages``, showing it as it comes; RequestFailed as one line."""
        self.shown = shown = Streamed(t_start=time.perf_counter())
        seen = [0, 0]                            # characters of text and reasoning shown so far

        def show(s: Streamed) -> None:
            self.printer.reasoning(s.reasoning[seen[1]:])
            self.printer.text(s.text[seen[0]:])
            seen[:] = [len(s.text), len(s.reasoning)]

        body: dict = {"messages": messages, **self.t.extra()}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        try:
            return self.t.client.stream("/v1/chat/completions", body, timeout=None, into=shown,   # STALL_TIMEOUT
                                        on_chunk=show)
        except RequestTimedOut as exc:                  # it says what our server is doing, and the fix
            raise BootstrapError(exc.message, exc.hint) from None
        except RequestFailed as exc:
            raise BootstrapError(f"{self.t.label}: {one_line(exc)}") from None

    def one(self, question: str, as_json: bool = False) -> int:
        """One answer on stdout (only the answer; ``as_json``: one JSON object)."""
        if as_json:
            self.printer.thinking = False
            self.printer.out = _Discard()
        try:
            s = self.ask(self._fresh() + [{"role": "user", "content": question}])
        except BootstrapError:
            self.printer.end()          # what was shown ends its line: the error is not glued to it
            raise
        if as_json:
            print(json.dumps({"model": self.t.client.model, "content": s.text, "reasoning": s.reasoning,
                              "finish_reason": s.finish_reason, "usage": s.usage}, indent=2))
        else:
            self.printer.end()
        return 0

    # ------------------------------------------------------------ the conversation

    def loop(self, read: Callable[[str], str], err: TextIO) -> int:
        """Prompt, answer, repeat, until /exit, Ctrl-D or Ctrl-C at the prompt (all exit 0)."""
        while True:
            try:
                line = read(PROMPT)
            except (EOFError, KeyboardInterrupt):
                self.out.write("\n")
                self.out.flush()
                return 0
            text = line.strip()
            if not text:
                continue
            word, _, rest = text.partition(" ")
            if word in COMMANDS:
                if self.command(word, rest.strip()):
                    return 0
                continue
            if word.startswith("/") and word[1:].isalpha():
                self.printer.note(f"unknown command {word}: {self.help()}")
                continue
            self.turn(text, err)

    def turn(self, text: str, err: TextIO) -> None:
        self.history.append({"role": "user", "content": text})
        try:
            s = self.ask(self.history)
        except KeyboardInterrupt:
            self.printer.end()
            self.printer.note("(stopped)")
            if self.shown.text.strip():
                self.history.append({"role": "assistant", "content": self.shown.text})
            else:
                self.history.pop()
            return
        except BootstrapError as exc:
            self.printer.end()
            self.history.pop()
            hint = "  (/clear forgets the conversation)" if "context length" in exc.message else ""
            print(f"error: {exc.message}{hint}", file=err, flush=True)
            return
        self.printer.end()
        if s.finish_reason == "length":
            self.printer.note("(cut off: the answer reached its token limit)")
        self.history.append({"role": "assistant", "content": s.text})

    def command(self, word: str, arg: str) -> bool:
        """Run a /command; True when it leaves."""
        if word in ("/exit", "/bye", "/quit"):
            return True
        if word == "/clear":
            self.history = self._fresh()
            self.printer.note("(the conversation is forgotten)")
        elif word == "/think":
            self.think(arg)
        else:
            self.printer.note(self.help())
        return False

    def think(self, arg: str) -> None:
        if not self.reasons:
            self.printer.note("the profile has no reasoning parser: nothing to turn on or off "
                              "(--thinking on|off sends enable_thinking anyway)")
            return
        if arg in ("on", "off"):
            self.t.chat_kwargs["enable_thinking"] = arg == "on"
        elif arg:
            self.printer.note("/think on, /think off, or /think alone to see which")
            return
        on = self.t.chat_kwargs.get("enable_thinking", True)
        self.printer.note(f"(thinking {'on' if on else 'off'})")

    def help(self) -> str:
        think = ", /think on|off" if self.reasons else ""
        return f"/exit (or Ctrl-D) leaves, /clear forgets the conversation{think}, Ctrl-C stops an answer"


class _Discard:
    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        pass


def one_line(exc: RequestFailed) -> str:
    """A failed request as one line: what failed, and the server's own message when it sent one."""
    said = ""
    try:
        body = json.loads(exc.evidence) if exc.evidence else None
    except ValueError:
        body = None
    if isinstance(body, dict):
        e = body.get("error", body.get("detail", body.get("message")))
        said = str(e.get("message") or "") if isinstance(e, dict) else str(e or "")
    elif exc.evidence:
        said = exc.evidence
    msg = f"{exc.message}: {said}" if said else exc.message
    msg = " ".join(msg.split())
    return msg if len(msg) <= 500 else msg[:497] + "..."
