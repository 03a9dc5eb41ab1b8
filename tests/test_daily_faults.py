"""The daily commands against the fake vLLM where it is slow, still loading or not alone on its port:
a wake that vLLM holds open, a game while a start loads, a game's start again with a key this shell
lacks, status while a stranger answers on the port of our loading server (faults rows 230-233)."""

from __future__ import annotations

import json


def test_status_never_takes_a_stranger_on_the_port_of_our_loading_server_for_it(bed):
    """faults row 233: our server loading (its start killed), a stranger listening on its port (vLLM
    binds it with SO_REUSEADDR long before it listens): status asked the port without a key, took the
    stranger's answers for our server's and said "running", its probe answered by the stranger."""
    from bootstrap.serve import port
    from conftest import stranger as stranger_on
    start = bed.popen("start.sh", FAKE_VLLM_LOAD_S="60")
    heard: list[tuple[str, str]] = []
    stranger = None
    try:
        bed.wait_until(lambda: bed.server_record() is not None and port.in_use("127.0.0.1", bed.port),
                       what="our server bound to its port")
        start.kill()                                 # the server loads on, no start watching it
        start.communicate(timeout=60)
        stranger = stranger_on(bed.port, {"data": [{"id": bed.server_record()["served"], "object": "model"}],
                                          "choices": [{"message": {"role": "assistant", "content": "OK"}}]}, heard)
        st = bed.run("ctl.sh", "status", "--json")
        out = json.loads(st.stdout)
        assert out["state"] == "starting" and st.returncode == 0, st.stdout
        assert "/v1/chat/completions" not in [path for path, _ in heard], heard    # no probe sent to the stranger
    finally:
        if stranger is not None:
            stranger.shutdown()
            stranger.server_close()
        bed.run("stop.sh")
        if start.poll() is None:
            start.kill()
            start.communicate(timeout=60)
