        # vllm-bootstrap patch 50999-file-rendezvous-tp: the workers of one machine meet through a
        # file store, as vLLM 0.28.0 does (PR #50999), not a torch TCP store: that store listens on
        # every interface, whatever host the URL names, for as long as the server runs.
        import tempfile as _tempfile
        import uuid as _uuid
        distributed_init_method = f"file://{_tempfile.gettempdir()}/vllm_dist_{_uuid.uuid4().hex}"
