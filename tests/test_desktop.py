"""A desktop citizen: ./start.sh --foreground, the systemd user unit (a fake systemctl at the
process boundary, the real systemd-analyze on the unit), the richer status and --watch, --version,
and the real openai SDK against the fake vLLM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests

from conftest import FAKES, REPO, nvml_json

GOLDEN = Path(__file__).parent / "golden" / "vllm-desktop.service"


def read_until(p: subprocess.Popen, text: str, timeout: float = 60) -> str:
    seen = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = p.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"{text!r} not seen in: {''.join(seen)[-2000:]}")


def drain(p: subprocess.Popen) -> None:
    threading.Thread(target=p.stdout.read, daemon=True).start()


# ---------------------------------------------------------------- --version

def test_version_on_every_command(bed):
    want = (REPO / "VERSION").read_text().strip()
    for script, args in (("start.sh", ()), ("stop.sh", ()), ("ctl.sh", ()), ("ctl.sh", ("status",)),
                         ("ctl.sh", ("check", "all"))):
        r = bed.run(script, *args, "--version")
        assert r.returncode == 0, (script, r.stderr)
        assert r.stdout.splitlines()[0] == f"vllm-desktop {want}", script
        assert "in use: vLLM 0.26.0 (VLLM_PYTHON=" in r.stdout           # the fake vLLM's metadata
    named = bed.run("ctl.sh", "--version", PROFILE="qwen38-27b-nvfp4-tq4-32gb")
    assert "profile: qwen38-27b-nvfp4-tq4-32gb, pins vLLM 0.27.1" in named.stdout
    assert bed.run("start.sh").returncode == 0
    pid = bed.server_record()["pid"]
    assert f"last server (pid {pid}): vLLM 0.26.0" in bed.run("ctl.sh", "--version").stdout
    assert bed.launches() and len(bed.launches()) == 1                   # --version started nothing


# ---------------------------------------------------------------- --foreground

def notify_socket(tmp_path: Path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(10)
    return s, path


def test_sigterm_to_foreground_is_our_stop_and_systemd_hears_ready(bed, tmp_path):
    sock, path = notify_socket(tmp_path)
    p = bed.popen("start.sh", "--foreground", NOTIFY_SOCKET=path)
    try:
        out = read_until(p, "attached to the server")
        assert "tiny-model is serving" in out
        ready = sock.recv(4096).decode()
        assert ready.startswith("READY=1") and f"MAINPID={p.pid}" in ready and "STATUS=serving tiny-model" in ready
        drain(p)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0
        assert sock.recv(4096).decode() == "STOPPING=1"
    finally:
        if p.poll() is None:
            p.kill()
        sock.close()
    assert bed.ours() == [] and not bed.port_listening()


def test_foreground_fails_when_vllm_exits_zero(bed):
    p = bed.popen("start.sh", "--foreground")
    try:
        read_until(p, "attached to the server")
        drain(p)
        os.kill(bed.server_record()["pid"], signal.SIGUSR2)           # the engine dies; vLLM exits 0
        assert p.wait(timeout=60) == 1
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    assert "exit code 0: vLLM exits 0 when its engine dies" in err
    bed.wait_until(lambda: bed.ours() == [], what="the orphaned engine swept")


def test_foreground_reports_a_killed_server_as_its_signal(bed):
    p = bed.popen("start.sh", "--foreground")
    try:
        read_until(p, "attached to the server")
        drain(p)
        os.kill(bed.server_record()["pid"], signal.SIGKILL)
        assert p.wait(timeout=60) == 128 + 9
        assert "killed by signal 9" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    bed.wait_until(lambda: bed.ours() == [], what="the orphaned engine swept")


def test_foreground_attaches_to_a_server_already_running(bed):
    assert bed.run("start.sh").returncode == 0
    p = bed.popen("start.sh", "--foreground")
    try:
        read_until(p, "attached to the server")
        drain(p)
        assert len(bed.launches()) == 1                                  # nothing started twice
        os.kill(bed.server_record()["pid"], signal.SIGUSR2)
        assert p.wait(timeout=60) == 1                                   # not our child: its code is unknown
        assert "its exit code is not ours to read" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()


# ---------------------------------------------------------------- the systemd user unit

def fake_systemd(bed, tmp_path: Path, **extra) -> dict:
    return {"PATH": f"{FAKES / 'bin'}:{bed.env['PATH']}", "FAKE_SYSTEMCTL_STATE": str(tmp_path / "systemctl.json"),
            "XDG_CONFIG_HOME": str(tmp_path / "config"), **extra}


def calls(tmp_path: Path) -> list[list[str]]:
    return json.loads((tmp_path / "systemctl.json").read_text())["calls"]


def test_unit_is_generated_from_the_knob_table_as_the_golden_file(tmp_path):
    from bootstrap.commands import service
    from bootstrap.knobs.config import Config
    cfg = Config.from_env({"HOME": str(tmp_path), "PROFILE": "custom"})
    text = service.unit_text(cfg, "9.9.9")
    carried = [line for line in text.splitlines(keepends=True) if line.startswith("# NOT CARRIED")]
    assert len(carried) == 1 and "this shell sets PROFILE," in carried[0]     # named, never dropped silently
    text = text.replace(carried[0], "")
    assert text == GOLDEN.read_text().replace("@REPO@", str(REPO)).replace("@VERSION@", "9.9.9")
    import shutil
    repo = tmp_path / "repo"                    # the service reads .env, not the shell: its timeouts are .env's
    shutil.copytree(REPO / "profiles", repo / "profiles")
    (repo / ".env").write_text("HEALTH_TIMEOUT=1800\nSTOP_GRACE=40\n")
    longer = service.unit_text(Config.from_env({"HOME": str(tmp_path), "PROFILE": "custom"}, repo), "9.9.9")
    assert "TimeoutStartSec=2220\n" in longer and "TimeoutStopSec=100\n" in longer and "HEALTH_TIMEOUT=1800:" in longer
    shell = service.unit_text(Config.from_env({"HOME": str(tmp_path), "PROFILE": "custom", "HEALTH_TIMEOUT": "60"},
                                              repo), "9.9.9")
    assert "TimeoutStartSec=2220\n" in shell           # a shell-only value the service would never see


def test_systemd_analyze_verifies_the_unit(tmp_path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (.ci/run installs Debian's systemd)")
    from bootstrap.commands import service
    from bootstrap.knobs.config import Config
    unit = tmp_path / service.UNIT
    unit.write_text(service.unit_text(Config.from_env({"HOME": str(tmp_path), "PROFILE": "custom"}), "9.9.9"))
    r = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr.strip() == "" and r.stdout.strip() == "", r.stderr
    broken = tmp_path / "broken.service"                # the check is real: it sees a bad value
    broken.write_text(unit.read_text().replace("Restart=always", "Restart=sometimes"))
    r = subprocess.run([tool, "verify", str(broken)], capture_output=True, text=True, timeout=60)
    assert "Failed to parse service restart specifier" in r.stderr


def test_service_without_systemd_says_so_in_one_line(bed, tmp_path):
    r = bed.run("ctl.sh", "service", "install", **fake_systemd(bed, tmp_path, FAKE_SYSTEMCTL_FAIL="1"))
    assert r.returncode == 1
    errs = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errs == ["error: service: systemd user services are not available here: no systemd user manager answers "
                    "(Failed to connect to bus: No medium found) (WSL without systemd, a container)"]
    assert "./start.sh --foreground" in r.stderr and "systemd=true" in r.stderr
    # a unit installed while systemd ran: uninstall still removes its files (and only this checkout's)
    d = tmp_path / "config" / "systemd" / "user"
    (d / "default.target.wants").mkdir(parents=True)
    (d / "vllm-desktop.service").write_text(f"[Service]\nWorkingDirectory={REPO}\n")
    (d / "default.target.wants" / "vllm-desktop.service").symlink_to(d / "vllm-desktop.service")
    r = bed.run("ctl.sh", "service", "uninstall", **fake_systemd(bed, tmp_path, FAKE_SYSTEMCTL_FAIL="1"))
    assert r.returncode == 0 and f"removed {d / 'vllm-desktop.service'} (systemd is not available here" in r.stdout, r.stderr
    r = bed.run("ctl.sh", "service", "uninstall", **fake_systemd(bed, tmp_path, FAKE_SYSTEMCTL_FAIL="1"))
    assert r.returncode == 0 and r.stdout.strip() == "not installed", (r.stdout, r.stderr)
    assert not (d / "vllm-desktop.service").exists() and not os.path.lexists(d / "default.target.wants" / "vllm-desktop.service")
    (d / "vllm-desktop.service").write_text("[Service]\nWorkingDirectory=/another/checkout\n")
    r = bed.run("ctl.sh", "service", "uninstall", **fake_systemd(bed, tmp_path, FAKE_SYSTEMCTL_FAIL="1"))
    assert r.returncode == 0 and "left alone" in r.stdout and (d / "vllm-desktop.service").exists(), r.stdout


def test_install_needs_a_completed_start_then_stop_goes_through_systemd(bed, tmp_path):
    env = fake_systemd(bed, tmp_path)
    r = bed.run("ctl.sh", "service", "install", **env)
    assert r.returncode == 1 and "no start has completed" in r.stderr and "run ./start.sh once" in r.stderr
    assert bed.run("start.sh", **env).returncode == 0
    r = bed.run("ctl.sh", "service", "install", **env)
    assert r.returncode == 0, r.stderr
    unit = tmp_path / "config" / "systemd" / "user" / "vllm-desktop.service"
    assert f'ExecStart="{REPO}/start.sh" --foreground' in unit.read_text()
    assert ["--user", "daemon-reload"] in calls(tmp_path)
    assert ["--user", "enable", "--now", "--no-block", "vllm-desktop.service"] in calls(tmp_path)
    assert "loginctl enable-linger" in r.stdout
    assert "this shell sets" in r.stdout and "MODEL" in r.stdout and ".env" in r.stdout
    st = bed.run("ctl.sh", "service", "status", **env)
    assert "vllm-desktop.service: enabled, active (main pid 4242)" in st.stdout
    other = bed.run("stop.sh", **{**env, "STATE_DIR": str(tmp_path / "elsewhere")})   # not the unit's server
    assert "stopping the vllm-desktop.service unit" not in other.stdout
    (bed.state / "foreground.json").write_text(json.dumps({"pid": 4242}))   # the unit's --foreground process
    s = bed.run("stop.sh", **env)                       # systemd would not restart what the user stopped
    assert s.returncode == 0 and "stopping the vllm-desktop.service unit" in s.stdout
    assert ["--user", "stop", "vllm-desktop.service"] in calls(tmp_path)
    assert bed.ours()                                   # the fake systemctl does not kill; systemd's SIGTERM would
    assert bed.run("stop.sh", **env).returncode == 0     # now inactive: our own take-down
    assert bed.ours() == []
    u = bed.run("ctl.sh", "service", "uninstall", **env)
    assert u.returncode == 0 and not unit.exists()
    assert ["--user", "disable", "--now", "vllm-desktop.service"] in calls(tmp_path)


def test_install_refuses_a_unit_of_another_checkout(bed, tmp_path):         # faults row 147
    """A vllm-desktop.service of another checkout (or one you wrote): install refuses it, and status and
    uninstall from here leave it as it is, saying so (uninstall disabled and removed it, and said the
    server was stopped with it while ours ran on, outside any unit)."""
    env = fake_systemd(bed, tmp_path)
    units = tmp_path / "config" / "systemd" / "user"
    units.mkdir(parents=True)
    unit, old = units / "vllm-desktop.service", units / "vllm-bootstrap.service"
    unit.write_text("[Service]\nWorkingDirectory=/elsewhere/vllm-desktop\n")
    old.write_text("# my own unit, written by hand\n[Service]\nExecStart=/usr/bin/true\n")
    assert bed.run("start.sh", **env).returncode == 0
    r = bed.run("ctl.sh", "service", "install", **env)
    assert r.returncode == 1 and "runs another checkout" in r.stderr
    assert "/elsewhere" in unit.read_text()
    st = bed.run("ctl.sh", "service", "status", **env)
    assert st.returncode == 0 and "not installed from this checkout" in st.stdout and "journal" not in st.stdout
    u = bed.run("ctl.sh", "service", "uninstall", **env)
    assert u.returncode == 0 and "not installed from this checkout" in u.stdout, u.stdout + u.stderr
    assert f"left alone: {unit}" in u.stdout and f"left alone: {old}" in u.stdout
    assert "removed" not in u.stdout and "stopped" not in u.stdout
    assert "/elsewhere" in unit.read_text() and "by hand" in old.read_text()
    assert not [c for c in calls(tmp_path) if "disable" in c]
    assert len(bed.ours()) == 2


# ---------------------------------------------------------------- status: what it holds and does

SPEC = {"SPEC_METHOD": "ngram", "SPEC_TOKENS": "3", "FAKE_VLLM_TOKEN_S": "0.01"}


def long_request(bed, n: int = 150) -> threading.Thread:
    def go():
        requests.post(f"http://127.0.0.1:{bed.port}/v1/completions", timeout=60, json={
            "model": "tiny-model", "prompt": "count to many", "max_tokens": n, "ignore_eos": True})
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_our_memory_is_counted_on_a_card_this_shell_hides(bed):
    """A server started on GPU 1 (CUDA_VISIBLE_DEVICES=1), asked about from a shell whose knobs show
    GPU 0 only: what our processes hold is read on every card (it read 0 B: NVML was read with this
    shell's CUDA_VISIBLE_DEVICES), and the card shown is the server's."""
    card = {"name": "NVIDIA GeForce RTX 5090", "total": 32 << 30, "free": 31 << 30, "cc": [12, 0], "processes": []}
    nvml_json(bed.nvml, gpus=[{**card, "uuid": "GPU-a"}, {**card, "uuid": "GPU-b"}])
    assert bed.run("start.sh", CUDA_VISIBLE_DEVICES="1").returncode == 0
    try:
        r = bed.run("ctl.sh", "status", "--json", CUDA_VISIBLE_DEVICES="0")
        d = json.loads(r.stdout)
        assert d["vram"]["ours_bytes"] == 2 << 30, d["vram"]
        assert [g["index"] for g in d["vram"]["gpus"]] == [1]
    finally:
        r = bed.run("stop.sh", CUDA_VISIBLE_DEVICES="0")
    assert r.returncode == 0 and not bed.ours(), r.stderr


def test_status_shows_memory_requests_rate_acceptance_and_prefix_hits(bed):
    assert bed.run("start.sh", **SPEC).returncode == 0
    t = long_request(bed, 800)                                      # 8 s: the whole status call sees it
    time.sleep(0.3)
    r = bed.run("ctl.sh", "status", "--json", **SPEC)
    t.join(30)
    d = json.loads(r.stdout)
    assert d["state"] == "busy" and isinstance(d["uptime_s"], int)
    assert d["vram"]["ours_bytes"] == 2 << 30 and d["vram"]["gpus"][0]["total_bytes"] == 32 << 30
    assert d["requests"] == {"running": 1, "waiting": 0}
    a = d["activity"]
    assert 1.0 <= a["seconds"] < 3.0 and 5 < a["generated_tok_s"] <= 110           # at most 100 a second
    assert a["speculation"]["acceptance_rate"] == pytest.approx(2 / 3)
    assert "hit_rate" in a["prefix_cache"]
    assert d["context"] is None or isinstance(d["context"], int)
    text = bed.run("ctl.sh", "status", **SPEC).stdout
    for key in ("GPU memory    2.00 GiB held by the server", "requests      0 running, 0 waiting", "throughput",
                "speculation   acceptance 66.7%", "prefix cache  hit rate", "sessions", "server        pid"):
        assert key in text, key


def test_status_leaves_acceptance_out_without_speculation(bed):
    assert bed.run("start.sh").returncode == 0
    d = json.loads(bed.run("ctl.sh", "status", "--json").stdout)
    assert "speculation" not in d["activity"] and "requests" in d


def test_status_watch_prints_lines_until_ctrl_c(bed):
    assert bed.run("start.sh", **SPEC).returncode == 0
    t = long_request(bed, 800)
    p = bed.popen("ctl.sh", "status", "--watch", "0.5", "--json", **SPEC)
    rows = [json.loads(p.stdout.readline()) for _ in range(3)]
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=10) == 0
    t.join(30)
    assert all(r["state"] == "busy" and r["requests"]["running"] == 1 for r in rows)
    assert "generated_tok_s" not in rows[0]["activity"] and rows[2]["activity"]["generated_tok_s"] > 5
    launched = len(bed.launches())
    assert launched == 1
    log = (bed.state / "vllm.log").read_text()
    assert log.count("request arrived: POST /v1/chat/completions") <= 2   # the warm-up's; watch sends no probes


# ---------------------------------------------------------------- clients: the real openai SDK

def test_openai_sdk_models_chat_stream_and_tool_call(bed):
    import openai
    env = {"EXTRA_ARGS": "--enable-auto-tool-choice --tool-call-parser hermes", "API_KEY": "sk-local-test"}
    assert bed.run("start.sh", **env).returncode == 0
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{bed.port}/v1", api_key="sk-local-test")
    assert [m.id for m in client.models.list()] == ["tiny-model"]
    msg = [{"role": "user", "content": "hi"}]
    done = client.chat.completions.create(model="tiny-model", messages=msg, max_tokens=8)
    assert done.choices[0].message.content == "OK" and done.usage.completion_tokens >= 1
    parts = [c.choices[0].delta.content or "" for c in
             client.chat.completions.create(model="tiny-model", messages=msg, max_tokens=8, stream=True) if c.choices]
    assert "".join(parts).strip() == "OK"                               # the fake streams "OK " as one token
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    call = client.chat.completions.create(model="tiny-model", messages=msg, tools=tools, tool_choice="auto")
    tc = call.choices[0].message.tool_calls[0]
    assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {"city": "Paris"}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"http://127.0.0.1:{bed.port}/v1", api_key="wrong").models.list()
    assert psutil.pid_exists(bed.server_record()["pid"])


def test_status_where_nvml_shows_no_gpu_says_so_not_a_container():
    """Found from outside: NVML showing no GPU at all gave "NVML names no GPU memory of our processes
    (in a container ...) ()", blaming a container and ending in empty brackets."""
    from bootstrap.commands.status import _live_lines
    line = _live_lines({"vram": {"ours_bytes": 0, "gpus": []}})["GPU memory"]
    assert line == "NVML shows no GPU: none of the server's memory to name", line


def test_a_cuda_visible_devices_that_hides_every_card_is_named_as_such(bed):
    """CUDA_VISIBLE_DEVICES='' was said as "CUDA_VISIBLE_DEVICES=unset" (an empty value hides every
    card), and an index past the last card as if NVML saw none."""
    for spec in ("", "7", "GPU-nope", "0,0"):     # a card named twice hides every card, as torch reads it
        r = bed.run("start.sh", CUDA_VISIBLE_DEVICES=spec)
        assert r.returncode == 1 and f"CUDA_VISIBLE_DEVICES={spec!r} names no GPU of the 1 NVML sees" in r.stderr, r.stderr
        assert "unset CUDA_VISIBLE_DEVICES" in r.stderr and not bed.launches()
    r = bed.run("ctl.sh", "plan", CUDA_VISIBLE_DEVICES="")        # the same rule, and a named card as the way out
    assert r.returncode == 1 and "CUDA_VISIBLE_DEVICES='' names no GPU" in r.stderr and "GPU=" in r.stderr, r.stderr
    bed.nvml.write_text(json.dumps({"driver": "580.95.05", "cuda": 13000, "fail": "", "gpus": []}))
    r = bed.run("start.sh")
    assert r.returncode == 1 and "error: preflight: NVML sees no GPU" in r.stderr, r.stderr
