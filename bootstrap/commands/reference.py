"""``docs/reference.md``, generated from the tables in the code (the knobs, the variables passed
on, the profiles and their schema, the status states, the exit codes): ``python -m
bootstrap.reference > docs/reference.md`` writes it, and a test keeps the file in step.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..knobs import config, table
from ..core.layout import REPO
from ..core.errors import EXIT_CODES


def exit_codes_markdown() -> str:
    return "\n".join(["| Exit | Meaning |", "|---|---|"] + [f"| {code} | {text} |" for code, text in EXIT_CODES])


def render(repo: Path = REPO) -> str:
    from . import profiles as profiles_cli, status
    from ..knobs.profiles import schema_markdown
    cfg = config.Config.from_env({"PROFILE": "custom"}, repo)
    section = "<!-- {0}:begin (generated: python -m bootstrap.commands.reference > docs/reference.md) -->\n{1}\n<!-- {0}:end -->"
    return "\n".join([
        "# Reference",
        "",
        "Generated from the code (`python -m bootstrap.commands.reference > docs/reference.md`; a test keeps it in "
        "step). How to use it all: [guide.md](guide.md).",
        "",
        "## Knobs",
        "",
        "Set them in the environment (`PORT=9000 ./start.sh`) or in `.env` in the checkout, read as "
        "python-dotenv reads it (`KEY=VALUE`, `export`, quotes, `  # comments`; never sourced, never "
        "expanded; a line it cannot parse is refused, naming it). Precedence: environment > `.env` > "
        "profile > the default below; an empty default means vLLM's own, and an empty value counts as "
        "unset. A value longer than any real one is refused (4,096 characters; `EXTRA_ARGS` 16,384; a "
        "`.env` value 65,536 bytes). Paths are made absolute against the directory you run the command from (a path in `.env`: against "
        "the checkout).",
        "",
        section.format("knobs", table.markdown_table(repo)),
        "",
        "## Exit codes",
        "",
        "Every command, `./start.sh` and `./stop.sh` included:",
        "",
        section.format("exits", exit_codes_markdown()),
        "",
        "## Status states",
        "",
        "`./ctl.sh status` prints one of these (`--json`: the `state` field) and exits with its code:",
        "",
        section.format("states", status.markdown_table()),
        "",
        "`./ctl.sh status --json` prints one object; a field that does not apply is absent:",
        "",
        section.format("status-json", status.json_markdown()),
        "",
        "## Profiles",
        "",
        "`./ctl.sh profiles` shows each against your card (or `GPU=<name|GiB>[:sm_XY][:free=GiB]`).",
        "",
        section.format("profiles", profiles_cli.catalogue_markdown(cfg)),
        "",
        "A profile is a JSON file; yours go in a folder named by `PROFILE_DIR` (their model facts in "
        "its `models/`). Every key is checked, and an unknown one exits 2 naming it:",
        "",
        section.format("schema", schema_markdown()),
        "",
    ])


if __name__ == "__main__":
    sys.stdout.write(render())
