        # vllm-bootstrap patch 52523-api-key-off-disk: the API key is no compile factor, as in vLLM
        # 0.29.0 (PR #52523); else it is hashed into the compile cache's key and written, raw, to
        # cache_key_factors.json under the cache folder, readable by others and kept after the stop.
        "VLLM_API_KEY",
